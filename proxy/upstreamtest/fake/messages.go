package fake

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// The Messages API, in Anthropic's shape: a JSON body of content blocks (the text, then a
// tool_use block a call) after the timing's total, or the events of a stream — message_start,
// each block's start, its deltas (the text's pieces, or the input's as input_json_delta) and
// stop, message_delta with the stop reason and the output tokens, message_stop — a delta a piece,
// the events before a delta leaving with it and the last ones with the last piece.

func (m *Model) messages(w http.ResponseWriter, r *http.Request, req *Request, tool bool, start time.Time) {
	a := m.answer(req, tool)
	u := map[string]any{"input_tokens": fixedUsage.prompt, "output_tokens": fixedUsage.completion}
	if m.anthropic != nil {
		input, written, read := m.anthropic.usage(req)
		u = map[string]any{"input_tokens": input, "cache_creation_input_tokens": written, "cache_read_input_tokens": read, "output_tokens": fixedUsage.completion}
	}
	stop := "end_turn"
	if len(a.Calls) > 0 {
		stop = "tool_use"
	}
	if req.Stream {
		m.writeEvents(w, r, start, messagesEvents(req, a, u, stop, m.opts.Timing.pieces()))
		return
	}
	content := []map[string]any{}
	if text := a.text(); text != "" || len(a.Calls) == 0 {
		content = append(content, wire.MessagesText(text))
	}
	for _, c := range a.Calls {
		content = append(content, wire.MessagesToolUse(c.ID, c.Name, json.RawMessage(c.Arguments)))
	}
	if !sleepUntil(r, start.Add(m.opts.Timing.Total())) {
		return
	}
	b, _ := json.Marshal(wire.MessagesMessage("msg_model", req.Model, content, stop, u))
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// messagesEvents are a streamed message's events, grouped by the piece they leave with.
func messagesEvents(req *Request, a Answer, u map[string]any, stop string, n int) [][]byte {
	var out [][]byte
	var cur []byte
	event := func(typ string, v map[string]any) { cur = append(cur, wire.MessagesEvent(typ, v)...) }
	startUsage := map[string]any{"output_tokens": 1}
	for k, v := range u {
		if k != "output_tokens" {
			startUsage[k] = v
		}
	}
	event("message_start", wire.MessagesStart("msg_model", req.Model, startUsage))
	index := 0
	block := func(start map[string]any, deltas []map[string]any) {
		event("content_block_start", wire.MessagesBlockStart(index, start))
		for _, d := range deltas {
			event("content_block_delta", wire.MessagesDelta(index, d))
			out, cur = append(out, cur), nil
		}
		event("content_block_stop", wire.MessagesBlockStop(index))
		index++
	}
	if pieces := a.Pieces; pieces != nil || a.Text != "" || len(a.Calls) == 0 {
		if pieces == nil {
			pieces = split(a.Text, n)
		}
		var deltas []map[string]any
		for _, p := range pieces {
			deltas = append(deltas, wire.MessagesTextDelta(p))
		}
		block(wire.MessagesText(""), deltas)
	}
	for _, c := range a.Calls {
		var deltas []map[string]any
		for _, p := range split(c.Arguments, n) {
			deltas = append(deltas, wire.MessagesInputDelta(p))
		}
		block(wire.MessagesToolUseStart(c.ID, c.Name), deltas)
	}
	event("message_delta", wire.MessagesEnd(stop, map[string]any{"output_tokens": u["output_tokens"]}))
	event("message_stop", map[string]any{})
	if len(out) == 0 {
		return [][]byte{cur}
	}
	out[len(out)-1] = append(out[len(out)-1], cur...)
	return out
}
