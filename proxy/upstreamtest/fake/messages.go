package fake

import (
	"encoding/json"
	"net/http"
	"time"
)

// The Messages API, in Anthropic's shape: a JSON body of content blocks (the text, then a
// tool_use block a call), after the timing's total. A streamed request is refused: the fake
// streams chat completions only.

func (m *Model) messages(w http.ResponseWriter, r *http.Request, req *Request, tool bool, start time.Time) {
	if req.Stream {
		writeError(w, Messages, http.StatusBadRequest, "invalid_request_error", "the fake answers the Messages API in JSON only")
		return
	}
	a := m.answer(req, tool)
	u := map[string]any{"input_tokens": fixedUsage.prompt, "output_tokens": fixedUsage.completion}
	if m.anthropic != nil {
		input, written, read := m.anthropic.usage(req)
		u = map[string]any{"input_tokens": input, "cache_creation_input_tokens": written, "cache_read_input_tokens": read, "output_tokens": 40}
	}
	content := []map[string]any{}
	if text := a.text(); text != "" || len(a.Calls) == 0 {
		content = append(content, map[string]any{"type": "text", "text": text})
	}
	stop := "end_turn"
	for _, c := range a.Calls {
		content = append(content, map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": json.RawMessage(c.Arguments)})
		stop = "tool_use"
	}
	if !sleepUntil(r, start.Add(m.opts.Timing.Total())) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": "msg_model", "type": "message", "role": "assistant", "model": req.Model, "content": content,
		"stop_reason": stop, "stop_sequence": nil, "usage": u,
	})
}
