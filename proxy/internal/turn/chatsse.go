package turn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
)

// chatSSE is the dialect of a streamed chat completions turn (docs/spec.md §7, §16): chunks go
// to the client as the upstream sent them, in every round, but for what the proxy owns: the
// workspace's tool calls are never emitted and the client's are re-indexed from 0; the client
// gets one role delta at the start, one finish_reason at the end, the first id the upstream gave
// on every chunk, and the turn's usage once, where the last round's upstream put it.
type chatSSE struct {
	req     *ChatRequest
	up      Upstream
	out     Emitter
	log     *slog.Logger // nil logs nothing
	thread  string
	dirty   bool   // written, not flushed
	id      string // the first id the upstream gave (or one made up)
	model   string // the model the upstream named (for traces)
	emitted bool   // the role delta went out
	// last is the first chunk with choices, then the last chunk with a finish_reason: the
	// template of the finish chunk.
	last rawjson.Object
	// earlier are the usage objects of the rounds before this one.
	earlier usageSum
	// scratch holds the member lists chunks are parsed into, reused from chunk to chunk.
	scratch struct{ chunk, choice, delta rawjson.Object }
	rd      streamRound
}

func newChatSSE(req *ChatRequest, up Upstream, log *slog.Logger, thread string, out Emitter) *chatSSE {
	return &chatSSE{req: req, up: up, out: out, log: log, thread: thread, rd: newStreamRound()}
}

func (s *chatSSE) request(withWorkspaceTools bool) Payload { return s.req.Body(withWorkspaceTools) }

func (s *chatSSE) fetch(ctx context.Context, body Payload) ([]toolCall, json.RawMessage, roundInfo, error) {
	if s.rd.usage != nil {
		s.earlier.raws = append(s.earlier.raws, s.rd.usage)
	}
	s.rd = newStreamRound()
	if err := s.round(ctx, body); err != nil {
		if s.rd.emitted {
			return nil, nil, roundInfo{}, noRetry{err} // the client has part of this round: a retry would repeat it
		}
		return nil, nil, roundInfo{}, err
	}
	calls := make([]toolCall, len(s.rd.calls))
	for i, c := range s.rd.calls {
		id := c.id
		if id == "" && !c.client {
			id = newCallID() // some servers send none; the round sent back needs one
		}
		calls[i] = toolCall{ID: id, Name: c.name, Arguments: c.args.String(), Client: c.client, shown: c.client}
	}
	info := roundInfo{model: s.model, id: s.id}
	if s.rd.finish != "" {
		info.finishReasons = []string{s.rd.finish}
	}
	calls, _ = unwrapParallel(calls, s.req.IsClientTool)
	return calls, s.rd.usage, info, nil
}

func (s *chatSSE) pause() error {
	s.dirty = true // the Emitter learns that the stream now waits for the proxy's tools
	return s.flush()
}

func (s *chatSSE) extend(calls []toolCall, results []string) {
	if s.rd.truncated && s.log != nil {
		s.log.Warn("round text over the cap sent back truncated", slog.String("thread", s.thread), slog.Int("cap", maxRoundText))
	}
	var content json.RawMessage
	if s.rd.content.Len() > 0 {
		content = rawjson.String(s.rd.content.String())
	}
	var reasoning rawjson.Object
	for _, key := range reasoningKeys {
		if b := s.rd.reasoning[key]; b != nil && b.Len() > 0 {
			reasoning.Set(key, rawjson.String(b.String()))
		}
	}
	s.req.appendRound(content, reasoning, calls, results)
}

// reasoningKeys are the delta members servers stream a model's reasoning in (DeepSeek, vLLM,
// SGLang: reasoning_content; vLLM, OpenRouter, Ollama: reasoning). A round sent back carries
// them as they came: servers expect a turn's reasoning back within it.
var reasoningKeys = [...]string{"reasoning_content", "reasoning"}

// streamRound is what one round keeps: only what the next round needs.
type streamRound struct {
	content   strings.Builder
	reasoning map[string]*strings.Builder
	truncated bool
	calls     []*callAcc
	byIndex   map[int]*callAcc
	byID      map[string]*callAcc
	clientN   int // the client's calls so far: the next client index
	finish    string
	usage     json.RawMessage
	// Where the round's usage came: in its finish chunk, and in a chunk that carried nothing
	// else (its choices empty, or one with an empty delta), kept as it came: the turn's usage
	// goes to the client where the last round's came, in the same shape.
	usageInFinish bool
	usageChunk    rawjson.Object
	// inPlace: the round's finish chunk came without a workspace call in the round, so it is the
	// turn's last, and it and what follows go to the client where they came (finishSent and
	// usageSent once they did).
	inPlace, finishSent, usageSent bool
	done                           bool // [DONE] seen
	emitted                        bool // the client got part of this round
}

func newStreamRound() streamRound {
	return streamRound{byIndex: map[int]*callAcc{}, byID: map[string]*callAcc{}}
}

// callAcc accumulates one tool call's deltas.
type callAcc struct {
	id, typ, name string
	args          strings.Builder
	decided       bool // the name is known: the client's or the proxy's
	client        bool
	clientIndex   int
	shown         bool // the client got its first item
}

// round streams one upstream call to its end.
func (s *chatSSE) round(ctx context.Context, body Payload) error {
	resp, err := s.up.Post(ctx, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	events := sse.NewReader(resp.Body)
	for {
		if s.dirty && !events.EventBuffered() {
			if err := s.flush(); err != nil {
				return err
			}
		}
		data, err := events.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return readError(ctx, err)
		}
		if bytes.HasPrefix(data, []byte("[DONE]")) {
			s.rd.done = true
			break
		}
		if err := s.chunk(data); err != nil {
			return err
		}
	}
	if !s.rd.done && s.rd.finish == "" {
		return fmt.Errorf("%w: %w", apierr.ErrUpstreamProtocol, errStreamEnded)
	}
	return nil
}

// chunk handles one upstream chunk: it keeps what the round needs and emits what the client
// gets. What it cannot read is not the proxy's: the client gets it as it came.
func (s *chatSSE) chunk(data []byte) error {
	c, err := rawjson.ParseInto(s.scratch.chunk, data)
	if err != nil {
		return s.emit(data)
	}
	s.scratch.chunk = c
	if c.Has("error") {
		return &apierr.StreamError{Data: append([]byte(nil), data...)}
	}
	if s.id == "" {
		s.id = text(c.Get("id"))
	}
	if s.model == "" {
		s.model = text(c.Get("model"))
	}
	hasUsage := !isNull(c.Get("usage"))
	if hasUsage {
		s.rd.usage = append([]byte(nil), c.Get("usage")...) // kept past the reader's buffer
	}
	var choices []json.RawMessage
	if v := c.Get("choices"); !isNull(v) {
		if choices, err = rawjson.Split(v); err != nil {
			return s.emit(data)
		}
	}
	choice, delta := rawjson.Object{}, rawjson.Object{}
	if len(choices) > 0 {
		if choice, err = rawjson.ParseInto(s.scratch.choice, choices[0]); err != nil {
			return s.emit(data)
		}
		s.scratch.choice = choice
		if d := choice.Get("delta"); !isNull(d) {
			if delta, err = rawjson.ParseInto(s.scratch.delta, d); err != nil {
				return s.emit(data)
			}
			s.scratch.delta = delta
		}
	}
	fr := text(choice.Get("finish_reason"))
	usageOnly := hasUsage && fr == "" && (len(choices) == 0 || (emptyDelta(delta, "role") && !carriesMore(choice)))
	switch {
	case usageOnly && !s.req.IncludeUsage:
		return nil // the proxy asked for it (to count the turn), not the client
	case usageOnly && !s.rd.inPlace:
		s.rd.usageChunk = c.Own() // the usage of its own: for the end of the turn
		return nil
	case len(choices) == 0 && !usageOnly:
		return nil // nothing for the client (what some servers send first: Azure's prompt filter results)
	}
	s.rd.keep(&s.rd.content, delta.Get("content"))
	for _, key := range reasoningKeys {
		if v := delta.Get(key); !isNull(v) {
			if s.rd.reasoning == nil {
				s.rd.reasoning = map[string]*strings.Builder{}
			}
			if s.rd.reasoning[key] == nil {
				s.rd.reasoning[key] = &strings.Builder{}
			}
			s.rd.keep(s.rd.reasoning[key], v)
		}
	}
	changed := hasUsage || fr != ""
	if delta.Has("role") {
		delta.Del("role") // one role delta, added to the first chunk the client gets
		changed = true
	}
	if tcs := delta.Get("tool_calls"); !isNull(tcs) {
		if items, ok := s.rd.toolCalls(s.req, tcs); ok {
			changed = true
			if len(items) == 0 {
				delta.Del("tool_calls")
			} else {
				delta.Set("tool_calls", rawjson.AppendArray(nil, items))
			}
		}
	}
	if fr != "" || s.last.Keys == nil {
		s.last = c.Own() // the template of the finish chunk: data is the reader's buffer
	}
	if fr != "" {
		s.rd.finish = fr
		s.rd.usageInFinish = s.rd.usageInFinish || hasUsage
		// The round's calls are known: without a workspace call it is the turn's last round,
		// whose finish chunk and what follows it go to the client where they came.
		s.rd.inPlace = !s.rd.hidCalls()
	}
	finish := json.RawMessage("null") // a finish_reason the turn's last chunk carries
	if s.rd.inPlace {
		changed, finish = true, choice.Get("finish_reason")
		if finish == nil {
			finish = json.RawMessage("null")
		}
		if hasUsage {
			c.Del("usage")
			if s.req.IncludeUsage {
				c.Set("usage", s.turnUsage())
				s.rd.usageSent = true
			}
			hasUsage = false
		}
		s.rd.finishSent = s.rd.finishSent || fr != ""
		if len(choices) == 0 {
			c.Set("id", rawjson.String(s.id))
			return s.emit(c.Bytes())
		}
	} else if emptyDelta(delta) && !carriesMore(choice) {
		// Nothing for the client now: a role alone (it goes with the first chunk that carries
		// something), a workspace call, or a finish_reason (it comes at the end of the turn).
		return nil
	}
	if !changed && len(choices) == 1 && s.asIs(c) {
		return s.emit(data) // nothing to change: its bytes go out as they came
	}
	if hasUsage {
		c.Set("usage", json.RawMessage("null")) // the turn's usage comes once, at its end
	}
	return s.send(c, choice, delta, finish)
}

// turnUsage is the turn's usage so far: the earlier rounds' and this round's, as usageSum
// makes it.
func (s *chatSSE) turnUsage() json.RawMessage {
	return (&usageSum{raws: append(s.earlier.raws[:len(s.earlier.raws):len(s.earlier.raws)], s.rd.usage)}).json()
}

// asIs reports whether a chunk from which nothing was taken can go to the client as it came:
// the role delta already went out, and it carries the turn's id and the chunk object type.
func (s *chatSSE) asIs(c rawjson.Object) bool {
	return s.emitted && s.sameID(c.Get("id")) && string(c.Get("object")) == `"chat.completion.chunk"`
}

// sameID reports whether a chunk's raw id is the turn's.
func (s *chatSSE) sameID(raw json.RawMessage) bool {
	return len(raw) == len(s.id)+2 && raw[0] == '"' && string(raw[1:len(raw)-1]) == s.id
}

// carriesMore reports whether a choice carries something beside its delta and finish_reason
// (logprobs, content filter results, a vendor's member; not null, {} or []).
func carriesMore(choice rawjson.Object) bool {
	for i, k := range choice.Keys {
		switch v := string(choice.Vals[i]); {
		case k == "index" || k == "delta" || k == "finish_reason", v == "null", v == "{}", v == "[]":
		default:
			return true
		}
	}
	return false
}

// keep appends the text of a raw JSON string to what the round keeps, up to maxRoundText;
// anything but a string is ignored.
func (rd *streamRound) keep(b *strings.Builder, raw json.RawMessage) {
	if len(raw) < 2 || raw[0] != '"' {
		return
	}
	if b.Len()+len(raw)-2 > maxRoundText {
		rd.truncated = true
		return
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		b.Write(raw[1 : len(raw)-1]) // no escapes: the bytes are the text
		return
	}
	b.WriteString(text(raw))
}

// send emits a chunk: c with its one choice holding delta and finish_reason, the turn's id, and
// the role delta when it is the first the client gets.
func (s *chatSSE) send(c, choice, delta rawjson.Object, finishReason json.RawMessage) error {
	if !s.emitted {
		delta.Del("role")
		d := rawjson.Object{Keys: []string{"role"}, Vals: []json.RawMessage{rawjson.String("assistant")}}
		d.Keys = append(d.Keys, delta.Keys...)
		d.Vals = append(d.Vals, delta.Vals...)
		delta = d
		s.emitted = true
	}
	if s.id == "" {
		s.id = "chatcmpl-" + randomHex(12)
	}
	choice.Set("delta", delta.Bytes())
	choice.Set("finish_reason", finishReason)
	c.Set("id", rawjson.String(s.id))
	c.Set("object", rawjson.String("chat.completion.chunk"))
	c.Set("choices", rawjson.AppendArray(nil, []json.RawMessage{choice.Bytes()}))
	return s.emit(c.Bytes())
}

func (s *chatSSE) emit(chunk []byte) error {
	s.dirty = true
	s.rd.emitted = true
	return s.out.Emit("", chunk)
}

func (s *chatSSE) flush() error {
	if !s.dirty {
		return nil
	}
	s.dirty = false
	return s.out.Flush()
}

// emptyDelta reports a delta with nothing for the client: no members, or only null and ""
// (and the members named in but, whatever they hold).
func emptyDelta(d rawjson.Object, but ...string) bool {
	for i, v := range d.Vals {
		if s := string(v); s != "null" && s != `""` && !slices.Contains(but, d.Keys[i]) {
			return false
		}
	}
	return true
}

// toolCalls accumulates a delta's tool-call items and returns those the client gets: its own
// calls, re-indexed from 0, each item otherwise as it came (an item that is not an object, too).
// ok is false when raw is not an array: the client gets it as it came.
//
// An item belongs to the call of its index; without an index, to the call of its id; without
// either, to the call still open, unless it brings a name while that call has one (a name
// begins a call: two whole calls in one chunk are two calls). Empty ids and names name nothing.
func (rd *streamRound) toolCalls(req *ChatRequest, raw json.RawMessage) (out []json.RawMessage, ok bool) {
	items, err := rawjson.Split(raw)
	if err != nil {
		return nil, false
	}
	for _, item := range items {
		d, o, isObject := readChatCall(item)
		if !isObject {
			out = append(out, item)
			continue
		}
		acc := rd.callOf(d)
		if d.id != "" && acc.id == "" {
			acc.id = d.id
			rd.byID[d.id] = acc
		}
		if d.typ != "" {
			acc.typ = d.typ
		}
		acc.name += d.name
		if !acc.decided && acc.name != "" {
			acc.decided = true
			if req.IsClientTool(acc.name) {
				acc.client, acc.clientIndex = true, rd.clientN
				rd.clientN++
			}
		}
		switch {
		case acc.client && !acc.shown:
			// The first item the client gets of this call carries all of it so far.
			acc.args.WriteString(d.args)
			acc.shown = true
			out = append(out, clientCallItem(acc))
			acc.args.Reset() // the client has it; the proxy does not run client calls
		case acc.client:
			o.Set("index", rawjson.Int(acc.clientIndex))
			out = append(out, o.Bytes())
		default:
			acc.args.WriteString(d.args)
		}
	}
	return out, true
}

// hidCalls reports whether the round called the workspace's tools (whose calls the client never sees).
func (rd *streamRound) hidCalls() bool {
	for _, c := range rd.calls {
		if !c.client {
			return true
		}
	}
	return false
}

// callOf is the call a tool-call item belongs to (see toolCalls), a new one when none.
func (rd *streamRound) callOf(d chatCall) *callAcc {
	var acc *callAcc
	switch open := len(rd.calls) - 1; {
	case d.index >= 0:
		acc = rd.byIndex[d.index]
	case d.id != "":
		acc = rd.byID[d.id]
	case open >= 0 && (d.name == "" || rd.calls[open].name == ""):
		acc = rd.calls[open]
	}
	if acc == nil {
		acc = &callAcc{}
		rd.calls = append(rd.calls, acc)
		if d.index >= 0 {
			rd.byIndex[d.index] = acc
		}
	}
	return acc
}

// clientCallItem is the first item of a client's call: its index, the id and type when known,
// its name and the arguments so far.
func clientCallItem(acc *callAcc) json.RawMessage {
	o := rawjson.Object{}
	o.Set("index", rawjson.Int(acc.clientIndex))
	if acc.id != "" {
		o.Set("id", rawjson.String(acc.id))
	}
	typ := acc.typ
	if typ == "" {
		typ = "function"
	}
	o.Set("type", rawjson.String(typ))
	fn := rawjson.Object{}
	fn.Set("name", rawjson.String(acc.name))
	fn.Set("arguments", rawjson.String(acc.args.String()))
	o.Set("function", fn.Bytes())
	return o.Bytes()
}

// finish ends the turn: the client's calls it has not seen yet (those of a parallel wrapper),
// the finish chunk (finish_reason "tool_calls" when the client has calls to run), and the
// turn's usage when the client asked for it, where the last round's upstream put it.
func (s *chatSSE) finish(clientCalls []toolCall, usage *usageSum, _ int) error {
	withUsage := s.req.IncludeUsage && !usage.empty()
	if s.rd.finishSent {
		if withUsage && !s.rd.usageSent { // the last round's upstream sent none
			u := s.last.Clone()
			u.Set("id", rawjson.String(s.id))
			u.Set("choices", json.RawMessage("[]"))
			u.Set("usage", usage.json())
			return s.emit(u.Bytes())
		}
		return nil
	}
	reason := s.rd.finish
	switch {
	case len(clientCalls) > 0:
		reason = "tool_calls"
	case reason == "" || (s.rd.hidCalls() && (reason == "tool_calls" || reason == "function_call")):
		reason = "stop" // the only calls were the workspace's
	}
	c := s.last.Clone()
	if c.Keys == nil {
		c.Set("id", rawjson.String(s.id))
		c.Set("object", rawjson.String("chat.completion.chunk"))
	}
	choice := rawjson.Object{}
	if choices := c.Get("choices"); choices != nil {
		if list, err := rawjson.Split(choices); err == nil && len(list) > 0 {
			choice, _ = rawjson.Parse(list[0])
		}
	}
	choice.Set("index", json.RawMessage("0"))
	if choice.Get("logprobs") != nil {
		choice.Set("logprobs", json.RawMessage("null")) // they went out with their content
	}
	if err := s.unseen(c, choice, clientCalls); err != nil {
		return err
	}
	inFinish, own := s.rd.usageInFinish, s.rd.usageChunk
	if withUsage && !inFinish && own.Keys == nil { // the last round's upstream sent none
		own = c.Clone()
		own.Set("choices", json.RawMessage("[]"))
	}
	switch {
	case withUsage && inFinish:
		c.Set("usage", usage.json())
	case c.Has("usage"):
		c.Del("usage") // the proxy asked for it, not the client
	}
	if err := s.send(c, choice.Clone(), rawjson.Object{}, rawjson.String(reason)); err != nil {
		return err
	}
	if withUsage && own.Keys != nil {
		u := own.Clone()
		u.Set("id", rawjson.String(s.id))
		u.Set("usage", usage.json())
		return s.emit(u.Bytes())
	}
	return nil
}

// unseen emits, in one chunk like c, the client's calls a stream has not shown it: the calls of
// a parallel wrapper, which the proxy held until its round ended.
func (s *chatSSE) unseen(c, choice rawjson.Object, calls []toolCall) error {
	var items []json.RawMessage
	for _, call := range calls {
		if call.shown {
			continue
		}
		acc := &callAcc{id: call.ID, name: call.Name, clientIndex: s.rd.clientN}
		acc.args.WriteString(call.Arguments)
		s.rd.clientN++
		items = append(items, clientCallItem(acc))
	}
	if len(items) == 0 {
		return nil
	}
	delta := rawjson.Object{}
	delta.Set("tool_calls", rawjson.AppendArray(nil, items))
	u := c.Clone()
	u.Del("usage")
	return s.send(u, choice.Clone(), delta, json.RawMessage("null"))
}

// Failure is the event that ends a stream whose turn failed after its first byte: the
// upstream's own error event, or the proxy's error.
func (s *chatSSE) Failure(err error) (string, []byte) {
	var se *apierr.StreamError
	if errors.As(err, &se) {
		if !s.emitted && s.last.Keys != nil {
			// The chunks before it carried nothing: the client still gets one, as it would
			// straight (the id and model of the stream), then the error.
			c := s.last.Clone()
			choice := rawjson.Object{}
			if list, err := rawjson.Split(c.Get("choices")); err == nil && len(list) > 0 {
				choice, _ = rawjson.Parse(list[0])
			}
			c.Del("usage")
			_ = s.send(c, choice, rawjson.Object{}, json.RawMessage("null"))
		}
		return "", se.Data
	}
	return "", apierr.StreamFailure(err).Body()
}

// End is what follows the last chunk of a stream that succeeded.
func (s *chatSSE) End() []byte { return []byte("data: [DONE]\n\n") }

// Keepalive is a comment line, which SSE parsers skip.
func (s *chatSSE) Keepalive() []byte { return keepaliveComment }

var keepaliveComment = []byte(": keepalive\n\n")
