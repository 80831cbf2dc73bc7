package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
)

// Emitter is the client of a streamed turn.
type Emitter interface {
	// Emit writes one event: data (a chat.completion.chunk, a Responses event) under the event
	// name event ("" for none).
	Emit(event string, data []byte) error
	// Flush sends what was written. The runner calls it whenever it is about to wait (for the
	// upstream, or for tools), so every event leaves as soon as it is ready, and events that
	// arrived together leave together.
	Flush() error
}

// StreamError is an error the upstream sent inside its stream (`data: {"error":…}`).
type StreamError struct {
	Data []byte // the event's JSON, as sent
}

func (e *StreamError) Error() string {
	return "upstream stream error: " + truncate(string(e.Data), 200)
}

// chatSSE is the dialect of a streamed chat completions turn (SPEC §7): content is emitted
// as it arrives, in every round; the workspace's tool calls are never emitted, the client's are,
// re-indexed from 0. The client gets one role delta at the start, one finish_reason at the end,
// and every chunk carries the first id the upstream gave.
type chatSSE struct {
	req     *ChatRequest
	up      Upstream
	out     Emitter
	log     *slog.Logger // nil logs nothing
	thread  string
	dirty   bool           // written, not flushed
	id      string         // the first id the upstream gave (or one made up)
	model   string         // the model the upstream named (for traces)
	emitted bool           // the role delta went out
	last    rawjson.Object // the first chunk with choices, then the last finish chunk: the template of the finish chunk
	// scratch holds the member lists chunks are parsed into, reused from chunk to chunk.
	scratch struct{ chunk, choice, delta rawjson.Object }
	rd      streamRound
}

func newChatSSE(req *ChatRequest, up Upstream, out Emitter) *chatSSE {
	return &chatSSE{req: req, up: up, out: out, rd: streamRound{byIndex: map[int]*callAcc{}}}
}

func (s *chatSSE) request(withWorkspaceTools bool) Payload { return s.req.Body(withWorkspaceTools) }

func (s *chatSSE) fetch(ctx context.Context, body Payload) ([]toolCall, json.RawMessage, roundInfo, error) {
	s.rd = streamRound{byIndex: map[int]*callAcc{}}
	if err := s.round(ctx, body); err != nil {
		if s.rd.emitted {
			return nil, nil, roundInfo{}, noRetry{err} // the client has part of this round: a retry would repeat it
		}
		return nil, nil, roundInfo{}, err
	}
	calls := make([]toolCall, len(s.rd.calls))
	for i, c := range s.rd.calls {
		if c.id == "" {
			c.id = newCallID() // some servers send none
		}
		calls[i] = toolCall{ID: c.id, Name: c.name, Arguments: c.args.String(), Client: c.client}
	}
	info := roundInfo{model: s.model, id: s.id}
	if s.rd.finish != "" {
		info.finishReasons = []string{s.rd.finish}
	}
	return calls, s.rd.usage, info, nil
}

func (s *chatSSE) pause() error { return s.flush() }

func (s *chatSSE) extend(calls []toolCall, results []string) {
	if s.rd.truncated && s.log != nil {
		s.log.Warn("round text over the cap sent back truncated", slog.String("thread", s.thread), slog.Int("cap", maxRoundText))
	}
	var content, reasoning json.RawMessage
	if s.rd.content.Len() > 0 {
		content = rawjson.String(s.rd.content.String())
	}
	if s.rd.reasoning.Len() > 0 {
		reasoning = rawjson.String(s.rd.reasoning.String())
	}
	s.req.appendRound(content, reasoning, calls, results)
}

// streamRound is what one round keeps: only what the next round needs.
type streamRound struct {
	content, reasoning strings.Builder
	truncated          bool
	calls              []*callAcc
	byIndex            map[int]*callAcc
	clientCalls        int
	finish             string
	usage              json.RawMessage
	done               bool // [DONE] seen
	emitted            bool // the client got part of this round
}

// callAcc accumulates one tool call's deltas.
type callAcc struct {
	id, typ, name string
	args          strings.Builder
	decided       bool // the name is known: client's or the proxy's
	client        bool
	clientIndex   int
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
		if string(data) == "[DONE]" {
			s.rd.done = true
			break
		}
		if err := s.chunk(data); err != nil {
			return err
		}
	}
	if !s.rd.done && s.rd.finish == "" {
		return fmt.Errorf("%w: %w", ErrUpstreamProtocol, errStreamEnded)
	}
	return nil
}

// chunk handles one upstream chunk: it keeps what the round needs and emits what the client gets.
func (s *chatSSE) chunk(data []byte) error {
	c, err := rawjson.ParseInto(s.scratch.chunk, data)
	if err != nil {
		return fmt.Errorf("%w: a chunk is not a JSON object", ErrUpstreamProtocol)
	}
	s.scratch.chunk = c
	if c.Has("error") {
		return &StreamError{Data: append([]byte(nil), data...)}
	}
	if s.id == "" {
		if id, _ := rawjson.Unquote(c.Get("id")); id != "" {
			s.id = id
		}
	}
	if s.model == "" {
		s.model, _ = rawjson.Unquote(c.Get("model"))
	}
	hadUsage := c.Has("usage")
	if hadUsage {
		s.rd.usage = append([]byte(nil), c.Get("usage")...) // kept past the reader's buffer
		c.Set("usage", json.RawMessage("null"))
	}
	var choices []json.RawMessage
	if v := c.Get("choices"); v != nil && string(v) != "null" {
		if choices, err = rawjson.Split(v); err != nil {
			return fmt.Errorf("%w: choices is not an array", ErrUpstreamProtocol)
		}
	}
	if len(choices) == 0 {
		return nil // nothing for the client (a usage-only chunk, Azure's prompt filter results)
	}
	choice, err := rawjson.ParseInto(s.scratch.choice, choices[0])
	if err != nil {
		return fmt.Errorf("%w: a choice is not an object", ErrUpstreamProtocol)
	}
	s.scratch.choice = choice
	fr, _ := rawjson.Unquote(choice.Get("finish_reason"))
	if fr != "" {
		s.rd.finish = fr
	}
	if fr != "" || s.last.Keys == nil {
		// The template of the finish chunk: data is the reader's buffer, so keep a copy.
		s.last = c.Own()
	}
	delta := rawjson.Object{}
	if d := choice.Get("delta"); d != nil && string(d) != "null" {
		if delta, err = rawjson.ParseInto(s.scratch.delta, d); err != nil {
			return fmt.Errorf("%w: a delta is not an object", ErrUpstreamProtocol)
		}
		s.scratch.delta = delta
	}
	hadRole := delta.Index("role") >= 0
	delta.Del("role") // one role delta, added to the first chunk the client gets
	s.rd.keep(&s.rd.content, delta.Get("content"))
	s.rd.keep(&s.rd.reasoning, delta.Get("reasoning_content"))
	if tcs := delta.Get("tool_calls"); tcs != nil {
		items, err := s.rd.toolCalls(s.req, tcs)
		if err != nil {
			return err
		}
		if len(items) == 0 {
			delta.Del("tool_calls")
		} else {
			delta.Set("tool_calls", rawjson.AppendArray(nil, items))
		}
	}
	if emptyDelta(delta) && !choice.Has("logprobs") {
		return nil
	}
	if !hadRole && !hadUsage && len(choices) == 1 && s.asIs(c, choice, delta) {
		return s.emit(data) // the common content chunk: nothing to change, its bytes go out as they came
	}
	return s.send(c, choice, delta, json.RawMessage("null"))
}

// asIs reports whether a chunk of one choice, from which nothing was taken out (no role delta,
// no usage), can go to the client as it came: the role delta already went out, and it carries
// no finish_reason and no tool calls to rewrite, the turn's id and the chunk object type.
func (s *chatSSE) asIs(c, choice, delta rawjson.Object) bool {
	return s.emitted && !choice.Has("finish_reason") && delta.Index("tool_calls") < 0 &&
		s.sameID(c.Get("id")) && string(c.Get("object")) == `"chat.completion.chunk"`
}

// sameID reports whether a chunk's raw id is the turn's.
func (s *chatSSE) sameID(raw json.RawMessage) bool {
	return len(raw) == len(s.id)+2 && raw[0] == '"' && string(raw[1:len(raw)-1]) == s.id
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
	if text, ok := rawjson.Unquote(raw); ok {
		b.WriteString(text)
	}
}

// send emits a chunk: c with its one choice holding delta and finish_reason, the turn's id, and
// the role delta when it is the first the client gets.
func (s *chatSSE) send(c, choice, delta rawjson.Object, finishReason json.RawMessage) error {
	if !s.emitted {
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

// emptyDelta reports a delta with nothing for the client: no members, or only null and "".
func emptyDelta(d rawjson.Object) bool {
	for _, v := range d.Vals {
		if s := string(v); s != "null" && s != `""` {
			return false
		}
	}
	return true
}

// toolCalls accumulates a delta's tool-call items and returns those the client gets: its own
// calls, re-indexed from 0. Items without an index (some servers omit it) continue the last call
// unless they bring a new id.
func (rd *streamRound) toolCalls(req *ChatRequest, raw json.RawMessage) ([]json.RawMessage, error) {
	items, err := rawjson.Split(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: tool_calls is not an array", ErrUpstreamProtocol)
	}
	var out []json.RawMessage
	for _, item := range items {
		var d struct {
			Index    *int   `json:"index"`
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		if err := json.Unmarshal(item, &d); err != nil {
			return nil, fmt.Errorf("%w: a tool call delta is not understood", ErrUpstreamProtocol)
		}
		idx := len(rd.calls) - 1
		switch {
		case d.Index != nil:
			idx = *d.Index
		case idx < 0 || (d.ID != "" && d.ID != rd.calls[idx].id):
			idx = len(rd.calls)
		}
		acc := rd.byIndex[idx]
		if acc == nil {
			acc = &callAcc{}
			rd.byIndex[idx] = acc
			rd.calls = append(rd.calls, acc)
		}
		if d.ID != "" {
			acc.id = d.ID
		}
		if d.Type != "" {
			acc.typ = d.Type
		}
		acc.name += d.Function.Name
		wasDecided := acc.decided
		if !acc.decided && acc.name != "" {
			acc.decided = true
			if req.IsClientTool(acc.name) {
				acc.client = true
				acc.clientIndex = rd.clientCalls
				rd.clientCalls++
			}
		}
		switch {
		case acc.client && !wasDecided:
			// The first item the client gets of this call carries all of it so far.
			acc.args.WriteString(d.Function.Arguments)
			if acc.id == "" {
				acc.id = newCallID()
			}
			out = append(out, clientCallItem(acc))
			acc.args.Reset() // the client has it; the proxy does not run client calls
		case acc.client:
			o, err := rawjson.Parse(item)
			if err != nil {
				return nil, fmt.Errorf("%w: a tool call delta is not an object", ErrUpstreamProtocol)
			}
			o.Set("index", rawjson.Int(acc.clientIndex))
			out = append(out, o.Bytes())
		default:
			acc.args.WriteString(d.Function.Arguments)
		}
	}
	return out, nil
}

func clientCallItem(acc *callAcc) json.RawMessage {
	fn := rawjson.Object{}
	fn.Set("name", rawjson.String(acc.name))
	fn.Set("arguments", rawjson.String(acc.args.String()))
	o := rawjson.Object{}
	o.Set("index", rawjson.Int(acc.clientIndex))
	o.Set("id", rawjson.String(acc.id))
	typ := acc.typ
	if typ == "" {
		typ = "function"
	}
	o.Set("type", rawjson.String(typ))
	o.Set("function", fn.Bytes())
	return o.Bytes()
}

// finish ends the turn: the finish chunk (finish_reason "tool_calls" when the client has calls
// to run), then the summed usage when the client asked for it.
func (s *chatSSE) finish(clientCalls []toolCall, usage *usageSum, _ int) error {
	reason := s.rd.finish
	switch {
	case len(clientCalls) > 0:
		reason = "tool_calls"
	case reason == "" || reason == "tool_calls" || reason == "function_call":
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
	if err := s.send(c, choice, rawjson.Object{}, rawjson.String(reason)); err != nil {
		return err
	}
	if s.req.IncludeUsage && !usage.empty() {
		c.Set("choices", json.RawMessage("[]"))
		c.Set("usage", usage.json())
		return s.emit(c.Bytes())
	}
	return nil
}

// failure is the event that ends a stream whose turn failed after its first byte: the
// upstream's own error event, or the proxy's error.
func (s *chatSSE) failure(err error) (string, []byte) {
	var se *StreamError
	if errors.As(err, &se) {
		return "", se.Data
	}
	return "", streamFailure(err).body()
}

// end is what follows the last chunk of a stream that succeeded.
func (s *chatSSE) end() []byte { return []byte("data: [DONE]\n\n") }
