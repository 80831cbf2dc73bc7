package turn

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
)

// responsesSSE is the dialect of a streamed Responses turn (docs/spec.md §12, §16): typed events
// as the upstream sends them, the deltas of every round forwarded live, event and item types the
// proxy does not know included. The client gets one response.created and one
// response.in_progress (the first round's), the upstream's error events, one terminal event at
// the end carrying the turn's response, and never an event of a workspace call; output_index and
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
	// terminalEvent is that event's members but its response: the template of the client's.
	terminalEvent rawjson.Object
	rd            struct {
		index   map[int]int     // upstream output_index → the client's (-1: a workspace call's)
		owner   map[int]int     // upstream output_index of a function call → who runs it
		hidden  map[string]bool // the item ids of the workspace calls
		emitted bool            // the client got part of this round
		// failed is the round's error event, when the upstream sent one.
		failed *apierr.StreamError
		// pending is the output_index of a function call whose owner is not known yet (its name
		// came empty, or it is a parallel wrapper, decided by its arguments), -1 for none; held
		// are the events that arrived since, as they came, replayed once it is decided.
		pending int
		held    [][]byte
	}
	scratch rawjson.Object
}

func newResponsesSSE(req *ResponsesRequest, up Upstream, out Emitter) *responsesSSE {
	return &responsesSSE{responsesTurn: responsesTurn{req: req, up: up}, out: out}
}

func (s *responsesSSE) fetch(ctx context.Context, body Payload) ([]toolCall, json.RawMessage, roundInfo, error) {
	s.newRound()
	if err := s.stream(ctx, body); err != nil {
		if s.rd.emitted {
			return nil, nil, roundInfo{}, noRetry{err} // the client has part of this round
		}
		return nil, nil, roundInfo{}, err
	}
	return s.last.calls, s.last.top.Get("usage"), s.last.info(), nil
}

// newRound starts a round: nothing seen of it yet.
func (s *responsesSSE) newRound() {
	s.round++
	s.rd.index, s.rd.owner, s.rd.hidden, s.rd.emitted, s.last = map[int]int{}, map[int]int{}, map[string]bool{}, false, nil
	s.rd.pending, s.rd.held, s.rd.failed = -1, nil, nil
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
		if err == io.EOF || (err == nil && bytes.HasPrefix(data, []byte("[DONE]"))) {
			if s.rd.failed != nil {
				return s.rd.failed // the upstream's error event, then no terminal one
			}
			return fmt.Errorf("%w: %w", apierr.ErrUpstreamProtocol, errStreamEnded)
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
// What the proxy cannot read is not its own: the client gets it as it came.
func (s *responsesSSE) event(data []byte) error {
	ev, err := rawjson.ParseInto(s.scratch, data)
	if err != nil {
		return s.emitRaw(data)
	}
	s.scratch = ev
	typ := text(ev.Get("type"))
	switch typ {
	case "error":
		s.rd.failed = &apierr.StreamError{Data: append([]byte(nil), data...)} // forwarded: a response.failed follows
	case "response.created", "response.in_progress", "response.queued":
		if s.round > 1 {
			return nil // the client has the turn's
		}
		resp, err := rawjson.Parse(ev.Get("response"))
		if err != nil {
			return s.emit(typ, ev)
		}
		if s.first == "" {
			s.first = turnID(text(resp.Get("id")))
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
		if err := s.decideAll(rd); err != nil {
			return err
		}
		s.last, s.terminal = rd, typ
		ev.Del("response")
		s.terminalEvent = ev.Own()
		s.shown = len(rd.visible(s.output)) // the items the client will have been told of
		return nil
	}
	if s.rd.pending >= 0 {
		return s.hold(data, ev)
	}
	return s.itemEvent(typ, ev, data)
}

// itemEvent emits an event of the round's output (or any other event but the lifecycle ones),
// unless it belongs to a workspace call. A call's events are known by the item they carry, its
// item_id, or its output_index (whichever the server sends).
func (s *responsesSSE) itemEvent(typ string, ev rawjson.Object, data []byte) error {
	n, hasIndex := -1, false
	if raw := ev.Get("output_index"); raw != nil {
		if v, err := strconv.Atoi(string(raw)); err == nil && v >= 0 {
			n, hasIndex = v, true
		}
	}
	hidden := false
	if item := ev.Get("item"); item != nil {
		if o, err := rawjson.Parse(item); err == nil && text(o.Get("type")) == "function_call" {
			owner, known := s.rd.owner[n]
			if !known || !hasIndex {
				owner = s.ownerOf(o, typ == "response.output_item.done")
				if owner == undecided && hasIndex {
					s.rd.pending = n
					return s.hold(data, ev)
				}
				if hasIndex {
					s.rd.owner[n] = owner
				}
			}
			if owner == workspace {
				hidden = true
				s.rd.hidden[text(o.Get("id"))] = true
			}
		}
	}
	if s.rd.hidden[text(ev.Get("item_id"))] {
		hidden = true
	}
	if hasIndex {
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

// Owners of a function call item.
const (
	undecided = iota
	workspace
	client
)

// ownerOf is who runs a function call item: the workspace or the client, or undecided while its
// name is not known or it is a parallel wrapper whose arguments are not complete (done is set
// for the item of its output_item.done, which is whole).
func (s *responsesSSE) ownerOf(item rawjson.Object, done bool) int {
	name := text(item.Get("name"))
	if !done && (name == "" || isParallelWrapper(name, s.req.IsClientTool)) {
		return undecided
	}
	if responsesCall(item, s.req.IsClientTool).Client {
		return client
	}
	return workspace
}

// hold keeps an event while a call's owner is undecided; the call's output_item.done decides
// it, and the held events are replayed in order.
func (s *responsesSSE) hold(data []byte, ev rawjson.Object) error {
	s.rd.held = append(s.rd.held, append([]byte(nil), data...))
	if text(ev.Get("type")) != "response.output_item.done" {
		return nil
	}
	n, err := strconv.Atoi(string(ev.Get("output_index")))
	if err != nil || n != s.rd.pending {
		return nil
	}
	item, err := rawjson.Parse(ev.Get("item"))
	if err != nil {
		return nil
	}
	s.decide(n, text(item.Get("id")), s.ownerOf(item, true) == workspace)
	return s.replay()
}

// decide settles the pending call at upstream output_index n: hidden when it is the workspace's.
func (s *responsesSSE) decide(n int, id string, hidden bool) {
	s.rd.owner[n] = client
	if hidden {
		s.rd.owner[n] = workspace
		s.rd.hidden[id] = true
	}
	s.rd.pending = -1
}

// decideAll settles a call still pending when the round's terminal event came, by the item the
// terminal response holds, and replays the events held behind it.
func (s *responsesSSE) decideAll(rd *responseRound) error {
	for s.rd.pending >= 0 {
		n := s.rd.pending
		hidden, id := true, ""
		if n < len(rd.items) {
			hidden = rd.hidden[n]
			if o, err := rawjson.Parse(rd.items[n]); err == nil {
				id = text(o.Get("id"))
			}
		}
		s.decide(n, id, hidden)
		if err := s.replay(); err != nil {
			return err
		}
	}
	return nil
}

// replay sends the held events again through event, in order, until one of them holds the rest
// behind another undecided call.
func (s *responsesSSE) replay() error {
	held := s.rd.held
	s.rd.held = nil
	for i, data := range held {
		if err := s.event(data); err != nil {
			return err
		}
		if s.rd.pending >= 0 {
			s.rd.held = append(s.rd.held, held[i+1:]...)
			return nil
		}
	}
	return nil
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

func (s *responsesSSE) pause() error {
	s.dirty = true // the Emitter learns that the stream now waits for the proxy's tools
	return s.flush()
}

// finish records the turn and ends the stream with the terminal event of the last round,
// carrying the turn's response.
func (s *responsesSSE) finish(_ []toolCall, usage *usageSum, rounds int) error {
	if err := s.recordEnd(); err != nil {
		return err
	}
	ev := s.terminalEvent.Clone()
	ev.Set("response", s.last.answer(s.first, s.last.visible(s.output), usage, rounds, s.req))
	return s.emit(s.terminal, ev)
}

// Failure is the response.failed event that ends a stream whose turn failed after its first
// byte: the turn's response so far, with the error's code and message.
func (s *responsesSSE) Failure(err error) (string, []byte) {
	f := apierr.StreamFailure(err)
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

// End is what follows the terminal event: nothing (the Responses API sends no [DONE]).
func (s *responsesSSE) End() []byte { return nil }

// Keepalive is a comment line, which SSE parsers skip.
func (s *responsesSSE) Keepalive() []byte { return keepaliveComment }

// emit sends an event with the next sequence_number.
func (s *responsesSSE) emit(typ string, ev rawjson.Object) error {
	ev.Set("sequence_number", rawjson.Int(s.seq))
	s.seq++
	return s.send(typ, ev.Bytes())
}

// emitRaw sends data that is not a JSON object as it came.
func (s *responsesSSE) emitRaw(data []byte) error { return s.send("", data) }

func (s *responsesSSE) send(typ string, data []byte) error {
	s.dirty = true
	s.rd.emitted = true
	return s.out.Emit(typ, data)
}

func (s *responsesSSE) flush() error {
	if !s.dirty {
		return nil
	}
	s.dirty = false
	return s.out.Flush()
}
