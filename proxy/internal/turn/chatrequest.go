package turn

import (
	"encoding/json"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// ChatRequest is a client's chat completion request on a thread turn, kept as raw JSON: the
// proxy touches `messages` and `tools` (and drops `tool_choice` and `parallel_tool_calls` when
// a round has no tools left); every other field reaches the upstream with its exact bytes. The
// client's messages and tools are never split into per-element values: they stay runs of the
// body's bytes, so a rewrite costs a small constant over the body's size whatever it holds.
type ChatRequest struct {
	topLevel
	// msgs is the client's messages array, and where its elements lie.
	msgs json.RawMessage
	elements
	// messages is the conversation sent upstream, as runs of raw elements (a run may hold
	// several of the client's messages, as they came), each run in pieces: the client's
	// messages with the workspace injected, then each tool round's messages.
	messages []Payload
	clientTools
	// IncludeUsage is the client's stream_options.include_usage.
	IncludeUsage bool
	// Legacy: the request uses the legacy functions/function_call fields; it is passed through
	// without a workspace.
	Legacy bool
}

// ParseChatRequest parses and checks a thread turn's body (docs/spec.md §3, §10).
func ParseChatRequest(body []byte) (*ChatRequest, error) {
	tl, err := parseTop(body)
	if err != nil {
		return nil, err
	}
	top := tl.fields
	c := &ChatRequest{topLevel: tl, msgs: top.Get("messages")}
	if c.msgs == nil {
		return nil, apierr.BadRequest("missing_required_parameter", "messages", "messages is required")
	}
	if c.elements, err = objects(c.msgs, "messages", "messages must be an array"); err != nil {
		return nil, err
	}
	if c.n > 0 {
		c.messages = []Payload{{c.msgs[c.first.start:c.last.end]}}
	}
	if top.Has("functions") || top.Has("function_call") {
		c.Legacy = true
		return c, nil
	}
	if t := top.Get("tools"); t != nil && string(t) != "null" {
		if err := c.check(t); err != nil {
			return nil, err
		}
	}
	if n := top.Get("n"); n != nil && string(n) != "null" {
		var v float64
		if json.Unmarshal(n, &v) != nil || v > 1 {
			return nil, apierr.BadRequest("unsupported_parameter", "n", "n greater than 1 is not supported on a thread turn")
		}
	}
	if so := top.Get("stream_options"); c.streamed && so != nil {
		var opts struct {
			IncludeUsage bool `json:"include_usage"`
		}
		_ = json.Unmarshal(so, &opts)
		c.IncludeUsage = opts.IncludeUsage
	}
	return c, nil
}

// Prepare puts the workspace text where placement says, asks a streamed turn's upstream for its
// usage, and sets the prompt_cache_key the client did not ("" for none).
func (c *ChatRequest) Prepare(text string, placement Placement, cacheKey string) {
	c.InjectWorkspace(text, placement)
	c.askUsage()
	if cacheKey != "" {
		c.setDefault("prompt_cache_key", rawjson.String(cacheKey))
	}
}

// JSON is the dialect of a non-streamed chat turn.
func (c *ChatRequest) JSON(t *Turn) JSONDialect {
	return &chatJSON{req: c, up: t.Upstream, log: t.Log, thread: t.Workspace.ThreadID().String()}
}

// Stream is the dialect of a streamed chat turn.
func (c *ChatRequest) Stream(t *Turn, out Emitter) StreamDialect {
	return newChatSSE(c, t.Upstream, t.Log, t.Workspace.ThreadID().String(), t.Workspace.Limits().ArgumentBytesMax, out)
}

// askUsage has a streamed turn's upstream send its usage (stream_options.include_usage), which
// the proxy counts; the client gets the usage chunk only when it asked for it (IncludeUsage).
// Other members of stream_options keep their values.
func (c *ChatRequest) askUsage() {
	if !c.streamed || c.IncludeUsage {
		return
	}
	opts, err := rawjson.Parse(c.fields.Get("stream_options"))
	if err != nil { // absent, null, or not an object: the upstream's to refuse as it was
		if v := c.fields.Get("stream_options"); v != nil && string(v) != "null" {
			return
		}
		opts = rawjson.Object{}
	}
	opts.Set("include_usage", json.RawMessage("true"))
	c.fields.Set("stream_options", opts.Bytes())
}

// appendRound adds a tool round to the conversation: the assistant message of the reply
// (content, the reasoning members the upstream sent, and the workspace's calls) and one tool
// message per call with its result.
func (c *ChatRequest) appendRound(content json.RawMessage, reasoning rawjson.Object, calls []toolCall, results []tools.Result) {
	msg := rawjson.Object{}
	msg.Set("role", rawjson.String("assistant"))
	if len(content) == 0 {
		content = json.RawMessage("null")
	}
	msg.Set("content", content)
	items := make([]json.RawMessage, len(calls))
	for i, call := range calls {
		items[i] = chatCallJSON(call)
	}
	msg.Set("tool_calls", rawjson.AppendArray(nil, items))
	for i, k := range reasoning.Keys {
		// Servers that return reasoning (DeepSeek, vLLM, SGLang) expect it back within a turn.
		msg.Set(k, reasoning.Vals[i])
	}
	c.messages = append(c.messages, Payload{msg.Bytes()})
	for i, call := range calls {
		tm := rawjson.Object{}
		tm.Set("role", rawjson.String("tool"))
		tm.Set("tool_call_id", rawjson.String(call.ID))
		tm.Set("content", rawjson.String(results[i].Content))
		c.messages = append(c.messages, Payload{tm.Bytes()})
	}
}

// Body encodes the request for one upstream round: the conversation so far and the client's
// tools, followed by the proxy's when withWorkspaceTools (see roundBody). Large values go out as
// pieces of the client's body: nothing of it is copied.
func (c *ChatRequest) Body(withWorkspaceTools bool) Payload {
	return roundBody(c.fields, "messages", c.messages, c.toolRuns(withWorkspaceTools, workspaceTools))
}

// isChatTurn reports a message of the client's turn: a user or tool message.
func isChatTurn(msg []byte) bool {
	start, end, ok := rawjson.Member(msg, "role")
	if !ok {
		return false
	}
	role, _ := rawjson.Unquote(msg[start:end])
	return role == "user" || role == "tool"
}

// InjectWorkspace puts text (the instructions and the block) where the placement says. With
// PlaceTail it goes into the last message when that is a user or tool message, after its own
// content (appendToLast). With PlaceSystem, or a last message of another role, it is appended to
// the first message when it is a system or developer message (as text, or as one more text part
// when its content is an array of parts), else it comes as a new first system message.
func (c *ChatRequest) InjectWorkspace(text string, placement Placement) {
	if placement == PlaceTail && c.n > 0 && isChatTurn(c.msgs[c.last.start:c.last.end]) {
		c.messages = c.messages[:0]
		if c.n > 1 {
			c.messages = append(c.messages, Payload{c.msgs[c.first.start:c.beforeLast]})
		}
		c.messages = append(c.messages, appendToLast(c.msgs[c.last.start:c.last.end], "content", "text", text))
		return
	}
	// The block goes first: the client's latest turn, which follows it, must not pose as it.
	if c.n > 0 {
		if first, err := rawjson.Parse(c.msgs[c.first.start:c.first.end]); err == nil {
			role, _ := rawjson.Unquote(first.Get("role"))
			if role == "system" || role == "developer" {
				c.messages = []Payload{{appendToSystem(first, text)}}
				if c.n > 1 {
					c.messages = append(c.messages, neutralizedTurn(c.msgs, c.second.start, c.last.end, isChatTurn)...)
				}
				return
			}
		}
		c.messages = neutralizedTurn(c.msgs, c.first.start, c.last.end, isChatTurn)
	}
	msg := rawjson.Object{}
	msg.Set("role", rawjson.String("system"))
	msg.Set("content", rawjson.String(text))
	c.messages = append([]Payload{{msg.Bytes()}}, c.messages...)
}
