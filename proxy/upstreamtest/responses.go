package upstreamtest

import (
	"encoding/json"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// Item is one output item of a scripted Responses API response.
type Item struct {
	Type string // "message", "function_call", "reasoning"
	ID   string
	// Text is a message's text, or a reasoning item's summary (OpenAI, Ollama) or reasoning text
	// (vLLM).
	Text string
	// A function call's.
	CallID, Name, Arguments string
}

// Message is an assistant message item.
func Message(id, text string) Item { return Item{Type: "message", ID: id, Text: text} }

// FunctionCall is a function call item.
func FunctionCall(id, callID, name, args string) Item {
	return Item{Type: "function_call", ID: id, CallID: callID, Name: name, Arguments: args}
}

// Reasoning is a reasoning item.
func Reasoning(id, text string) Item { return Item{Type: "reasoning", ID: id, Text: text} }

// Server flavours of the Responses API: what their streams and objects look like, taken from the
// servers' code and OpenAI's API reference.
const (
	// OpenAI stores responses by default; reasoning comes as an encrypted item with a summary;
	// text and arguments are streamed in small deltas.
	OpenAI = "openai"
	// Ollama stores nothing (store false); reasoning is a summary with the thinking as
	// encrypted_content; a call's arguments come in one delta.
	Ollama = "ollama"
	// VLLM stores nothing unless configured (store false); reasoning comes as reasoning_text
	// content with response.reasoning_text.delta events.
	VLLM = "vllm"
)

// ResponseSpec is a scripted response.
type ResponseSpec struct {
	ID     string
	Flavor string // OpenAI (default), Ollama or VLLM
	Items  []Item
	// Usage: input, cached and output tokens (default 10, 2, 5).
	Input, Cached, Output int
	Status                string // "completed" by default
}

func (s ResponseSpec) stored() bool { return s.Flavor == "" || s.Flavor == OpenAI }

func (s ResponseSpec) item(it Item, done bool) map[string]any {
	status := "in_progress"
	if done {
		status = "completed"
	}
	switch it.Type {
	case "message":
		content := []any{}
		if done {
			content = []any{map[string]any{"type": "output_text", "text": it.Text, "annotations": []any{}, "logprobs": []any{}}}
		}
		return wire.ResponsesMessage(it.ID, status, content)
	case "function_call":
		args := ""
		if done {
			args = it.Arguments
		}
		return wire.ResponsesFunctionCall(it.ID, status, it.CallID, it.Name, args)
	}
	r := map[string]any{"id": it.ID, "type": "reasoning", "summary": []any{}}
	if !done {
		return r
	}
	switch s.Flavor {
	case VLLM:
		r["content"] = []any{map[string]any{"type": "reasoning_text", "text": it.Text}}
	case Ollama:
		r["summary"] = []any{map[string]any{"type": "summary_text", "text": it.Text}}
		r["encrypted_content"] = it.Text
	default:
		r["summary"] = []any{map[string]any{"type": "summary_text", "text": it.Text}}
		r["encrypted_content"] = "gAAAAB" + strings.Repeat("x", 16)
	}
	return r
}

// Object is the response object, complete (done) or as response.created carries it.
func (s ResponseSpec) Object(done bool) map[string]any {
	status, output := "in_progress", []any{}
	var usage any
	if done {
		status = s.Status
		if status == "" {
			status = "completed"
		}
		for _, it := range s.Items {
			output = append(output, s.item(it, true))
		}
		in, cached, out := s.Input, s.Cached, s.Output
		if in == 0 && out == 0 {
			in, cached, out = 10, 2, 5
		}
		usage = wire.ResponsesUsage(in, cached, out)
	}
	return map[string]any{
		"id": s.ID, "object": "response", "created_at": 1700000000, "status": status, "error": nil,
		"incomplete_details": nil, "instructions": nil, "max_output_tokens": nil, "model": "gpt-test",
		"output": output, "parallel_tool_calls": true, "previous_response_id": nil,
		"reasoning": map[string]any{"effort": nil, "summary": nil}, "service_tier": "default", "store": s.stored(),
		"temperature": 1.0, "text": map[string]any{"format": map[string]any{"type": "text"}}, "tool_choice": "auto",
		"tools": []any{}, "top_p": 1.0, "truncation": "disabled", "usage": usage, "user": nil, "metadata": map[string]any{},
	}
}

// JSON is the response as a non-streamed body.
func (s ResponseSpec) JSON() string { return marshal(s.Object(true)) }

// Events is the response as the flavour's server streams it: typed events (an `event:` line and
// its `data:`), sequence numbers from 0.
func (s ResponseSpec) Events() []string {
	var out []string
	var events wire.ResponsesStream
	emit := func(typ string, fields map[string]any) { out = append(out, string(events.Event(typ, fields))) }
	emit("response.created", map[string]any{"response": s.Object(false)})
	emit("response.in_progress", map[string]any{"response": s.Object(false)})
	for i, it := range s.Items {
		emit("response.output_item.added", map[string]any{"output_index": i, "item": s.item(it, false)})
		switch it.Type {
		case "message":
			part := func(text string) map[string]any {
				return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
			}
			emit("response.content_part.added", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "part": part("")})
			for _, d := range s.pieces(it.Text) {
				emit("response.output_text.delta", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "delta": d, "logprobs": []any{}})
			}
			emit("response.output_text.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "text": it.Text, "logprobs": []any{}})
			emit("response.content_part.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "part": part(it.Text)})
		case "function_call":
			for _, d := range s.pieces(it.Arguments) {
				emit("response.function_call_arguments.delta", map[string]any{"item_id": it.ID, "output_index": i, "delta": d})
			}
			emit("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": i, "arguments": it.Arguments})
		case "reasoning":
			if s.Flavor == VLLM {
				for _, d := range s.pieces(it.Text) {
					emit("response.reasoning_text.delta", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "delta": d})
				}
				emit("response.reasoning_text.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "text": it.Text})
				break
			}
			if s.Flavor != Ollama {
				emit("response.reasoning_summary_part.added", map[string]any{"item_id": it.ID, "output_index": i, "summary_index": 0,
					"part": map[string]any{"type": "summary_text", "text": ""}})
			}
			for _, d := range s.pieces(it.Text) {
				emit("response.reasoning_summary_text.delta", map[string]any{"item_id": it.ID, "output_index": i, "summary_index": 0, "delta": d})
			}
			emit("response.reasoning_summary_text.done", map[string]any{"item_id": it.ID, "output_index": i, "summary_index": 0, "text": it.Text})
			if s.Flavor != Ollama {
				emit("response.reasoning_summary_part.done", map[string]any{"item_id": it.ID, "output_index": i, "summary_index": 0,
					"part": map[string]any{"type": "summary_text", "text": it.Text}})
			}
		}
		emit("response.output_item.done", map[string]any{"output_index": i, "item": s.item(it, true)})
	}
	terminal := "response.completed"
	if s.Status == "incomplete" || s.Status == "failed" {
		terminal = "response." + s.Status
	}
	emit(terminal, map[string]any{"response": s.Object(true)})
	return out
}

// pieces splits text as the flavour streams it: Ollama's calls in one piece, else a few
// characters at a time.
func (s ResponseSpec) pieces(text string) []string {
	if text == "" {
		return nil
	}
	if s.Flavor == Ollama {
		return []string{text}
	}
	var out []string
	for len(text) > 0 {
		n := Cut(text, 7)
		out = append(out, text[:n])
		text = text[n:]
	}
	return out
}

// Stream replies with the response's events.
func (s ResponseSpec) Stream() Reply { return StreamRaw(s.Events()) }

// Reply replies with the response as JSON.
func (s ResponseSpec) Reply() Reply { return JSON(200, s.JSON()) }

func marshal(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
