package turn

import (
	"context"
	"strconv"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// responsesSSE is the dialect of a streamed Responses turn (docs/spec.md §12, §16): typed events
// as the upstream sends them, the deltas of every round forwarded live, event and item types the
// proxy does not know included. The client gets one response.created and one
// response.in_progress (the first round's), the upstream's error events, one terminal event at
// the end carrying the turn's response, and never an event of a workspace call; output_index and
// sequence_number are renumbered so that the rounds read as one gap-free stream.
type responsesSSE struct {
	responsesTurn // last: the last round's terminal response
	streamOut
	round int
	seq   int // the next sequence_number the client gets
	shown int // the visible output items so far: the next client output_index
	// template is the first response.created's response: the base of a response.failed the
	// proxy makes.
	template rawjson.Object
	terminal string // the last round's terminal event type
	// terminalEvent is that event's members but its response: the template of the client's.
	terminalEvent rawjson.Object
	cur           struct {
		index  map[int]int     // upstream output_index → the client's (-1: a workspace call's)
		owner  map[int]int     // upstream output_index of a function call → who runs it
		hidden map[string]bool // the item ids of the workspace calls
		// failed is the round's error event, when the upstream sent one.
		failed *apierr.StreamError
		// pending is the output_index of a function call whose owner is not known yet (its name
		// came empty, or it is a parallel wrapper, decided by its arguments), -1 for none; held
		// are the events that arrived since, as they came, replayed once it is decided, and
		// heldBytes their size, at most maxRoundText: past it the call is the client's.
		pending   int
		held      [][]byte
		heldBytes int
	}
	scratch rawjson.Object
}

func newResponsesSSE(req *ResponsesRequest, up Upstream, out Emitter) *responsesSSE {
	return &responsesSSE{responsesTurn: responsesTurn{req: req, up: up}, streamOut: streamOut{out: out}}
}

func (d *responsesSSE) fetch(ctx context.Context, body Payload) ([]toolCall, usage, roundInfo, error) {
	d.newRound()
	if err := d.attempt(func() error { return d.stream(ctx, body) }); err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	return d.last.calls, responsesTokens(d.last.top.Get("usage")), d.last.info(), nil
}

// newRound starts a round: nothing seen of it yet.
func (d *responsesSSE) newRound() {
	d.round++
	d.cur.index, d.cur.owner, d.cur.hidden, d.last = map[int]int{}, map[int]int{}, map[string]bool{}, nil
	d.cur.pending, d.cur.held, d.cur.heldBytes, d.cur.failed = -1, nil, 0, nil
}

// stream reads one round's events up to its terminal event.
func (d *responsesSSE) stream(ctx context.Context, body Payload) error {
	_, err := readEvents(ctx, d.up, body, d.flush, func(data []byte) (bool, error) {
		err := d.event(data)
		return d.last != nil, err
	})
	switch {
	case err != nil || d.last != nil:
		return err
	case d.cur.failed != nil:
		return d.cur.failed // the upstream's error event, then no terminal one
	}
	return errStreamCut
}

// event handles one upstream event: it keeps what the turn needs and emits what the client gets.
// JSON the proxy cannot read as an event is not its own: the client gets it as it came; data
// that is not JSON ends the turn (notJSON).
func (d *responsesSSE) event(data []byte) error {
	ev, err := rawjson.ParseInto(d.scratch, data)
	if err != nil {
		if err := notJSON(data); err != nil {
			return err
		}
		return d.emitRaw(data)
	}
	d.scratch = ev
	typ := text(ev.Get("type"))
	switch typ {
	case "error":
		d.cur.failed = &apierr.StreamError{Data: append([]byte(nil), data...)} // forwarded: a response.failed follows
	case "response.created", "response.in_progress", "response.queued":
		if d.round > 1 {
			return nil // the client has the turn's
		}
		resp, err := rawjson.Parse(ev.Get("response"))
		if err != nil {
			return d.emit(typ, ev)
		}
		if d.first == "" {
			d.first = turnID(text(resp.Get("id")))
			d.template = resp.Own()
		}
		resp.Set("id", rawjson.String(d.first))
		d.clientPrevious(&resp)
		ev.Set("response", resp.Bytes())
		return d.emit(typ, ev)
	case "response.completed", "response.incomplete", "response.failed":
		return d.terminalOf(typ, ev)
	}
	if d.cur.pending >= 0 {
		return d.hold(data, ev)
	}
	return d.itemEvent(typ, ev, data)
}

// terminalOf keeps the round's terminal event (of type typ): its response is the round's, the
// rest of it the template of the client's terminal event. The calls still undecided are decided
// by that response, and the events held behind them go out first.
func (d *responsesSSE) terminalOf(typ string, ev rawjson.Object) error {
	rr, err := parseResponse(append([]byte(nil), ev.Get("response")...), d.req) // kept past the reader's buffer
	if err != nil {
		return err
	}
	ev.Del("response")
	d.terminalEvent = ev.Own() // before the held events are replayed through the same scratch
	if d.first == "" {
		d.first = turnID(rr.id)
	}
	for n, owner := range d.cur.owner {
		if owner == client {
			rr.toClient(n) // the client saw it as its own
		}
	}
	if err := d.decideAll(rr); err != nil {
		return err
	}
	d.last, d.terminal = rr, typ
	d.shown = len(rr.visible(d.output)) // the items the client will have been told of
	return nil
}

// itemEvent emits an event of the round's output (or any other event but the lifecycle ones),
// unless it belongs to a workspace call. A call's events are known by the item they carry, its
// item_id, or its output_index (whichever the server sends).
func (d *responsesSSE) itemEvent(typ string, ev rawjson.Object, data []byte) error {
	n, hasIndex := -1, false
	if raw := ev.Get("output_index"); raw != nil {
		if v, err := strconv.Atoi(string(raw)); err == nil && v >= 0 {
			n, hasIndex = v, true
		}
	}
	hidden := false
	if item := ev.Get("item"); item != nil {
		if o, err := rawjson.Parse(item); err == nil && text(o.Get("type")) == "function_call" {
			owner, known := d.cur.owner[n]
			if !known || !hasIndex {
				owner = d.ownerOf(o, typ == "response.output_item.done")
				if owner == undecided && hasIndex {
					d.cur.pending = n
					return d.hold(data, ev)
				}
				if hasIndex {
					d.cur.owner[n] = owner
				}
			}
			if owner == workspaceOwner {
				hidden = true
				d.hideItem(text(o.Get("id")))
			}
		}
	}
	if id := rawName(ev.Get("item_id")); id != nil && d.cur.hidden[string(id)] {
		hidden = true
	}
	if hasIndex {
		ci, ok := d.cur.index[n]
		if !ok {
			ci = -1
			if !hidden {
				ci = d.shown
				d.shown++
			}
			d.cur.index[n] = ci
		}
		if ci < 0 {
			return nil
		}
		ev.Set("output_index", rawjson.Int(ci))
	}
	if hidden {
		return nil
	}
	return d.emit(typ, ev)
}

// Owners of a function call item.
const (
	undecided = iota
	workspaceOwner
	client
)

// ownerOf is who runs a function call item: the workspace or the client, or undecided while its
// name is not known or it is a parallel wrapper whose arguments are not complete (done is set
// for the item of its output_item.done, which is whole).
func (d *responsesSSE) ownerOf(item rawjson.Object, done bool) int {
	name := text(item.Get("name"))
	if !done && (name == "" || isParallelWrapper(name, d.req.IsClientTool)) {
		return undecided
	}
	if responsesCall(item, d.req.IsClientTool).Client {
		return client
	}
	return workspaceOwner
}

// hold keeps an event while a call's owner is undecided; the call's output_item.done decides
// it, and the held events are replayed in order. Past maxRoundText held, the call is the
// client's (memory stays flat, docs/spec.md §7): its events go out at once, and the round's
// terminal response does not make it the workspace's.
func (d *responsesSSE) hold(data []byte, ev rawjson.Object) error {
	d.cur.held = append(d.cur.held, append([]byte(nil), data...))
	if d.cur.heldBytes += len(data); d.cur.heldBytes > maxRoundText {
		d.decide(d.cur.pending, "", false)
		return d.replay()
	}
	if text(ev.Get("type")) != "response.output_item.done" {
		return nil
	}
	n, err := strconv.Atoi(string(ev.Get("output_index")))
	if err != nil || n != d.cur.pending {
		return nil
	}
	item, err := rawjson.Parse(ev.Get("item"))
	if err != nil {
		return nil
	}
	d.decide(n, text(item.Get("id")), d.ownerOf(item, true) == workspaceOwner)
	return d.replay()
}

// decide settles the pending call at upstream output_index n: hidden when it is the workspace's.
func (d *responsesSSE) decide(n int, id string, hidden bool) {
	d.cur.owner[n] = client
	if hidden {
		d.cur.owner[n] = workspaceOwner
		d.hideItem(id)
	}
	d.cur.pending = -1
}

// decideAll settles a call still pending when the round's terminal event came, by the item the
// terminal response holds, and replays the events held behind it.
func (d *responsesSSE) decideAll(rr *responseRound) error {
	for d.cur.pending >= 0 {
		n := d.cur.pending
		hidden, id := true, ""
		if n < len(rr.items) {
			hidden = rr.hidden[n]
			if o, err := rawjson.Parse(rr.items[n]); err == nil {
				id = text(o.Get("id"))
			}
		}
		d.decide(n, id, hidden)
		if err := d.replay(); err != nil {
			return err
		}
	}
	return nil
}

// replay sends the held events again through event, in order, until one of them holds the rest
// behind another undecided call.
func (d *responsesSSE) replay() error {
	held := d.cur.held
	d.cur.held, d.cur.heldBytes = nil, 0
	for i, data := range held {
		if err := d.event(data); err != nil {
			return err
		}
		if d.cur.pending >= 0 {
			for _, rest := range held[i+1:] {
				d.cur.held, d.cur.heldBytes = append(d.cur.held, rest), d.cur.heldBytes+len(rest)
			}
			return nil
		}
	}
	return nil
}

// clientPrevious shows the client its own previous_response_id in a response object, not the
// one the proxy sent in its place.
func (d *responsesSSE) clientPrevious(resp *rawjson.Object) {
	if d.req.Continued {
		d.req.showClientPrevious(resp)
	}
}

// finish records the turn and ends the stream with the terminal event of the last round,
// carrying the turn's response.
func (d *responsesSSE) finish(_ []toolCall, usage *usageSum, rounds int) error {
	if err := d.recordEnd(); err != nil {
		return err
	}
	ev := d.terminalEvent.Clone()
	ev.Set("response", d.last.answer(d.first, d.last.visible(d.output), usage, rounds, d.req))
	return d.emit(d.terminal, ev)
}

// Failure is the response.failed event that ends a stream whose turn failed after its first
// byte: the turn's response so far, with the error's code and message.
func (d *responsesSSE) Failure(err error) (string, []byte) {
	f := apierr.StreamFailure(err)
	code := f.Code
	if code == "" {
		code = "server_error"
	}
	resp := d.template.Clone()
	if resp.Keys == nil {
		resp.Set("object", rawjson.String("response"))
	}
	resp.Set("id", rawjson.String(d.first))
	resp.Set("status", rawjson.String("failed"))
	e := rawjson.Object{}
	e.Set("code", rawjson.String(code))
	e.Set("message", rawjson.String(f.Message))
	resp.Set("error", e.Bytes())
	resp.Set("output", rawjson.AppendArray(nil, d.output))
	ev := rawjson.Object{}
	ev.Set("type", rawjson.String("response.failed"))
	ev.Set("sequence_number", rawjson.Int(d.seq))
	ev.Set("response", resp.Bytes())
	return "response.failed", ev.Bytes()
}

// End is what follows the terminal event: nothing (the Responses API sends no [DONE]).
func (d *responsesSSE) End() []byte { return nil }

// Keepalive is a comment line, which SSE parsers skip.
func (d *responsesSSE) Keepalive() []byte { return keepaliveComment }

// emit sends an event with the next sequence_number.
func (d *responsesSSE) emit(typ string, ev rawjson.Object) error {
	ev.Set("sequence_number", rawjson.Int(d.seq))
	d.seq++
	return d.send(typ, ev.Bytes())
}

// emitRaw sends data that is not a JSON object as it came.
func (d *responsesSSE) emitRaw(data []byte) error { return d.send("", data) }

func (d *responsesSSE) send(typ string, data []byte) error { return d.sendEvent(typ, data) }

// hideItem keeps id, a workspace call's item id, for the events that name it by item_id; an item
// without an id is known by its output_index alone.
func (d *responsesSSE) hideItem(id string) {
	if id != "" {
		d.cur.hidden[id] = true
	}
}
