package turn

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// MessagesRequest is a client's Anthropic Messages API request on a thread turn (docs/spec.md
// §14), kept as raw JSON like ChatRequest: the proxy touches `messages`, `tools` (and drops
// `tool_choice` when a round has no tools left) and, with placement system, `system`; every
// other member (`thinking`, `metadata`, `context_management`, `output_config`, `cache_control`
// wherever it stands, members the proxy does not know) reaches the upstream with its exact
// bytes.
type MessagesRequest struct {
	topLevel
	// msgs is the client's messages array, and where its elements lie.
	msgs json.RawMessage
	elements
	// messages is the conversation sent upstream, as runs of raw elements: the client's
	// messages with the workspace injected, then each tool round's two messages.
	messages []Payload
	clientTools
	// system is the system the rounds send in place of the client's (nil: the client's).
	system json.RawMessage
}

// ParseMessagesRequest parses and checks a Messages thread turn's body (docs/spec.md §14, §10).
// The checks are the proxy's own (a body it cannot rewrite, a reserved tool name); everything
// else is the upstream's to judge.
func ParseMessagesRequest(body []byte) (*MessagesRequest, error) {
	tl, err := parseTop(body)
	if err != nil {
		return nil, err
	}
	top := tl.fields
	tl.kind = kindOfMessages(top)
	c := &MessagesRequest{topLevel: tl, msgs: top.Get("messages")}
	if c.msgs == nil || string(c.msgs) == "null" {
		return nil, apierr.BadRequest("missing_required_parameter", "messages", "messages: field required")
	}
	if c.elements, err = objects(c.msgs, "messages", "messages must be an array"); err != nil {
		return nil, err
	}
	if c.n > 0 {
		c.messages = []Payload{{c.msgs[c.first.start:c.last.end]}}
	}
	if t := top.Get("tools"); t != nil && string(t) != "null" {
		if err := c.check(t); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Prepare puts the workspace text where placement says. The Messages API has no
// prompt_cache_key (its caching follows the client's cache_control breakpoints), and sends its
// usage in every stream: nothing else is added.
func (c *MessagesRequest) Prepare(text string, placement Placement, _ string) {
	c.InjectWorkspace(text, placement)
}

// JSON is the dialect of a non-streamed Messages turn.
func (c *MessagesRequest) JSON(t *Turn) JSONDialect {
	return &messagesJSON{req: c, up: t.Upstream}
}

// Stream is the dialect of a streamed Messages turn.
func (c *MessagesRequest) Stream(t *Turn, out Emitter) StreamDialect {
	return newMessagesSSE(c, t.Upstream, t.Workspace.Limits().ArgumentBytesMax, out)
}

// InjectWorkspace puts text (the instructions and the block) where the placement says
// (docs/spec.md §14). With PlaceTail it becomes a new last text block of the last message when
// that is a user message, or the system message of the conversation Claude Code ends its
// requests with: after every block the client sent, and without cache_control, so that each
// breakpoint the client set covers the bytes it covered before. Otherwise, and with PlaceSystem,
// it becomes a new last text block of `system`.
func (c *MessagesRequest) InjectWorkspace(text string, placement Placement) {
	if placement == PlaceTail && c.n > 0 {
		last := c.msgs[c.last.start:c.last.end]
		if start, end, ok := rawjson.Member(last, "role"); ok {
			if role, _ := rawjson.Unquote(last[start:end]); role == "user" || role == "system" {
				c.messages = c.messages[:0]
				if c.n > 1 {
					c.messages = append(c.messages, Payload{c.msgs[c.first.start:c.beforeLast]})
				}
				c.messages = append(c.messages, appendBlock(last, text))
				return
			}
		}
	}
	// The block goes into the system prompt: the client's latest turn must not pose as it.
	if c.n > 0 {
		c.messages = neutralizedTurn(c.msgs, c.first.start, c.last.end, isMessagesTurn)
	}
	block := textPart(text)
	switch system := c.fields.Get("system"); {
	case isNull(system):
		c.system = rawjson.AppendArray(nil, []json.RawMessage{block})
	case system[0] == '"':
		var blocks []json.RawMessage
		if !blankString(system) {
			blocks = append(blocks, rawTextPart(system))
		}
		c.system = rawjson.AppendArray(nil, append(blocks, block))
	case system[0] == '[':
		blocks, err := rawjson.Split(system)
		if err != nil {
			return // the upstream's to refuse as it was
		}
		c.system = rawjson.AppendArray(nil, append(blocks, block))
	}
}

// isMessagesTurn reports a message of the client's turn: a user message.
func isMessagesTurn(msg []byte) bool {
	start, end, ok := rawjson.Member(msg, "role")
	if !ok {
		return false
	}
	role, _ := rawjson.Unquote(msg[start:end])
	return role == "user"
}

// appendBlock appends a text block of text to the content of msg (placement tail): after the
// blocks of an array, after a string's text block (a string content is its one text block), or
// as the content when it has none. The message keeps its own bytes but for the workspace tags
// in its text, neutralised (pasted text cannot pose as the block); it goes out as pieces of
// the client's body around the new block.
func appendBlock(msg []byte, text string) Payload {
	block := textPart(text)
	start, end, ok := rawjson.Member(msg, "content")
	if !ok || (msg[start] != '"' && msg[start] != '[') { // missing or null: the block is the content
		o, _ := rawjson.Parse(msg)
		o.Set("content", rawjson.AppendArray(nil, []json.RawMessage{block}))
		return Payload{o.Bytes()}
	}
	content := json.RawMessage(msg[start:end])
	if content[0] == '"' {
		var blocks []json.RawMessage
		if !blankString(content) {
			blocks = append(blocks, rawTextPart(neutralized(content)))
		}
		return Payload{msg[:start], rawjson.AppendArray(nil, append(blocks, block)), msg[end:]}
	}
	content = neutralizedContent(content)
	open := content[:len(content)-1]
	var tail []byte
	if len(bytes.TrimSpace(open)) > 1 {
		tail = append(tail, ',')
	}
	tail = append(append(tail, block...), ']')
	return Payload{msg[:start], open, tail, msg[end:]}
}

// appendRound adds a tool round to the conversation: the assistant message of the reply, its
// content blocks as the upstream sent them (thinking and redacted_thinking with their
// signatures), and a user message of one tool_result block per workspace call.
func (c *MessagesRequest) appendRound(blocks []json.RawMessage, calls []toolCall, results []tools.Result) {
	msg := rawjson.Object{}
	msg.Set("role", rawjson.String("assistant"))
	msg.Set("content", rawjson.AppendArray(nil, blocks))
	c.messages = append(c.messages, Payload{msg.Bytes()})
	out := make([]json.RawMessage, len(calls))
	for i, call := range calls {
		out[i] = toolResult(call.ID, results[i])
	}
	user := rawjson.Object{}
	user.Set("role", rawjson.String("user"))
	user.Set("content", rawjson.AppendArray(nil, out))
	c.messages = append(c.messages, Payload{user.Bytes()})
}

// toolResult is the tool_result block of a workspace call's result: its envelope, is_error when
// the call failed.
func toolResult(id string, res tools.Result) json.RawMessage {
	o := rawjson.Object{}
	o.Set("type", rawjson.String("tool_result"))
	o.Set("tool_use_id", rawjson.String(id))
	o.Set("content", rawjson.String(res.Content))
	if !res.OK {
		o.Set("is_error", json.RawMessage("true"))
	}
	return o.Bytes()
}

// Body encodes the request for one upstream round: the conversation so far and the client's
// tools, followed by the proxy's when withWorkspaceTools, with the system the placement made
// (see roundBody). A round without the workspace tools of a client that sent none still defines
// the five, with tool_choice none: the Messages API refuses a request whose messages hold
// tool_use or tool_result blocks and that defines no tools.
func (c *MessagesRequest) Body(withWorkspaceTools bool) Payload {
	var choice json.RawMessage
	if !withWorkspaceTools && len(c.tools) == 0 {
		withWorkspaceTools, choice = true, json.RawMessage(`{"type":"none"}`)
	}
	return roundBody(c.fields, "messages", c.messages, c.toolRuns(withWorkspaceTools, messagesWorkspaceTools),
		replacement{"system", c.system}, replacement{"tool_choice", choice})
}

// CountBody is the body of a count_tokens request rewritten as the turn's first round would be
// (docs/spec.md §14): the workspace in place and the five tools after the client's.
func (c *MessagesRequest) CountBody(text string, placement Placement) Payload {
	c.InjectWorkspace(text, placement)
	return c.Body(true)
}

// messagesWorkspaceTools are the five tools in the Messages API's shape ({name, description,
// input_schema}), as one run of elements.
var messagesWorkspaceTools = func() Payload {
	list := make([]json.RawMessage, len(tools.All))
	for i, d := range tools.All {
		o := rawjson.Object{}
		o.Set("name", rawjson.String(d.Name))
		o.Set("description", rawjson.String(d.Description))
		o.Set("input_schema", d.Parameters)
		list[i] = o.Bytes()
	}
	return Payload{elementRun(list)}
}()

// messagesTokens reads the Messages API's usage: input_tokens, cache_read_input_tokens,
// cache_creation_input_tokens and output_tokens. Its input_tokens leave out the tokens read from
// and written to the cache: the prompt is the sum of the three, its cached part the tokens read,
// as chat's cached_tokens are part of its prompt_tokens.
func messagesTokens(raw json.RawMessage) usage {
	u := usage{raw: raw}
	o, err := rawjson.Parse(raw)
	if err != nil {
		return u
	}
	read, written := tokenCount(o, "cache_read_input_tokens"), tokenCount(o, "cache_creation_input_tokens")
	u.tokens = workspace.Usage{PromptTokens: workspace.AddTokens(workspace.AddTokens(tokenCount(o, "input_tokens"), read), written),
		CachedPromptTokens: read, CacheWriteTokens: written, CompletionTokens: tokenCount(o, "output_tokens")}
	return u
}

// MessagesError is the Messages API's error body for an Error of the proxy (docs/spec.md §14):
// {"type":"error","error":{"type","message"}}, its type by the status, what Anthropic's SDKs
// branch on.
func MessagesError(e *apierr.Error) []byte {
	var b struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	b.Type = "error"
	b.Error.Type = messagesErrorType(e.Status)
	b.Error.Message = e.Message
	out, _ := rawjson.Marshal(b)
	return out
}

// messagesErrorType is the Messages API's error type of a status.
func messagesErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return "overloaded_error"
	case status >= 500 || status == 0:
		return "api_error"
	}
	return "invalid_request_error"
}

// isMessagesError reports whether body is an error in the Messages API's shape.
func isMessagesError(body []byte) bool {
	var b struct {
		Type  string          `json:"type"`
		Error json.RawMessage `json:"error"`
	}
	return json.Unmarshal(body, &b) == nil && b.Type == "error" && len(b.Error) > 0 && b.Error[0] == '{'
}
