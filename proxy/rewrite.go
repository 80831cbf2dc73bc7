package proxy

import (
	"encoding/json"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// ChatRequest is a client's chat completion request on a thread turn, kept as raw JSON: the
// proxy touches `messages` and `tools` (and drops `tool_choice` and `parallel_tool_calls` when
// a round has no tools left); every other field reaches the upstream with its exact bytes.
type ChatRequest struct {
	fields   rawjson.Object
	messages []json.RawMessage
	// clientTools are the client's own tools, as received; clientNames their names.
	clientTools []json.RawMessage
	clientNames map[string]bool
	// Stream is the client's "stream"; IncludeUsage its stream_options.include_usage.
	Stream       bool
	IncludeUsage bool
	// Legacy: the request uses the legacy functions/function_call fields; it is passed through
	// without a workspace.
	Legacy bool
}

// ParseChatRequest parses and checks a thread turn's body (SPEC §3, §10).
func ParseChatRequest(body []byte) (*ChatRequest, error) {
	fields, err := rawjson.Parse(body) // checks the whole body as it goes
	if err != nil {
		if !rawjson.Valid(body) {
			return nil, badRequest("invalid_json", "", "the request body is not valid JSON")
		}
		return nil, badRequest("invalid_json", "", "the request body must be a JSON object")
	}
	c := &ChatRequest{fields: fields}
	msgs := fields.Get("messages")
	if msgs == nil {
		return nil, badRequest("missing_required_parameter", "messages", "messages is required")
	}
	if c.messages, err = rawjson.Split(msgs); err != nil {
		return nil, badRequest("invalid_type", "messages", "messages must be an array")
	}
	if fields.Has("functions") || fields.Has("function_call") {
		c.Legacy = true
		return c, nil
	}
	if t := fields.Get("tools"); t != nil && string(t) != "null" {
		if c.clientTools, err = rawjson.Split(t); err != nil {
			return nil, badRequest("invalid_type", "tools", "tools must be an array")
		}
	}
	c.clientNames = make(map[string]bool, len(c.clientTools))
	for _, t := range c.clientTools {
		for _, name := range []string{toolName(t, "function"), toolName(t, "custom")} {
			if tools.IsTool(name) {
				return nil, badRequest("reserved_tool_name", "tools",
					"the tool name %q is reserved by the workspace proxy; rename the client tool", name)
			}
			if name != "" {
				c.clientNames[name] = true
			}
		}
	}
	if n := fields.Get("n"); n != nil && string(n) != "null" {
		var v float64
		if json.Unmarshal(n, &v) != nil || v > 1 {
			return nil, badRequest("unsupported_parameter", "n", "n greater than 1 is not supported on a thread turn")
		}
	}
	if s := fields.Get("stream"); s != nil {
		_ = json.Unmarshal(s, &c.Stream)
	}
	if so := fields.Get("stream_options"); c.Stream && so != nil {
		var opts struct {
			IncludeUsage bool `json:"include_usage"`
		}
		_ = json.Unmarshal(so, &opts)
		c.IncludeUsage = opts.IncludeUsage
	}
	return c, nil
}

// toolName is the name of a tool definition's function (or custom) part; "" when there is
// none (a tool the proxy cannot read is the upstream's to refuse).
func toolName(def json.RawMessage, part string) string {
	o, err := rawjson.Parse(def)
	if err != nil {
		return ""
	}
	p, err := rawjson.Parse(o.Get(part))
	if err != nil {
		return ""
	}
	name, _ := rawjson.Unquote(p.Get("name"))
	return name
}

// IsClientTool reports whether name is one of the client's tools.
func (c *ChatRequest) IsClientTool(name string) bool { return c.clientNames[name] }

// InjectWorkspace puts text (the instructions and the block) into the system prompt: appended to
// the first message when it is a system or developer message (as text, or as one more text part
// when its content is an array of parts), else as a new first system message.
func (c *ChatRequest) InjectWorkspace(text string) {
	if len(c.messages) > 0 {
		if first, err := rawjson.Parse(c.messages[0]); err == nil {
			role, _ := rawjson.Unquote(first.Get("role"))
			if role == "system" || role == "developer" {
				c.messages[0] = appendToContent(first, text)
				return
			}
		}
	}
	msg := rawjson.Object{}
	msg.Set("role", rawjson.String("system"))
	msg.Set("content", rawjson.String(text))
	c.messages = append([]json.RawMessage{msg.Bytes()}, c.messages...)
}

func appendToContent(msg rawjson.Object, text string) json.RawMessage {
	content := msg.Get("content")
	switch {
	case len(content) > 0 && content[0] == '"':
		s, _ := rawjson.Unquote(content)
		if strings.TrimSpace(s) != "" {
			s += "\n\n"
		}
		msg.Set("content", rawjson.String(s+text))
	case len(content) > 0 && content[0] == '[':
		parts, _ := rawjson.Split(content)
		part := rawjson.Object{}
		part.Set("type", rawjson.String("text"))
		part.Set("text", rawjson.String(text))
		msg.Set("content", rawjson.AppendArray(nil, append(parts, part.Bytes())))
	default: // null or missing
		msg.Set("content", rawjson.String(text))
	}
	return msg.Bytes()
}

// appendRound adds a tool round to the conversation: the assistant message of the reply
// (content, reasoning_content when the upstream sent one, and the workspace's calls) and one
// tool message per call with its result.
func (c *ChatRequest) appendRound(content, reasoning json.RawMessage, calls []toolCall, results []string) {
	msg := rawjson.Object{}
	msg.Set("role", rawjson.String("assistant"))
	if len(content) == 0 {
		content = json.RawMessage("null")
	}
	msg.Set("content", content)
	items := make([]json.RawMessage, len(calls))
	for i, call := range calls {
		fn := rawjson.Object{}
		fn.Set("name", rawjson.String(call.Name))
		fn.Set("arguments", rawjson.String(call.Arguments))
		tc := rawjson.Object{}
		tc.Set("id", rawjson.String(call.ID))
		tc.Set("type", rawjson.String("function"))
		tc.Set("function", fn.Bytes())
		items[i] = tc.Bytes()
	}
	msg.Set("tool_calls", rawjson.AppendArray(nil, items))
	if len(reasoning) > 0 {
		// Servers that return reasoning_content (DeepSeek, vLLM) expect it back within a turn.
		msg.Set("reasoning_content", reasoning)
	}
	c.messages = append(c.messages, msg.Bytes())
	for i, call := range calls {
		tm := rawjson.Object{}
		tm.Set("role", rawjson.String("tool"))
		tm.Set("tool_call_id", rawjson.String(call.ID))
		tm.Set("content", rawjson.String(results[i]))
		c.messages = append(c.messages, tm.Bytes())
	}
}

// Body encodes the request for one upstream round: the conversation so far and the client's
// tools, followed by the proxy's when withWorkspaceTools. Members keep their order; without any
// tool left, tools, tool_choice and parallel_tool_calls are dropped (an upstream refuses the
// last two without tools).
func (c *ChatRequest) Body(withWorkspaceTools bool) []byte {
	toolList := c.clientTools
	if withWorkspaceTools {
		toolList = append(toolList[:len(toolList):len(toolList)], tools.Definitions...)
	}
	size := c.fields.Size() + 64 - len(c.fields.Get("messages")) - len(c.fields.Get("tools"))
	for _, m := range c.messages {
		size += len(m) + 1
	}
	for _, t := range toolList {
		size += len(t) + 1
	}
	buf := make([]byte, 0, size)
	buf = append(buf, '{')
	member := func(key string) {
		if len(buf) > 1 {
			buf = append(buf, ',')
		}
		buf = rawjson.AppendString(buf, key)
		buf = append(buf, ':')
	}
	hasTools := false
	for i, k := range c.fields.Keys {
		switch k {
		case "messages":
			member(k)
			buf = rawjson.AppendArray(buf, c.messages)
		case "tools":
			hasTools = true
			if len(toolList) > 0 {
				member(k)
				buf = rawjson.AppendArray(buf, toolList)
			}
		case "tool_choice", "parallel_tool_calls":
			if len(toolList) > 0 {
				member(k)
				buf = append(buf, c.fields.Vals[i]...)
			}
		default:
			member(k)
			buf = append(buf, c.fields.Vals[i]...)
		}
	}
	if !hasTools && len(toolList) > 0 {
		member("tools")
		buf = rawjson.AppendArray(buf, toolList)
	}
	return append(buf, '}')
}
