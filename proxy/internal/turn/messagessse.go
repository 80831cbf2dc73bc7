package turn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// messagesSSE is the dialect of a streamed Messages turn (docs/spec.md §14, §16): Anthropic's
// typed events as the upstream sends them, the blocks of every round forwarded live. The client
// gets one message_start (the first round's), the content blocks of every round with `index`
// renumbered 0, 1, 2, … without gaps, never a workspace tool_use block or its deltas, one
// message_delta with the last round's stop_reason and the usage of every round, one
// message_stop; ping events, event types the proxy does not know and the upstream's error
// event pass as they came.
type messagesSSE struct {
	req *MessagesRequest
	up  Upstream
	streamOut
	maxArgs int // the bytes of a workspace call's input kept (workspace.Limits.ArgumentBytesMax)
	round   int
	first   string // the turn's id: the first round's message id
	model   string // the model the upstream named (for traces)
	shown   int    // the blocks the client got so far: the next client index
	// earlier are the usage objects of the completed rounds before this one.
	earlier usageSum
	cur     messagesRound
	scratch rawjson.Object
}

// messagesRound is what one streamed round keeps: its blocks as they accumulate, the index the
// client sees each under, its message_delta, and where the stream stands.
type messagesRound struct {
	reply  messageRound // the round's blocks and calls, once its message_delta came
	index  map[int]int  // upstream index → the client's (-1: a workspace call's)
	blocks map[int]*blockAcc
	order  []int // upstream indexes in the order their blocks started
	// startUsage and delta are the usage of message_start and the message_delta event, which
	// came named deltaName.
	startUsage json.RawMessage
	delta      rawjson.Object
	deltaName  string
	settled    bool // message_delta came: the round's blocks are known
	// kept counts the bytes of text, citations and server tools' input the round's blocks keep,
	// at most maxRoundText; cut: some were left out. clientCall: a tool_use block of the
	// client's came, so the round ends the turn and goes back to no upstream: only its calls
	// are kept.
	kept            int
	cut, clientCall bool
	// inPlace: the round held no workspace call, so its message_delta and what follows go to the
	// client where they came.
	inPlace bool
	stopped bool // message_stop came
}

// blockAcc accumulates one content block of a stream: its content_block_start's block and the
// deltas after it.
type blockAcc struct {
	start     rawjson.Object
	typ       string
	hidden    bool // a workspace tool_use block
	text      strings.Builder
	thinking  strings.Builder
	signature strings.Builder
	input     strings.Builder
	length    int // the bytes of input the deltas brought (input keeps at most maxArgs of them)
	citations []json.RawMessage
	// has records the delta kinds that came: their members replace the start block's.
	hasText, hasThinking, hasSignature, hasInput bool
}

// add applies one delta to block b. Of their text, citations and the input of other blocks than
// the workspace's calls (a server_tool_use's, an mcp_tool_use's) the round's blocks keep
// maxRoundText in all, and none once the round holds a call of the client's (it goes back to
// no upstream); of a workspace call's input maxArgs (past it the call is refused for its
// length). Thinking and its signature are kept whole: a thinking block goes
// back with its signature or not at all, and the request's max_tokens bounds it. Deltas of
// types the proxy does not know leave the block as it is.
func (d *messagesSSE) add(b *blockAcc, raw json.RawMessage) {
	o, err := rawjson.Parse(raw)
	if err != nil {
		return
	}
	r := &d.cur
	room := maxRoundText - r.kept
	if r.cut || r.clientCall {
		room = 0
	}
	switch text(o.Get("type")) {
	case "text_delta":
		b.hasText = true
		if s := text(o.Get("text")); len(s) <= room {
			b.text.WriteString(s)
			r.kept += len(s)
		} else {
			r.cut = true
		}
	case "thinking_delta":
		b.thinking.WriteString(text(o.Get("thinking")))
		b.hasThinking = true
	case "signature_delta":
		b.signature.WriteString(text(o.Get("signature")))
		b.hasSignature = true
	case "input_json_delta":
		s := text(o.Get("partial_json"))
		b.hasInput = true
		b.length += len(s)
		switch {
		case b.hidden:
			if b.length <= d.maxArgs {
				b.input.WriteString(s)
			}
		case len(s) <= room: // a server tool's input (server_tool_use, mcp_tool_use): the model's history
			b.input.WriteString(s)
			r.kept += len(s)
		default:
			r.cut = true
		}
	case "citations_delta":
		c := o.Get("citation")
		switch {
		case isNull(c):
		case len(c) <= room:
			b.citations = append(b.citations, append(json.RawMessage(nil), c...))
			r.kept += len(c)
		default:
			r.cut = true
		}
	}
}

// block is the whole block: the start's members with what the deltas made of them.
func (b *blockAcc) block() json.RawMessage {
	o := b.start.Clone()
	if b.hasText {
		o.Set("text", rawjson.String(b.start0("text")+b.text.String()))
	}
	if b.hasThinking {
		o.Set("thinking", rawjson.String(b.start0("thinking")+b.thinking.String()))
	}
	if b.hasSignature {
		o.Set("signature", rawjson.String(b.start0("signature")+b.signature.String()))
	}
	if b.hasInput {
		in := strings.TrimSpace(b.input.String())
		if in == "" || !json.Valid([]byte(in)) {
			in = "{}" // a cut-off call: the upstream refuses input that is not an object
		}
		o.Set("input", json.RawMessage(in))
	}
	if len(b.citations) > 0 {
		list, _ := rawjson.Split(o.Get("citations"))
		o.Set("citations", rawjson.AppendArray(nil, append(list, b.citations...)))
	}
	return o.Bytes()
}

// start0 is the text a start block's member already held (servers send "" and the deltas).
func (b *blockAcc) start0(key string) string { return text(b.start.Get(key)) }

func newMessagesSSE(req *MessagesRequest, up Upstream, maxArgs int, out Emitter) *messagesSSE {
	return &messagesSSE{req: req, up: up, maxArgs: maxArgs, streamOut: streamOut{out: out}}
}

func (d *messagesSSE) request(withWorkspaceTools bool) Payload { return d.req.Body(withWorkspaceTools) }

func (d *messagesSSE) fetch(ctx context.Context, body Payload) ([]toolCall, usage, roundInfo, error) {
	d.round++
	d.cur = messagesRound{index: map[int]int{}, blocks: map[int]*blockAcc{}}
	if err := d.attempt(func() error { return d.stream(ctx, body) }); err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	info := roundInfo{model: d.model, id: d.first, untrusted: d.cur.reply.untrusted}
	if sr := d.stopReasonText(); sr != "" {
		info.finishReasons = []string{sr}
	}
	return d.cur.reply.calls, messagesTokens(d.roundUsage()), info, nil
}

// stream reads one round's events up to its message_stop (or the end of the stream after its
// message_delta).
func (d *messagesSSE) stream(ctx context.Context, body Payload) error {
	_, err := readNamedEvents(ctx, d.up, body, d.flush, func(name string, data []byte) (bool, error) {
		err := d.event(name, data)
		return d.cur.stopped, err
	})
	if err == nil && !d.cur.settled {
		return errStreamCut
	}
	return err
}

// event handles one upstream event (named name): it keeps what the turn needs and emits what
// the client gets, under the event's name. JSON the proxy cannot read as an event is not its
// own: the client gets it as it came; data that is not JSON ends the turn (notJSON).
func (d *messagesSSE) event(name string, data []byte) error {
	ev, err := rawjson.ParseInto(d.scratch, data)
	if err != nil {
		if err := notJSON(data); err != nil {
			return err
		}
		return d.send(name, data)
	}
	d.scratch = ev
	typ := text(ev.Get("type"))
	switch typ {
	case "error":
		return &apierr.StreamError{Data: append([]byte(nil), data...)}
	case "message_start":
		msg, err := rawjson.Parse(ev.Get("message"))
		if err != nil {
			return d.send(name, data)
		}
		d.cur.startUsage = append(json.RawMessage(nil), msg.Get("usage")...)
		if d.round > 1 {
			return nil // the client has the turn's
		}
		d.model = text(msg.Get("model"))
		if d.first = text(msg.Get("id")); d.first == "" {
			d.first = messageID("")
			msg.Set("id", rawjson.String(d.first))
			ev.Set("message", msg.Bytes())
			return d.send(name, ev.Bytes())
		}
		return d.send(name, data)
	case "content_block_start", "content_block_delta", "content_block_stop":
		return d.blockEvent(name, typ, ev, data)
	case "message_delta":
		return d.messageDelta(name, ev, data)
	case "message_stop":
		d.cur.stopped = true
		if d.cur.inPlace {
			return d.send(name, data)
		}
		return nil // the turn's goes out at its end
	}
	if typ == "ping" {
		d.dirty = true // not part of the round: a retry may repeat it
		return d.out.Emit(name, data)
	}
	return d.send(name, data) // the event types the proxy does not know
}

// blockEvent emits a content block's event under the client's index, unless it belongs to a
// workspace tool_use block, and accumulates the block.
func (d *messagesSSE) blockEvent(name, typ string, ev rawjson.Object, data []byte) error {
	n, err := strconv.Atoi(string(ev.Get("index")))
	if err != nil {
		return d.send(name, data) // not the proxy's to place
	}
	switch typ {
	case "content_block_start":
		cb, err := rawjson.Parse(ev.Get("content_block"))
		if err != nil {
			cb = rawjson.Object{}
		}
		b := &blockAcc{start: cb.Own(), typ: text(cb.Get("type"))}
		if b.typ == "tool_use" {
			b.hidden = !d.req.IsClientTool(text(cb.Get("name")))
			d.cur.clientCall = d.cur.clientCall || !b.hidden
		}
		if _, seen := d.cur.blocks[n]; !seen {
			d.cur.order = append(d.cur.order, n)
		}
		d.cur.blocks[n] = b
		ci := -1
		if !b.hidden {
			ci = d.shown
			d.shown++
		}
		d.cur.index[n] = ci
	case "content_block_delta":
		if b := d.cur.blocks[n]; b != nil {
			d.add(b, ev.Get("delta"))
		}
	}
	ci, ok := d.cur.index[n]
	switch {
	case !ok:
		return d.send(name, data) // a block that never started: as it came
	case ci < 0:
		return nil
	case ci == n:
		return d.send(name, data)
	}
	ev.Set("index", rawjson.Int(ci))
	return d.send(name, ev.Bytes())
}

// messageDelta settles the round: its blocks are known. A round without a workspace call is the
// turn's last: its message_delta goes to the client in place (with the usage of every round
// when there were several); the others are held for the end of the turn.
func (d *messagesSSE) messageDelta(name string, ev rawjson.Object, data []byte) error {
	d.cur.delta, d.cur.deltaName = ev.Own(), name
	d.settle()
	if d.cur.reply.hasHidden() {
		return nil
	}
	d.cur.inPlace = true
	if d.round == 1 {
		return d.send(name, data)
	}
	out := d.cur.delta.Clone()
	if u := d.earlier.with(d.roundUsage()); u != nil {
		out.Set("usage", u)
	}
	return d.send(name, out.Bytes())
}

// settle builds the round's blocks and calls from what accumulated, in the order the blocks
// started (a workspace call without an id gets one).
func (d *messagesSSE) settle() {
	if d.cur.settled {
		return
	}
	d.cur.settled = true
	for _, n := range d.cur.order {
		b := d.cur.blocks[n]
		d.cur.reply.add(b.block(), func(string) bool { return !b.hidden })
		if b.hidden && b.length > b.input.Len() {
			d.cur.reply.calls[len(d.cur.reply.calls)-1].Length = b.length // its input cut off
		}
	}
}

// roundUsage is the round's usage: message_start's, with each count message_delta reports (a
// whole-message total) in its place.
func (d *messagesSSE) roundUsage() json.RawMessage {
	var du json.RawMessage
	if d.cur.delta.Keys != nil {
		du = d.cur.delta.Get("usage")
	}
	start, err := rawjson.Parse(d.cur.startUsage)
	if err != nil {
		if isNull(du) {
			return nil
		}
		return du
	}
	delta, err := rawjson.Parse(du)
	if err != nil {
		return d.cur.startUsage
	}
	for i, k := range delta.Keys {
		if !isNull(delta.Vals[i]) {
			start.Set(k, delta.Vals[i])
		}
	}
	return start.Bytes()
}

// stopReasonText is the round's stop_reason.
func (d *messagesSSE) stopReasonText() string {
	if d.cur.delta.Keys == nil {
		return ""
	}
	delta, _ := rawjson.Parse(d.cur.delta.Get("delta"))
	return text(delta.Get("stop_reason"))
}

func (d *messagesSSE) extend(calls []toolCall, results []tools.Result) {
	d.req.appendRound(d.cur.reply.sentBack(), calls, results)
	d.earlier.keep(d.roundUsage())
}

// finish ends the stream: the last round's message_delta, held because the round also called
// workspace tools, with the stop_reason the client's calls leave and the usage of every round,
// then message_stop. A round without workspace calls sent its own in place.
func (d *messagesSSE) finish(clientCalls []toolCall, usage *usageSum, rounds int) error {
	if d.cur.inPlace {
		return nil
	}
	ev := d.cur.delta.Clone()
	if delta, err := rawjson.Parse(ev.Get("delta")); err == nil {
		if sr := delta.Get("stop_reason"); sr != nil {
			delta.Set("stop_reason", stopReason(sr, &d.cur.reply, clientCalls))
			ev.Set("delta", delta.Bytes())
		}
	}
	if rounds > 1 && !usage.empty() {
		ev.Set("usage", usage.json())
	}
	if err := d.send(d.cur.deltaName, ev.Bytes()); err != nil {
		return err
	}
	return d.send("message_stop", []byte(`{"type":"message_stop"}`))
}

// Failure is the error event that ends a stream whose turn failed after its first byte: the
// upstream's own error event or error body as it came, else the proxy's error in Anthropic's
// shape.
func (d *messagesSSE) Failure(err error) (string, []byte) {
	var se *apierr.StreamError
	if errors.As(err, &se) {
		return "error", se.Data
	}
	var ue *apierr.UpstreamError
	if errors.As(err, &ue) && isMessagesError(ue.Body) {
		return "error", compactJSON(ue.Body)
	}
	return "error", MessagesError(apierr.StreamFailure(err))
}

// compactJSON is a JSON text on one line (an event's data), or b as it is.
func compactJSON(b []byte) []byte {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return b
	}
	return out.Bytes()
}

// End is what follows the message_stop: nothing (the Messages API sends no [DONE]).
func (d *messagesSSE) End() []byte { return nil }

// Keepalive is a ping event, as the Messages API sends them.
func (d *messagesSSE) Keepalive() []byte { return messagesPing }

var messagesPing = []byte("event: ping\ndata: {\"type\": \"ping\"}\n\n")

func (d *messagesSSE) send(typ string, data []byte) error { return d.sendEvent(typ, data) }
