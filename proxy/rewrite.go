package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

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
	// Stream is the client's "stream"; IncludeUsage its stream_options.include_usage.
	Stream       bool
	IncludeUsage bool
	// Legacy: the request uses the legacy functions/function_call fields; it is passed through
	// without a workspace.
	Legacy bool
}

// span is where an element lies in its array: msgs[start:end].
type span struct{ start, end int }

// elements is where the elements of an array lie: n of them; first, second and last their spans,
// beforeLast the end of the one before the last.
type elements struct {
	n                   int
	first, second, last span
	beforeLast          int
}

// objects finds the elements of list, an array of objects named name in the request: 400 for
// an element that is not an object (naming it), or with notArray for a list that is not an array.
func objects(list json.RawMessage, name, notArray string) (elements, error) {
	var el elements
	err := rawjson.Each(list, func(i, start, end int) error {
		if list[start] != '{' {
			return apierr.BadRequest("invalid_type", fmt.Sprintf("%s[%d]", name, i), "%s[%d] must be an object", name, i)
		}
		switch i {
		case 0:
			el.first = span{start, end}
		case 1:
			el.second = span{start, end}
		}
		el.beforeLast, el.last, el.n = el.last.end, span{start, end}, i+1
		return nil
	})
	if err != nil {
		var e *apierr.Error
		if errors.As(err, &e) {
			return elements{}, e
		}
		return elements{}, apierr.BadRequest("invalid_type", name, "%s", notArray)
	}
	return el, nil
}

// ParseChatRequest parses and checks a thread turn's body (SPEC §3, §10).
func ParseChatRequest(body []byte) (*ChatRequest, error) {
	top, err := rawjson.Parse(body) // checks the whole body as it goes
	if err != nil {
		if !rawjson.Valid(body) {
			return nil, apierr.BadRequest("invalid_json", "", "the request body is not valid JSON")
		}
		return nil, apierr.BadRequest("invalid_json", "", "the request body must be a JSON object")
	}
	c := &ChatRequest{topLevel: topLevel{top}, msgs: top.Get("messages")}
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
	if s := top.Get("stream"); s != nil {
		_ = json.Unmarshal(s, &c.Stream)
	}
	if so := top.Get("stream_options"); c.Stream && so != nil {
		var opts struct {
			IncludeUsage bool `json:"include_usage"`
		}
		_ = json.Unmarshal(so, &opts)
		c.IncludeUsage = opts.IncludeUsage
	}
	return c, nil
}

// maxToolNames is how many tool names a request keeps in a set (OpenAI accepts 128 tools);
// past it, IsClientTool reads them from the body, so that memory does not grow with a hostile
// body's tools.
const maxToolNames = 256

// clientTools are the client's tools of a request.
type clientTools struct {
	// list is the client's tools array; tools the run of its elements (nil for none); names
	// their names, when there are at most maxToolNames (else IsClientTool reads them from list).
	list  json.RawMessage
	tools json.RawMessage
	names map[string]bool
}

// check checks the client's tools array: every tool an object, none named like a workspace
// tool; it keeps the run of its elements and, for a list of usual size, the names.
func (c *clientTools) check(list json.RawMessage) error {
	names := map[string]bool{}
	var err error
	c.list = list
	c.tools, err = eachToolName(list, func(name []byte) error {
		if name == nil {
			return nil
		}
		if tools.IsTool(string(name)) {
			return apierr.BadRequest("reserved_tool_name", "tools",
				"the tool name %q is reserved by the workspace proxy; rename the client tool", name)
		}
		if names != nil {
			names[string(name)] = true
			if len(names) > maxToolNames {
				names = nil
			}
		}
		return nil
	})
	c.names = names
	return err
}

// eachToolName walks a tools array, checked, and calls fn with the name of each tool's function
// or custom part, or its own name (the Responses API's shape; nil when it has none), without allocating for names without escapes. It
// returns the run of the array's elements (nil for none).
func eachToolName(list json.RawMessage, fn func(name []byte) error) (json.RawMessage, error) {
	var scratch struct{ tool, part rawjson.Object }
	first, last := -1, 0
	err := rawjson.Each(list, func(i, start, end int) error {
		elem := list[start:end]
		if elem[0] != '{' {
			return apierr.BadRequest("invalid_type", fmt.Sprintf("tools[%d]", i), "tools[%d] must be an object", i)
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
		if name == nil { // the Responses API's shape: {"type":"function","name":…}
			name = rawName(scratch.tool.Get("name"))
		}
		return fn(name)
	})
	if err != nil {
		var e *apierr.Error
		if errors.As(err, &e) || errors.Is(err, errFound) {
			return nil, err
		}
		return nil, apierr.BadRequest("invalid_type", "tools", "tools must be an array")
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

// IsClientTool reports whether name is one of the client's tools.
func (c *clientTools) IsClientTool(name string) bool {
	if c.tools == nil {
		return false
	}
	if c.names != nil {
		return c.names[name]
	}
	_, err := eachToolName(c.list, func(n []byte) error {
		if n != nil && string(n) == name {
			return errFound
		}
		return nil
	})
	return errors.Is(err, errFound)
}

// errFound stops a walk that found what it looked for.
var errFound = errors.New("found")

// topLevel is a request's top-level members, as the client sent them.
type topLevel struct{ fields rawjson.Object }

// Model is the model the request names ("" when none).
func (f *topLevel) Model() string {
	m, _ := rawjson.Unquote(f.fields.Get("model"))
	return m
}

// setDefault sets a top-level member the client did not send.
func (f *topLevel) setDefault(key string, value json.RawMessage) {
	if f.fields.Get(key) == nil {
		f.fields.Set(key, value)
	}
}

// askUsage has a streamed turn's upstream send its usage (stream_options.include_usage), which
// the proxy counts; the client gets the usage chunk only when it asked for it (IncludeUsage).
// Other members of stream_options keep their values.
func (c *ChatRequest) askUsage() {
	if !c.Stream || c.IncludeUsage {
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
// content (appendToLast). With PlaceSystem, or a last message of another role, it is appended to
// the first message when it is a system or developer message (as text, or as one more text part
// when its content is an array of parts), else it comes as a new first system message.
func (c *ChatRequest) InjectWorkspace(text string, placement Placement) {
	if placement == PlaceTail && c.n > 0 {
		last := c.msgs[c.last.start:c.last.end]
		if start, end, ok := rawjson.Member(last, "role"); ok {
			if role, _ := rawjson.Unquote(last[start:end]); role == "user" || role == "tool" {
				c.messages = c.messages[:0]
				if c.n > 1 {
					c.messages = append(c.messages, Payload{c.msgs[c.first.start:c.beforeLast]})
				}
				c.messages = append(c.messages, appendToLast(last, "content", "text", text))
				return
			}
		}
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

// isChatTurn reports a message of the client's turn: a user or tool message.
func isChatTurn(msg []byte) bool {
	start, end, ok := rawjson.Member(msg, "role")
	if !ok {
		return false
	}
	role, _ := rawjson.Unquote(msg[start:end])
	return role == "user" || role == "tool"
}

// neutralizedTurn is the elements of list from from to end as runs, with the workspace tags in
// the text of the client's latest turn neutralised: its last element that isTurn (the client's
// own text: a user message, a tool's result) and every element after it (an assistant prefill).
// The block then stands before the turn (placement system), and pasted text in the turn cannot
// pose as a later one.
func neutralizedTurn(list []byte, from, end int, isTurn func([]byte) bool) []Payload {
	in := func(start, stop int) bool { return start >= from && stop <= end }
	turn, before, prev := -1, -1, -1 // where the turn starts; the end of the element before it
	_ = rawjson.Each(list, func(_, start, stop int) error {
		if in(start, stop) {
			if isTurn(list[start:stop]) {
				turn, before = start, prev
			}
			prev = stop
		}
		return nil
	})
	if turn < 0 {
		return []Payload{{list[from:end]}}
	}
	var runs []Payload
	if before > from {
		runs = append(runs, Payload{list[from:before]})
	}
	// The turn's elements, those that hold no tag kept together in runs of the client's bytes.
	runStart, runEnd := -1, -1
	_ = rawjson.Each(list, func(_, start, stop int) error {
		if !in(start, stop) || start < turn {
			return nil
		}
		el := list[start:stop]
		if n := neutralizedElement(el); len(n) != len(el) || &n[0] != &el[0] {
			if runStart >= 0 {
				runs, runStart = append(runs, Payload{list[runStart:runEnd]}), -1
			}
			runs = append(runs, Payload{n})
			return nil
		}
		if runStart < 0 {
			runStart = start
		}
		runEnd = stop
		return nil
	})
	if runStart >= 0 {
		runs = append(runs, Payload{list[runStart:runEnd]})
	}
	return runs
}

// neutralizedElement is a message or input item with the workspace tags in the text of its
// content (or a function_call_output's output) neutralised; el itself when it holds none.
func neutralizedElement(el []byte) []byte {
	if !mayHoldTag(el) {
		return el
	}
	for _, member := range []string{"content", "output"} {
		start, end, ok := rawjson.Member(el, member)
		if !ok || (el[start] != '"' && el[start] != '[') {
			continue
		}
		if n := neutralizedContent(el[start:end]); string(n) != string(el[start:end]) {
			return append(append(append([]byte(nil), el[:start]...), n...), el[end:]...)
		}
	}
	return el
}

// neutralizedContent is a content (a JSON string, or an array of parts) with the workspace tags
// of its text neutralised.
func neutralizedContent(content json.RawMessage) json.RawMessage {
	if content[0] == '"' {
		return neutralized(content)
	}
	if !mayHoldTag(content) {
		return content
	}
	out := []byte{'['}
	_ = rawjson.Each(content, func(i, start, end int) error {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, neutralizedPart(content[start:end])...)
		return nil
	})
	return append(out, ']')
}

// appendToSystem appends text to a system message's content: to a string (after a blank line),
// as a last text part of an array, or as the content when it has none; byte for byte what
// earlier versions sent.
func appendToSystem(msg rawjson.Object, text string) json.RawMessage {
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
		msg.Set("content", rawjson.AppendArray(nil, append(parts, textPart(text))))
	default: // null or missing
		msg.Set("content", rawjson.String(text))
	}
	return msg.Bytes()
}

// appendToLast appends text to the member (content, or a Responses function_call_output's
// output) of the last message or item msg (placement tail) as appendToSystem does — to a string
// after a blank line, or as a last part of type partType — but keeps the message's own bytes,
// with the workspace tags in its text neutralised (so that pasted text cannot pose as the
// block). The message is neither decoded (but where its text may hold a tag) nor copied: it goes
// out as pieces of the client's body around the appended text.
func appendToLast(msg []byte, member, partType, text string) Payload {
	start, end, ok := rawjson.Member(msg, member)
	content := json.RawMessage(msg[start:end])
	if !ok || (content[0] != '"' && content[0] != '[') { // missing or null: the text is the content
		o, _ := rawjson.Parse(msg)
		o.Set(member, rawjson.String(text))
		return Payload{o.Bytes()}
	}
	var open json.RawMessage // the content up to where the text goes
	var tail []byte          // the text and what closes the content
	content = neutralizedContent(content)
	if content[0] == '"' {
		open = content[:len(content)-1]
		if !blankString(content) {
			tail = append(tail, `\n\n`...)
		}
		tail = append(rawjson.AppendEscaped(tail, text), '"')
	} else {
		open = content[:len(content)-1]
		if len(bytes.TrimSpace(open)) > 1 {
			tail = append(tail, ',')
		}
		tail = append(append(tail, typedTextPart(partType, text)...), ']')
	}
	return Payload{msg[:start], open, tail, msg[end:]}
}

func textPart(text string) json.RawMessage { return typedTextPart("text", text) }

// typedTextPart is a content part of text: chat's "text", the Responses API's "input_text".
func typedTextPart(typ, text string) json.RawMessage {
	part := rawjson.Object{}
	part.Set("type", rawjson.String(typ))
	part.Set("text", rawjson.String(text))
	return part.Bytes()
}

// mayHoldTag reports whether raw JSON may hold a workspace tag once decoded: a tag needs a '<',
// written as it is or as a \u escape.
func mayHoldTag(raw []byte) bool {
	return bytes.IndexByte(raw, '<') >= 0 || bytes.Contains(raw, []byte(`\u`))
}

// neutralized is the JSON string raw with its workspace tags neutralised; raw itself when it
// holds none.
func neutralized(raw json.RawMessage) json.RawMessage {
	if !mayHoldTag(raw) {
		return raw
	}
	s, _ := rawjson.Unquote(raw)
	if n := tools.NeutralizeTags(s); n != s {
		return rawjson.String(n)
	}
	return raw
}

// neutralizedPart is a content part with the workspace tags of its text neutralised; the part
// itself when it holds none.
func neutralizedPart(part json.RawMessage) json.RawMessage {
	if !mayHoldTag(part) {
		return part
	}
	o, err := rawjson.Parse(part)
	if err != nil || len(o.Get("text")) == 0 || o.Get("text")[0] != '"' {
		return part
	}
	if text := neutralized(o.Get("text")); len(text) != len(o.Get("text")) || string(text) != string(o.Get("text")) {
		o.Set("text", text)
		return o.Bytes()
	}
	return part
}

// blankString reports whether the JSON string raw holds nothing but white space (as
// strings.TrimSpace sees it), without decoding it.
func blankString(raw json.RawMessage) bool {
	b := raw[1 : len(raw)-1]
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == '\\' && i+1 < len(b) {
			switch b[i+1] {
			case 'n', 't', 'r', 'f':
				i += 2
				continue
			case 'u':
				if i+6 <= len(b) {
					if n, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 32); err == nil && unicode.IsSpace(rune(n)) {
						i += 6
						continue
					}
				}
			}
			return false
		}
		if !unicode.IsSpace(r) {
			return false
		}
		i += size
	}
	return true
}

// appendRound adds a tool round to the conversation: the assistant message of the reply
// (content, the reasoning members the upstream sent, and the workspace's calls) and one tool
// message per call with its result.
func (c *ChatRequest) appendRound(content json.RawMessage, reasoning rawjson.Object, calls []toolCall, results []string) {
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
		tm.Set("content", rawjson.String(results[i]))
		c.messages = append(c.messages, Payload{tm.Bytes()})
	}
}

// Body encodes the request for one upstream round: the conversation so far and the client's
// tools, followed by the proxy's when withWorkspaceTools (see roundBody). Large values go out as
// pieces of the client's body: nothing of it is copied.
func (c *ChatRequest) Body(withWorkspaceTools bool) Payload {
	return roundBody(c.fields, "messages", c.messages, c.toolRuns(withWorkspaceTools, workspaceTools))
}

// toolRuns are the tools of a round: the client's, then the proxy's (in the request's shape)
// when withWorkspaceTools.
func (c *clientTools) toolRuns(withWorkspaceTools bool, workspace Payload) []Payload {
	var runs []Payload
	if len(c.tools) > 0 {
		runs = append(runs, Payload{c.tools})
	}
	if withWorkspaceTools {
		runs = append(runs, workspace)
	}
	return runs
}

// replacement is a top-level member a round sends in place of the client's (or adds).
type replacement struct {
	key   string
	value json.RawMessage // nil: the client's, if any
}

// roundBody writes a round's request: the client's members in their order, the conversation
// (member conv) as runs, the tools as toolRuns — without any tool, tools, tool_choice and
// parallel_tool_calls are dropped (an upstream refuses the last two without tools) — and the
// replacements' values in place of the client's; the conversation, tools and replacements the
// client did not send come last.
func roundBody(top rawjson.Object, conv string, runs, toolRuns []Payload, replace ...replacement) Payload {
	replaced := func(k string) int {
		for i, r := range replace {
			if r.key == k && r.value != nil {
				return i
			}
		}
		return -1
	}
	w := payloadWriter{buf: make([]byte, 0, 1024)}
	w.byte('{')
	hasConv, hasTools := false, false
	written := make([]bool, len(replace)) // the replacements written in place
	for i, k := range top.Keys {
		switch r := replaced(k); {
		case k == conv:
			hasConv = true
			w.member(k)
			w.array(runs)
		case k == "tools":
			hasTools = true
			if len(toolRuns) > 0 {
				w.member(k)
				w.array(toolRuns)
			}
		case k == "tool_choice" || k == "parallel_tool_calls":
			if len(toolRuns) > 0 {
				w.member(k)
				w.raw(top.Vals[i])
			}
		case r >= 0:
			written[r] = true
			w.member(k)
			w.raw(replace[r].value)
		default:
			w.member(k)
			w.raw(top.Vals[i])
		}
	}
	if !hasConv {
		w.member(conv)
		w.array(runs)
	}
	if !hasTools && len(toolRuns) > 0 {
		w.member("tools")
		w.array(toolRuns)
	}
	for i, r := range replace {
		if !written[i] && r.value != nil {
			w.member(r.key)
			w.raw(r.value)
		}
	}
	w.byte('}')
	return w.payload()
}

// workspaceTools are the five tools' definitions as one run of elements.
var workspaceTools = func() Payload {
	a := rawjson.AppendArray(nil, tools.Definitions)
	return Payload{a[1 : len(a)-1]}
}()

// Payload is an upstream request body as pieces, which alias what they were built from: a
// round's body is written out, never joined into one buffer.
type Payload [][]byte

// Len is the body's length in bytes.
func (p Payload) Len() int {
	n := 0
	for _, b := range p {
		n += len(b)
	}
	return n
}

// Reader reads the body from its start; each call gives a reader of its own.
func (p Payload) Reader() io.Reader {
	b := net.Buffers(append([][]byte(nil), p...))
	return &b
}

// Bytes is the body joined into one buffer (for tests).
func (p Payload) Bytes() []byte { return bytes.Join(p, nil) }

// payloadWriter builds a Payload: small values are copied into a shared buffer, large ones
// (the client's messages and tools) go in as pieces of their own.
type payloadWriter struct {
	pieces  Payload
	buf     []byte
	members int
}

// largeValue is the size from which a value goes in as a piece of its own.
const largeValue = 512

func (w *payloadWriter) byte(c byte) { w.buf = append(w.buf, c) }

// member starts an object member: a comma when it is not the first, the key and its colon.
func (w *payloadWriter) member(key string) {
	if w.members > 0 {
		w.byte(',')
	}
	w.members++
	w.buf = rawjson.AppendString(w.buf, key)
	w.byte(':')
}

// array writes an array whose elements are the runs' (a run holds one or more elements).
func (w *payloadWriter) array(runs []Payload) {
	w.byte('[')
	for i, run := range runs {
		if i > 0 {
			w.byte(',')
		}
		for _, piece := range run {
			w.raw(piece)
		}
	}
	w.byte(']')
}

func (w *payloadWriter) raw(v []byte) {
	if len(v) < largeValue {
		w.buf = append(w.buf, v...)
		return
	}
	w.flush()
	w.pieces = append(w.pieces, v)
}

func (w *payloadWriter) flush() {
	if len(w.buf) > 0 {
		w.pieces = append(w.pieces, w.buf)
		w.buf = w.buf[len(w.buf):] // the next small values go on in the same array
	}
}

func (w *payloadWriter) payload() Payload {
	w.flush()
	return w.pieces
}
