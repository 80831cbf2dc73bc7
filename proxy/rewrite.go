package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// ChatRequest is a client's chat completion request on a thread turn, kept as raw JSON: the
// proxy touches `messages` and `tools` (and drops `tool_choice` and `parallel_tool_calls` when
// a round has no tools left); every other field reaches the upstream with its exact bytes. The
// client's messages and tools are never split into per-element values: they stay runs of the
// body's bytes, so a rewrite costs a small constant over the body's size whatever it holds.
type ChatRequest struct {
	fields rawjson.Object
	// msgs is the client's messages array; n its length; first, second and last the spans of
	// its first, second and last elements, beforeLast the end of the one before the last.
	msgs                json.RawMessage
	n                   int
	first, second, last span
	beforeLast          int
	// messages is the conversation sent upstream, as runs of raw elements (a run may hold
	// several of the client's messages, as they came): the client's messages with the
	// workspace injected, then each tool round's messages.
	messages []json.RawMessage
	// tools is the client's tools as a run of raw elements ("" for none).
	tools json.RawMessage
	// Stream is the client's "stream"; IncludeUsage its stream_options.include_usage.
	Stream       bool
	IncludeUsage bool
	// Legacy: the request uses the legacy functions/function_call fields; it is passed through
	// without a workspace.
	Legacy bool
}

// span is where an element lies in its array: msgs[start:end].
type span struct{ start, end int }

// ParseChatRequest parses and checks a thread turn's body (SPEC §3, §10).
func ParseChatRequest(body []byte) (*ChatRequest, error) {
	fields, err := rawjson.Parse(body) // checks the whole body as it goes
	if err != nil {
		if !rawjson.Valid(body) {
			return nil, badRequest("invalid_json", "", "the request body is not valid JSON")
		}
		return nil, badRequest("invalid_json", "", "the request body must be a JSON object")
	}
	c := &ChatRequest{fields: fields, msgs: fields.Get("messages")}
	if c.msgs == nil {
		return nil, badRequest("missing_required_parameter", "messages", "messages is required")
	}
	err = rawjson.Each(c.msgs, func(i, start, end int) error {
		if c.msgs[start] != '{' {
			return badRequest("invalid_type", fmt.Sprintf("messages[%d]", i), "messages[%d] must be an object", i)
		}
		switch i {
		case 0:
			c.first = span{start, end}
		case 1:
			c.second = span{start, end}
		}
		c.beforeLast, c.last, c.n = c.last.end, span{start, end}, i+1
		return nil
	})
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return nil, e
		}
		return nil, badRequest("invalid_type", "messages", "messages must be an array")
	}
	if c.n > 0 {
		c.messages = []json.RawMessage{c.msgs[c.first.start:c.last.end]}
	}
	if fields.Has("functions") || fields.Has("function_call") {
		c.Legacy = true
		return c, nil
	}
	if t := fields.Get("tools"); t != nil && string(t) != "null" {
		if c.tools, err = checkTools(t); err != nil {
			return nil, err
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

// checkTools checks the client's tools array: every tool an object, none named like a workspace
// tool. It returns the run of its elements (nil for none).
func checkTools(list json.RawMessage) (json.RawMessage, error) {
	return eachToolName(list, func(name []byte) error {
		if name != nil && tools.IsTool(string(name)) {
			return badRequest("reserved_tool_name", "tools",
				"the tool name %q is reserved by the workspace proxy; rename the client tool", name)
		}
		return nil
	})
}

// eachToolName walks a tools array, checked, and calls fn with the name of each tool's function
// or custom part (nil when it has none), without allocating for names without escapes. It
// returns the run of the array's elements (nil for none).
func eachToolName(list json.RawMessage, fn func(name []byte) error) (json.RawMessage, error) {
	var scratch struct{ tool, part rawjson.Object }
	first, last := -1, 0
	err := rawjson.Each(list, func(i, start, end int) error {
		elem := list[start:end]
		if elem[0] != '{' {
			return badRequest("invalid_type", fmt.Sprintf("tools[%d]", i), "tools[%d] must be an object", i)
		}
		if first < 0 {
			first = start
		}
		last = end
		var err error
		if scratch.tool, err = rawjson.ParseInto(scratch.tool, elem); err != nil {
			return err
		}
		var name []byte
		for _, part := range [...]string{"function", "custom"} {
			v := scratch.tool.Get(part)
			if len(v) == 0 || v[0] != '{' {
				continue
			}
			if scratch.part, err = rawjson.ParseInto(scratch.part, v); err != nil {
				return err
			}
			if name = rawName(scratch.part.Get("name")); name != nil {
				break
			}
		}
		return fn(name)
	})
	if err != nil {
		var e *Error
		if errors.As(err, &e) || errors.Is(err, errFound) {
			return nil, err
		}
		return nil, badRequest("invalid_type", "tools", "tools must be an array")
	}
	if first < 0 {
		return nil, nil
	}
	return list[first:last], nil
}

// rawName is the text of a raw JSON string: its bytes when it has no escapes, else decoded;
// nil for anything but a non-empty string.
func rawName(v json.RawMessage) []byte {
	if len(v) < 3 || v[0] != '"' {
		return nil
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1]
	}
	s, _ := rawjson.Unquote(v)
	return []byte(s)
}

// IsClientTool reports whether name is one of the client's tools. It reads the client's tools
// each time rather than keep a set of their names: a turn asks it for a few calls, and a set
// would cost memory in proportion to a hostile body.
func (c *ChatRequest) IsClientTool(name string) bool {
	if c.tools == nil {
		return false
	}
	_, err := eachToolName(c.fields.Get("tools"), func(n []byte) error {
		if n != nil && string(n) == name {
			return errFound
		}
		return nil
	})
	return errors.Is(err, errFound)
}

// errFound stops a walk that found what it looked for.
var errFound = errors.New("found")

// Placement is where the workspace goes in a request (SPEC §3.1).
type Placement string

// Placements.
const (
	// PlaceTail appends the workspace to the last message when it is a user or tool message, so
	// that every earlier message stays a cached prefix; else it places as PlaceSystem.
	PlaceTail Placement = "tail"
	// PlaceSystem appends the workspace to a leading system or developer message, or adds one.
	PlaceSystem Placement = "system"
)

// ParsePlacement reads a placement's name.
func ParsePlacement(s string) (Placement, error) {
	switch p := Placement(strings.ToLower(strings.TrimSpace(s))); p {
	case PlaceTail, PlaceSystem:
		return p, nil
	}
	return "", fmt.Errorf("%q is not a placement (tail or system)", s)
}

// InjectWorkspace puts text (the instructions and the block) where the placement says. With
// PlaceTail it goes into the last message when that is a user or tool message, after its own
// content (whose workspace tags are neutralised so pasted text cannot pose as the block). With
// PlaceSystem, or a last message of another role, it is appended to the first message when it
// is a system or developer message (as text, or as one more text part when its content is an
// array of parts), else it comes as a new first system message.
func (c *ChatRequest) InjectWorkspace(text string, placement Placement) {
	if placement == PlaceTail && c.n > 0 {
		if last, err := rawjson.Parse(c.msgs[c.last.start:c.last.end]); err == nil {
			if role, _ := rawjson.Unquote(last.Get("role")); role == "user" || role == "tool" {
				c.messages = c.messages[:0]
				if c.n > 1 {
					c.messages = append(c.messages, c.msgs[c.first.start:c.beforeLast])
				}
				c.messages = append(c.messages, appendToContent(last, text, tools.NeutralizeTags))
				return
			}
		}
	}
	if c.n > 0 {
		if first, err := rawjson.Parse(c.msgs[c.first.start:c.first.end]); err == nil {
			role, _ := rawjson.Unquote(first.Get("role"))
			if role == "system" || role == "developer" {
				c.messages = []json.RawMessage{appendToContent(first, text, nil)}
				if c.n > 1 {
					c.messages = append(c.messages, c.msgs[c.second.start:c.last.end])
				}
				return
			}
		}
	}
	msg := rawjson.Object{}
	msg.Set("role", rawjson.String("system"))
	msg.Set("content", rawjson.String(text))
	c.messages = append([]json.RawMessage{msg.Bytes()}, c.messages...)
}

// appendToContent appends text to a message's content: to a string (after a blank line), as a
// last text part of an array, or as the content when it has none. neutralize, when set,
// rewrites the text the message already held (in a string, or in its text parts).
func appendToContent(msg rawjson.Object, text string, neutralize func(string) string) json.RawMessage {
	content := msg.Get("content")
	switch {
	case len(content) > 0 && content[0] == '"':
		s, _ := rawjson.Unquote(content)
		if neutralize != nil {
			s = neutralize(s)
		}
		if strings.TrimSpace(s) != "" {
			s += "\n\n"
		}
		msg.Set("content", rawjson.String(s+text))
	case len(content) > 0 && content[0] == '[':
		parts, _ := rawjson.Split(content)
		if neutralize != nil {
			for i, p := range parts {
				parts[i] = neutralizePart(p, neutralize)
			}
		}
		part := rawjson.Object{}
		part.Set("type", rawjson.String("text"))
		part.Set("text", rawjson.String(text))
		msg.Set("content", rawjson.AppendArray(nil, append(parts, part.Bytes())))
	default: // null or missing
		msg.Set("content", rawjson.String(text))
	}
	return msg.Bytes()
}

// neutralizePart rewrites the text of a text part with neutralize; any other part, or a text
// that needs no change, keeps its bytes.
func neutralizePart(part json.RawMessage, neutralize func(string) string) json.RawMessage {
	o, err := rawjson.Parse(part)
	if err != nil {
		return part
	}
	text, ok := rawjson.Unquote(o.Get("text"))
	if !ok {
		return part
	}
	if n := neutralize(text); n != text {
		o.Set("text", rawjson.String(n))
		return o.Bytes()
	}
	return part
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
	var toolList []json.RawMessage
	if len(c.tools) > 0 {
		toolList = append(toolList, c.tools)
	}
	if withWorkspaceTools {
		toolList = append(toolList, tools.Definitions...)
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
