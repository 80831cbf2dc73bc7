package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
)

// responsesSSE is the dialect of a streamed Responses turn (SPEC §12): typed events as the
// upstream sends them, the deltas of every round forwarded live. The client gets one
// response.created and one response.in_progress (the first round's), one terminal event at the
// end carrying the turn's response, and never an event of a workspace call; output_index and
// sequence_number are renumbered so that the rounds read as one gap-free stream.
type responsesSSE struct {
	responsesTurn // last: the last round's terminal response
	out           Emitter
	dirty         bool
	round         int
	seq           int // the next sequence_number the client gets
	shown         int // the visible output items so far: the next client output_index
	// template is the first response.created's response: the base of a response.failed the
	// proxy makes.
	template rawjson.Object
	terminal string // the last round's terminal event type
	rd       struct {
		index   map[int]int     // upstream output_index → the client's (-1: a workspace call's)
		hidden  map[string]bool // the item ids of the workspace calls
		emitted bool            // the client got part of this round
	}
	scratch rawjson.Object
}

func newResponsesSSE(req *ResponsesRequest, up Upstream, out Emitter, record recordTurn) *responsesSSE {
	return &responsesSSE{responsesTurn: responsesTurn{req: req, up: up, record: record}, out: out}
}

func (s *responsesSSE) fetch(ctx context.Context, body Payload) ([]toolCall, json.RawMessage, roundInfo, error) {
	s.round++
	s.rd.index, s.rd.hidden, s.rd.emitted, s.last = map[int]int{}, map[string]bool{}, false, nil
	if err := s.stream(ctx, body); err != nil {
		if s.rd.emitted {
			return nil, nil, roundInfo{}, noRetry{err} // the client has part of this round
		}
		return nil, nil, roundInfo{}, err
	}
	return s.last.calls, s.last.top.Get("usage"), s.last.info(), nil
}

// stream reads one round's events up to its terminal event.
func (s *responsesSSE) stream(ctx context.Context, body Payload) error {
	resp, err := s.up.Post(ctx, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	events := sse.NewReader(resp.Body)
	for s.last == nil {
		if s.dirty && !events.EventBuffered() {
			if err := s.flush(); err != nil {
				return err
			}
		}
		data, err := events.Next()
		if err == io.EOF || (err == nil && string(data) == "[DONE]") {
			return fmt.Errorf("%w: %w", ErrUpstreamProtocol, errStreamEnded)
		}
		if err != nil {
			return readError(ctx, err)
		}
		if err := s.event(data); err != nil {
			return err
		}
	}
	return nil
}

// event handles one upstream event: it keeps what the turn needs and emits what the client gets.
func (s *responsesSSE) event(data []byte) error {
	ev, err := rawjson.ParseInto(s.scratch, data)
	if err != nil {
		return fmt.Errorf("%w: an event is not a JSON object", ErrUpstreamProtocol)
	}
	s.scratch = ev
	typ, _ := rawjson.Unquote(ev.Get("type"))
	switch typ {
	case "error":
		return &StreamError{Data: append([]byte(nil), data...)}
	case "response.created", "response.in_progress", "response.queued":
		if s.round > 1 {
			return nil // the client has the turn's
		}
		resp, err := rawjson.Parse(ev.Get("response"))
		if err != nil {
			return fmt.Errorf("%w: %s has no response object", ErrUpstreamProtocol, typ)
		}
		if s.first == "" {
			id, _ := rawjson.Unquote(resp.Get("id"))
			s.first = turnID(id)
			s.template = resp.Own()
		}
		resp.Set("id", rawjson.String(s.first))
		s.clientPrevious(&resp)
		ev.Set("response", resp.Bytes())
		return s.emit(typ, ev)
	case "response.completed", "response.incomplete", "response.failed":
		rd, err := parseResponse(append([]byte(nil), ev.Get("response")...), s.req) // kept past the reader's buffer
		if err != nil {
			return err
		}
		if s.first == "" {
			s.first = turnID(rd.id)
		}
		s.last, s.terminal = rd, typ
		s.shown = len(rd.visible(s.output)) // the items the client will have been told of
		return nil
	}
	// A workspace call's events are known by the item they carry, its item_id, or its
	// output_index (whichever the server sends).
	hidden := false
	if item := ev.Get("item"); item != nil {
		if id, ok := s.workspaceCall(item); ok {
			hidden = true
			s.rd.hidden[id] = true
		}
	}
	if id, ok := rawjson.Unquote(ev.Get("item_id")); ok && s.rd.hidden[id] {
		hidden = true
	}
	if raw := ev.Get("output_index"); raw != nil {
		n, err := strconv.Atoi(string(raw))
		if err != nil {
			return fmt.Errorf("%w: output_index is not an integer", ErrUpstreamProtocol)
		}
		ci, ok := s.rd.index[n]
		if !ok {
			ci = -1
			if !hidden {
				ci = s.shown
				s.shown++
			}
			s.rd.index[n] = ci
		}
		if ci < 0 {
			return nil
		}
		ev.Set("output_index", rawjson.Int(ci))
	}
	if hidden {
		return nil
	}
	return s.emit(typ, ev)
}

// workspaceCall reports whether an output item is a call of a workspace tool, and its id.
func (s *responsesSSE) workspaceCall(item json.RawMessage) (string, bool) {
	o, err := rawjson.Parse(item)
	if err != nil {
		return "", false
	}
	typ, _ := rawjson.Unquote(o.Get("type"))
	name, _ := rawjson.Unquote(o.Get("name"))
	id, _ := rawjson.Unquote(o.Get("id"))
	return id, typ == "function_call" && !s.req.IsClientTool(name)
}

// clientPrevious shows the client its own previous_response_id in a response object, not the
// one the proxy sent in its place.
func (s *responsesSSE) clientPrevious(resp *rawjson.Object) {
	if !s.req.Continued || resp.Index("previous_response_id") < 0 {
		return
	}
	prev := json.RawMessage("null")
	if s.req.ClientPrevious != "" {
		prev = rawjson.String(s.req.ClientPrevious)
	}
	resp.Set("previous_response_id", prev)
}

func (s *responsesSSE) pause() error { return s.flush() }

// finish records the turn and ends the stream with the terminal event of the last round,
// carrying the turn's response.
func (s *responsesSSE) finish(_ []toolCall, usage *usageSum, rounds int) error {
	if err := s.recordEnd(); err != nil {
		return err
	}
	ev := rawjson.Object{}
	ev.Set("type", rawjson.String(s.terminal))
	ev.Set("response", s.last.answer(s.first, s.last.visible(s.output), usage, rounds, s.req))
	return s.emit(s.terminal, ev)
}

// failure is the response.failed event that ends a stream whose turn failed after its first
// byte: the turn's response so far, with the error's code and message.
func (s *responsesSSE) failure(err error) (string, []byte) {
	f := streamFailure(err)
	code := f.Code
	if code == "" {
		code = "server_error"
	}
	resp := s.template.Clone()
	if resp.Keys == nil {
		resp.Set("object", rawjson.String("response"))
	}
	resp.Set("id", rawjson.String(s.first))
	resp.Set("status", rawjson.String("failed"))
	e := rawjson.Object{}
	e.Set("code", rawjson.String(code))
	e.Set("message", rawjson.String(f.Message))
	resp.Set("error", e.Bytes())
	resp.Set("output", rawjson.AppendArray(nil, s.output))
	ev := rawjson.Object{}
	ev.Set("type", rawjson.String("response.failed"))
	ev.Set("sequence_number", rawjson.Int(s.seq))
	ev.Set("response", resp.Bytes())
	return "response.failed", ev.Bytes()
}

// end is what follows the terminal event: nothing (the Responses API sends no [DONE]).
func (s *responsesSSE) end() []byte { return nil }

// emit sends an event with the next sequence_number.
func (s *responsesSSE) emit(typ string, ev rawjson.Object) error {
	ev.Set("sequence_number", rawjson.Int(s.seq))
	s.seq++
	s.dirty = true
	s.rd.emitted = true
	return s.out.Emit(typ, ev.Bytes())
}

func (s *responsesSSE) flush() error {
	if !s.dirty {
		return nil
	}
	s.dirty = false
	return s.out.Flush()
}
