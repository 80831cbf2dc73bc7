package turn

import (
	"encoding/json"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// ResponsesRequest is a client's Responses API request on a thread turn (docs/spec.md §12), kept
// as raw JSON like ChatRequest: the proxy touches `input`, `tools` (and drops `tool_choice` and
// `parallel_tool_calls` when a round has no tools left), `instructions` (placement system),
// `previous_response_id` (continuing a recorded turn, and chaining stored rounds) and `include`
// (reasoning sent back without a store); every other field reaches the upstream with its exact
// bytes.
type ResponsesRequest struct {
	topLevel
	// items is the client's input array (nil for none), and where its elements lie.
	items json.RawMessage
	elements
	// input is what the next round sends as `input` after owed, as runs of raw elements: the
	// client's items with the workspace injected, then what each tool round added; or, once a
	// stored round is chained, only the items after it. owed is the run of the outputs a
	// continued turn owes its last response, sent before the client's items.
	input []Payload
	owed  json.RawMessage
	clientTools
	// previous is the previous_response_id the next round sends (nil: the client's);
	// instructions and include replace the client's when set.
	previous, instructions, include json.RawMessage
	// ClientPrevious is the previous_response_id the client sent ("" for none); Continued is
	// set when the proxy sent another in its place (a recorded turn's last response).
	ClientPrevious string
	Continued      bool
	// continuedUserText is the user's words the continued turn was given (docs/spec.md §19).
	continuedUserText string
	// Record, when set, records durably which upstream response (last) ended the turn whose
	// client got the id first, and the workspace calls of last whose outputs the upstream was not
	// sent (owed), and whether the upstream stored it (a continuation needs the user's words the
	// turn was given only then); the turn fails when it cannot, since a later continuation would
	// lose its context.
	Record func(first, last string, owed []string, stored bool) error
}

// ParseResponsesRequest parses and checks a Responses thread turn's body (docs/spec.md §12, §10).
func ParseResponsesRequest(body []byte) (*ResponsesRequest, error) {
	tl, err := parseTop(body)
	if err != nil {
		return nil, err
	}
	top := tl.fields
	tl.kind = kindOfResponses(top)
	c := &ResponsesRequest{topLevel: tl}
	if string(top.Get("background")) == "true" {
		return nil, apierr.BadRequest("unsupported_parameter", "background", "background responses are not supported on a thread turn")
	}
	if v := top.Get("conversation"); v != nil && string(v) != "null" {
		return nil, apierr.BadRequest("unsupported_parameter", "conversation",
			"conversation is not supported on a thread turn; the thread keeps the workspace, previous_response_id continues a response")
	}
	switch in := top.Get("input"); {
	case in == nil || string(in) == "null":
	case in[0] == '"': // one user message
		msg := rawjson.Object{}
		msg.Set("role", rawjson.String("user"))
		msg.Set("content", in)
		c.items = rawjson.AppendArray(nil, []json.RawMessage{msg.Bytes()})
	case in[0] == '[':
		c.items = in
	default:
		return nil, apierr.BadRequest("invalid_type", "input", "input must be a string or an array of items")
	}
	if c.items != nil {
		if c.elements, err = objects(c.items, "input", "input must be a string or an array of items"); err != nil {
			return nil, err
		}
	}
	if c.n > 0 {
		c.input = []Payload{{c.items[c.first.start:c.last.end]}}
	}
	if t := top.Get("tools"); t != nil && string(t) != "null" {
		if err := c.check(t); err != nil {
			return nil, err
		}
	}
	if p := top.Get("previous_response_id"); p != nil && string(p) != "null" {
		var ok bool
		if c.ClientPrevious, ok = rawjson.Unquote(p); !ok {
			return nil, apierr.BadRequest("invalid_type", "previous_response_id", "previous_response_id must be a string")
		}
	}
	return c, nil
}

// Prepare puts the workspace text where placement says, has an unstored reasoning turn get its
// reasoning back encrypted, and sets the prompt_cache_key the client did not ("" for none).
func (c *ResponsesRequest) Prepare(text string, placement Placement, cacheKey string) {
	c.InjectWorkspace(text, placement)
	c.askReasoning()
	if cacheKey != "" {
		c.setDefault("prompt_cache_key", rawjson.String(cacheKey))
	}
}

// JSON is the dialect of a non-streamed Responses turn.
func (c *ResponsesRequest) JSON(t *Turn) JSONDialect {
	return &responsesJSON{responsesTurn: responsesTurn{req: c, up: t.Upstream}}
}

// Stream is the dialect of a streamed Responses turn.
func (c *ResponsesRequest) Stream(t *Turn, out Emitter) StreamDialect {
	return newResponsesSSE(c, t.Upstream, out)
}

// showClientPrevious shows the client its own previous_response_id (null for none) in a response
// object that has the member, not the one the proxy sent in its place.
func (c *ResponsesRequest) showClientPrevious(resp *rawjson.Object) {
	if resp.Index("previous_response_id") < 0 {
		return
	}
	prev := json.RawMessage("null")
	if c.ClientPrevious != "" {
		prev = rawjson.String(c.ClientPrevious)
	}
	resp.Set("previous_response_id", prev)
}

// Stored reports whether the client asked the upstream to store the response (the API's
// default).
func (c *ResponsesRequest) Stored() bool { return string(c.fields.Get("store")) != "false" }

// askReasoning has an unstored turn of a reasoning model get its reasoning back encrypted
// (include reasoning.encrypted_content), so that its rounds can send it back: without a store,
// the upstream cannot find a reasoning item by its id. The client's include is kept otherwise.
func (c *ResponsesRequest) askReasoning() {
	if c.Stored() {
		return
	}
	if r := c.fields.Get("reasoning"); r == nil || string(r) == "null" {
		return
	}
	const enc = `"reasoning.encrypted_content"`
	var list []json.RawMessage
	if inc := c.fields.Get("include"); inc != nil && string(inc) != "null" {
		var err error
		if list, err = rawjson.Split(inc); err != nil {
			return // the upstream's to refuse as it was
		}
		for _, v := range list {
			if s, _ := rawjson.Unquote(v); s == "reasoning.encrypted_content" {
				return
			}
		}
	}
	c.include = rawjson.AppendArray(nil, append(list, json.RawMessage(enc)))
}

// Continue has the turn continue, upstream, from the recorded turn's last response instead of
// the one the client named, sending first the outputs that response still owes.
func (c *ResponsesRequest) Continue(cont workspace.Continuation) {
	c.previous = rawjson.String(cont.LastResponseID)
	c.Continued, c.continuedUserText = true, cont.UserText
	if len(cont.Owed) == 0 {
		return
	}
	items := make([]json.RawMessage, len(cont.Owed))
	for i, o := range cont.Owed {
		items[i] = functionCallOutput(o.CallID, o.Output)
	}
	c.owed = elementRun(items)
}

func functionCallOutput(callID, output string) json.RawMessage {
	o := rawjson.Object{}
	o.Set("type", rawjson.String("function_call_output"))
	o.Set("call_id", rawjson.String(callID))
	o.Set("output", rawjson.String(output))
	return o.Bytes()
}

// InjectWorkspace puts text (the instructions and the block) where the placement says
// (docs/spec.md §3.1, §12). With PlaceTail it goes into the last input item when that is a user
// message or a function_call_output, after its own content; otherwise, and with PlaceSystem, it
// is appended to `instructions` (set when absent).
func (c *ResponsesRequest) InjectWorkspace(text string, placement Placement) {
	if placement == PlaceTail && c.n > 0 {
		last := c.items[c.last.start:c.last.end]
		o, err := rawjson.Parse(last)
		if err == nil {
			typ, _ := rawjson.Unquote(o.Get("type"))
			role, _ := rawjson.Unquote(o.Get("role"))
			member := ""
			switch {
			case typ == "function_call_output":
				member = "output"
			case role == "user" && (typ == "" || typ == "message"):
				member = "content"
			}
			if member != "" {
				c.input = c.input[:0]
				if c.n > 1 {
					c.input = append(c.input, Payload{c.items[c.first.start:c.beforeLast]})
				}
				c.input = append(c.input, appendToLast(last, member, "input_text", text))
				return
			}
		}
	}
	// The block goes before the input: the client's latest turn must not pose as it.
	if c.n > 0 {
		c.input = neutralizedTurn(c.items, c.first.start, c.last.end, isResponsesTurn)
	}
	instructions := c.fields.Get("instructions")
	switch {
	case instructions == nil || string(instructions) == "null":
		c.instructions = rawjson.String(text)
	case instructions[0] == '"':
		c.instructions = appendToString(instructions, text)
	default: // not a string: the upstream's to refuse; the workspace comes as a system item
		msg := rawjson.Object{}
		msg.Set("role", rawjson.String("system"))
		msg.Set("content", rawjson.String(text))
		c.input = append([]Payload{{msg.Bytes()}}, c.input...)
	}
}

// isResponsesTurn reports an input item of the client's turn: a user message, or a
// function_call_output.
func isResponsesTurn(item []byte) bool {
	o, err := rawjson.Parse(item)
	if err != nil {
		return false
	}
	typ, _ := rawjson.Unquote(o.Get("type"))
	role, _ := rawjson.Unquote(o.Get("role"))
	return typ == "function_call_output" || (role == "user" && (typ == "" || typ == "message"))
}

// extend adds a tool round: when the round's response was stored, the next round continues it
// (previous_response_id) with the outputs of its calls alone; otherwise it sends everything
// again, with the round's output items and the outputs after it.
func (c *ResponsesRequest) extend(rr *responseRound, calls []toolCall, results []tools.Result) {
	outputs := make([]json.RawMessage, len(calls))
	for i, call := range calls {
		outputs[i] = functionCallOutput(call.ID, results[i].Content)
	}
	if rr.stored && rr.id != "" {
		c.previous = rawjson.String(rr.id)
		c.input, c.owed = nil, nil // the upstream has them
	} else if len(rr.items) > 0 {
		c.input = append(c.input, Payload{elementRun(rr.items)})
	}
	c.input = append(c.input, Payload{elementRun(outputs)})
}

// Body encodes the request for one upstream round: the input so far and the client's tools,
// followed by the proxy's when withWorkspaceTools, with the previous_response_id, instructions
// and include the round sends (see roundBody).
func (c *ResponsesRequest) Body(withWorkspaceTools bool) Payload {
	return roundBody(c.fields, "input", c.inputRuns(), c.toolRuns(withWorkspaceTools, responsesWorkspaceTools),
		replacement{"instructions", c.instructions}, replacement{"previous_response_id", c.previous}, replacement{"include", c.include})
}

// inputRuns are the runs of the next round's input: what is owed, then input.
func (c *ResponsesRequest) inputRuns() []Payload {
	if c.owed == nil {
		return c.input
	}
	return append([]Payload{{c.owed}}, c.input...)
}
