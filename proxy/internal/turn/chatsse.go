package turn

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// chatSSE is the dialect of a streamed chat completions turn (docs/spec.md §7, §16): chunks go
// to the client as the upstream sent them, in every round, but for what the proxy owns: the
// workspace's tool calls are never emitted and the client's are re-indexed from 0; the client
// gets one role delta at the start, one finish_reason at the end, the first id the upstream gave
// on every chunk, and the turn's usage once, where the last round's upstream put it.
type chatSSE struct {
	req *ChatRequest
	up  Upstream
	streamOut
	log     *slog.Logger // nil logs nothing
	thread  string
	maxArgs int    // the bytes of a workspace call's arguments kept (workspace.Limits.ArgumentBytesMax)
	id      string // the first id the upstream gave (or one made up)
	model   string // the model the upstream named (for traces)
	emitted bool   // the role delta went out
	// last is the first chunk with choices, then the last chunk with a finish_reason: the
	// template of the finish chunk.
	last rawjson.Object
	// earlier are the usage objects of the completed rounds before this one.
	earlier usageSum
	// scratch holds the member lists chunks are parsed into, reused from chunk to chunk.
	scratch struct{ chunk, choice, delta rawjson.Object }
	cur     chatRound
}

func newChatSSE(req *ChatRequest, up Upstream, log *slog.Logger, thread string, maxArgs int, out Emitter) *chatSSE {
	return &chatSSE{req: req, up: up, streamOut: streamOut{out: out}, log: log, thread: thread, maxArgs: maxArgs, cur: newChatRound(maxArgs)}
}

func (d *chatSSE) request(withWorkspaceTools bool) Payload { return d.req.Body(withWorkspaceTools) }

func (d *chatSSE) fetch(ctx context.Context, body Payload) ([]toolCall, usage, roundInfo, error) {
	d.cur = newChatRound(d.maxArgs)
	if err := d.attempt(func() error { return d.round(ctx, body) }); err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	calls := make([]toolCall, len(d.cur.calls))
	for i, c := range d.cur.calls {
		id := c.id
		if id == "" && !c.client {
			id = newCallID() // some servers send none; the round sent back needs one
		}
		calls[i] = toolCall{ID: id, Name: c.name, Arguments: c.args.String(), Client: c.client, shown: c.client}
		if c.length > c.args.Len() {
			calls[i].Length = c.length
		}
	}
	info := roundInfo{model: d.model, id: d.id}
	if d.cur.finish != "" {
		info.finishReasons = []string{d.cur.finish}
	}
	calls, _ = unwrapParallel(calls, d.req.IsClientTool)
	return calls, chatTokens(d.cur.usage), info, nil
}

func (d *chatSSE) extend(calls []toolCall, results []tools.Result) {
	if d.cur.truncated && d.log != nil {
		d.log.Warn("round text over the cap sent back truncated", slog.String("thread", d.thread), slog.Int("cap", maxRoundText))
	}
	var content json.RawMessage
	if d.cur.content.Len() > 0 {
		content = rawjson.String(d.cur.content.String())
	}
	var reasoning rawjson.Object
	for _, key := range reasoningKeys {
		if b := d.cur.reasoning[key]; b != nil && b.Len() > 0 {
			reasoning.Set(key, rawjson.String(b.String()))
		}
	}
	d.req.appendRound(content, reasoning, calls, results)
	d.earlier.keep(d.cur.usage)
}

// round streams one upstream call to its end.
func (d *chatSSE) round(ctx context.Context, body Payload) error {
	done, err := readEvents(ctx, d.up, body, d.flush, func(data []byte) (bool, error) { return false, d.chunk(data) })
	if err == nil && !done && d.cur.finish == "" {
		return errStreamCut
	}
	return err
}

// chunk handles one upstream chunk: it keeps what the round needs and emits what the client
// gets. JSON it cannot read as a chunk is not the proxy's: the client gets it as it came; data
// that is not JSON ends the turn (notJSON).
func (d *chatSSE) chunk(data []byte) error {
	k, ok := d.parse(data)
	if !ok {
		if err := notJSON(data); err != nil {
			return err
		}
		return d.emit(data)
	}
	if k.c.Has("error") {
		return &apierr.StreamError{Data: append([]byte(nil), data...)}
	}
	if d.id == "" {
		d.id = text(k.c.Get("id"))
	}
	if d.model == "" {
		d.model = text(k.c.Get("model"))
	}
	if k.hasUsage {
		d.cur.usage = append([]byte(nil), k.c.Get("usage")...) // kept past the reader's buffer
	}
	fr := text(k.choice.Get("finish_reason"))
	usageOnly := k.hasUsage && fr == "" && (k.n == 0 || (emptyDelta(k.delta, "role") && !carriesMore(k.choice)))
	switch {
	case usageOnly && !d.req.IncludeUsage:
		return nil // the proxy asked for it (to count the turn), not the client
	case usageOnly && !d.cur.inPlace:
		d.cur.usageChunk = k.c.Own() // the usage of its own: for the end of the turn
		return nil
	case k.n == 0 && !usageOnly:
		return nil // nothing for the client (what some servers send first: Azure's prompt filter results)
	}
	d.cur.keepText(k.delta)
	changed := d.clientDelta(&k.delta) || k.hasUsage || fr != ""
	if fr != "" || d.last.Keys == nil {
		d.last = k.c.Own() // the template of the finish chunk: data is the reader's buffer
	}
	if fr != "" {
		d.cur.finish = fr
		d.cur.usageInFinish = d.cur.usageInFinish || k.hasUsage
		// The round's calls are known: without a workspace call it is the turn's last round,
		// whose finish chunk and what follows it go to the client where they came.
		d.cur.inPlace = !d.cur.hidCalls()
	}
	if d.cur.inPlace {
		return d.inPlace(k, fr != "")
	}
	if changed && emptyDelta(k.delta) && !carriesMore(k.choice) {
		// Nothing left for the client now: a role alone (it goes with the first chunk that
		// carries something), a workspace call, or a finish_reason (it comes at the end of the
		// turn). A chunk that came with nothing to take out goes on: its other members
		// (system_fingerprint, a vendor's) are the client's.
		return nil
	}
	if !changed && k.n == 1 && d.asIs(k.c) {
		return d.emit(data) // nothing to change: its bytes go out as they came
	}
	if k.hasUsage {
		k.c.Set("usage", json.RawMessage("null")) // the turn's usage comes once, at its end
	}
	return d.send(k.c, k.choice, k.delta, json.RawMessage("null"))
}

// chatChunk is an upstream chunk as parse reads it: the chunk, its first choice and that
// choice's delta (empty when absent), how many choices it has, whether it carries usage.
type chatChunk struct {
	c, choice, delta rawjson.Object
	n                int
	hasUsage         bool
}

// parse reads a chunk into the member lists of d.scratch; ok is false for what is not a chunk.
func (d *chatSSE) parse(data []byte) (k chatChunk, ok bool) {
	var err error
	if k.c, err = rawjson.ParseInto(d.scratch.chunk, data); err != nil {
		return k, false
	}
	d.scratch.chunk = k.c
	k.hasUsage = !isNull(k.c.Get("usage"))
	var first json.RawMessage // the first choice: counted, not split (no allocation per chunk)
	if v := k.c.Get("choices"); !isNull(v) {
		if err = rawjson.Each(v, func(i, start, end int) error {
			if i == 0 {
				first = v[start:end:end]
			}
			k.n++
			return nil
		}); err != nil {
			return k, false
		}
	}
	if k.n == 0 {
		return k, true
	}
	if k.choice, err = rawjson.ParseInto(d.scratch.choice, first); err != nil {
		return k, false
	}
	d.scratch.choice = k.choice
	if raw := k.choice.Get("delta"); !isNull(raw) {
		if k.delta, err = rawjson.ParseInto(d.scratch.delta, raw); err != nil {
			return k, false
		}
		d.scratch.delta = k.delta
	}
	return k, true
}

// clientDelta makes a delta the client's: without its role (one role delta, added to the first
// chunk the client gets), its tool calls the client's alone. It reports whether it changed it.
func (d *chatSSE) clientDelta(delta *rawjson.Object) (changed bool) {
	if delta.Has("role") {
		delta.Del("role")
		changed = true
	}
	if tcs := delta.Get("tool_calls"); !isNull(tcs) {
		if items, ok := d.cur.toolCalls(d.req, tcs); ok {
			changed = true
			if len(items) == 0 {
				delta.Del("tool_calls")
			} else {
				delta.Set("tool_calls", rawjson.AppendArray(nil, items))
			}
		}
	}
	return changed
}

// inPlace emits a chunk of the turn's last round from its finish chunk on (finish is set for
// that one): where it came, with its own finish_reason, the turn's usage in place of the
// round's (none when the client did not ask for it).
func (d *chatSSE) inPlace(k chatChunk, finish bool) error {
	if k.hasUsage {
		k.c.Del("usage")
		if d.req.IncludeUsage {
			k.c.Set("usage", d.earlier.with(d.cur.usage))
			d.cur.usageSent = true
		}
	}
	d.cur.finishSent = d.cur.finishSent || finish
	if k.n == 0 {
		k.c.Set("id", rawjson.String(d.id))
		return d.emit(k.c.Bytes())
	}
	reason := k.choice.Get("finish_reason")
	if reason == nil {
		reason = json.RawMessage("null")
	}
	return d.send(k.c, k.choice, k.delta, reason)
}

// asIs reports whether a chunk from which nothing was taken can go to the client as it came:
// the role delta already went out, and it carries the turn's id and the chunk object type.
func (d *chatSSE) asIs(c rawjson.Object) bool {
	return d.emitted && d.sameID(c.Get("id")) && string(c.Get("object")) == `"chat.completion.chunk"`
}

// sameID reports whether a chunk's raw id is the turn's.
func (d *chatSSE) sameID(raw json.RawMessage) bool {
	return len(raw) == len(d.id)+2 && raw[0] == '"' && string(raw[1:len(raw)-1]) == d.id
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

// send emits a chunk: c with its one choice holding delta and finish_reason, the turn's id, and
// the role delta when it is the first the client gets.
func (d *chatSSE) send(c, choice, delta rawjson.Object, finishReason json.RawMessage) error {
	if !d.emitted {
		delta.Del("role")
		withRole := rawjson.Object{Keys: []string{"role"}, Vals: []json.RawMessage{rawjson.String("assistant")}}
		withRole.Keys = append(withRole.Keys, delta.Keys...)
		withRole.Vals = append(withRole.Vals, delta.Vals...)
		delta = withRole
		d.emitted = true
	}
	if d.id == "" {
		d.id = "chatcmpl-" + randomHex(12)
	}
	choice.Set("delta", delta.Bytes())
	choice.Set("finish_reason", finishReason)
	c.Set("id", rawjson.String(d.id))
	c.Set("object", rawjson.String("chat.completion.chunk"))
	c.Set("choices", rawjson.AppendArray(nil, []json.RawMessage{choice.Bytes()}))
	return d.emit(c.Bytes())
}

func (d *chatSSE) emit(chunk []byte) error { return d.sendEvent("", chunk) }

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

// finish ends the turn: the client's calls it has not seen yet (those of a parallel wrapper),
// the finish chunk (finish_reason "tool_calls" when the client has calls to run), and the
// turn's usage when the client asked for it, where the last round's upstream put it.
func (d *chatSSE) finish(clientCalls []toolCall, usage *usageSum, _ int) error {
	withUsage := d.req.IncludeUsage && !usage.empty()
	if d.cur.finishSent {
		if withUsage && !d.cur.usageSent { // the last round's upstream sent none
			u := d.last.Clone()
			u.Set("id", rawjson.String(d.id))
			u.Set("choices", json.RawMessage("[]"))
			u.Set("usage", usage.json())
			return d.emit(u.Bytes())
		}
		return nil
	}
	reason := d.cur.finish
	switch {
	case len(clientCalls) > 0:
		reason = "tool_calls"
	case reason == "" || (d.cur.hidCalls() && (reason == "tool_calls" || reason == "function_call")):
		reason = "stop" // the only calls were the workspace's
	}
	c := d.last.Clone()
	if c.Keys == nil {
		c.Set("id", rawjson.String(d.id))
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
	if err := d.unseen(c, choice, clientCalls); err != nil {
		return err
	}
	inFinish, own := d.cur.usageInFinish, d.cur.usageChunk
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
	if err := d.send(c, choice.Clone(), rawjson.Object{}, rawjson.String(reason)); err != nil {
		return err
	}
	if withUsage && own.Keys != nil {
		u := own.Clone()
		u.Set("id", rawjson.String(d.id))
		u.Set("usage", usage.json())
		return d.emit(u.Bytes())
	}
	return nil
}

// unseen emits, in one chunk like c, the client's calls a stream has not shown it: the calls of
// a parallel wrapper, which the proxy held until its round ended.
func (d *chatSSE) unseen(c, choice rawjson.Object, calls []toolCall) error {
	var items []json.RawMessage
	for _, call := range calls {
		if call.shown {
			continue
		}
		acc := &callAcc{id: call.ID, name: call.Name, clientIndex: d.cur.clientN}
		acc.args.WriteString(call.Arguments)
		d.cur.clientN++
		items = append(items, clientCallItem(acc))
	}
	if len(items) == 0 {
		return nil
	}
	delta := rawjson.Object{}
	delta.Set("tool_calls", rawjson.AppendArray(nil, items))
	u := c.Clone()
	u.Del("usage")
	return d.send(u, choice.Clone(), delta, json.RawMessage("null"))
}

// Failure is the event that ends a stream whose turn failed after its first byte: the
// upstream's own error event, or the proxy's error.
func (d *chatSSE) Failure(err error) (string, []byte) {
	var se *apierr.StreamError
	if errors.As(err, &se) {
		if !d.emitted && d.last.Keys != nil {
			// The chunks before it carried nothing: the client still gets one, as it would
			// straight (the id and model of the stream), then the error.
			c := d.last.Clone()
			choice := rawjson.Object{}
			if list, err := rawjson.Split(c.Get("choices")); err == nil && len(list) > 0 {
				choice, _ = rawjson.Parse(list[0])
			}
			c.Del("usage")
			_ = d.send(c, choice, rawjson.Object{}, json.RawMessage("null"))
		}
		return "", se.Data
	}
	return "", apierr.StreamFailure(err).Body()
}

// End is what follows the last chunk of a stream that succeeded.
func (d *chatSSE) End() []byte { return []byte("data: [DONE]\n\n") }

// Keepalive is a comment line, which SSE parsers skip.
func (d *chatSSE) Keepalive() []byte { return keepaliveComment }
