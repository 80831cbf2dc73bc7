package wire

import "encoding/json"

// The Responses API (POST /v1/responses): a response object whole, or the events of its stream,
// each numbered (sequence_number); items of the output (messages, function calls); the usage.

// ResponsesStream numbers a stream's events.
type ResponsesStream struct{ seq int }

// Event is the stream's next event of type typ: fields with their type and sequence_number, as
// the event's data.
func (s *ResponsesStream) Event(typ string, fields map[string]any) []byte {
	fields["type"] = typ
	fields["sequence_number"] = s.seq
	s.seq++
	b, _ := json.Marshal(fields)
	out := make([]byte, 0, len(b)+len(typ)+16)
	out = append(out, "event: "+typ+"\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// ResponsesMessage is an assistant's message item of status with content (its parts).
func ResponsesMessage(id, status string, content []any) map[string]any {
	return map[string]any{"id": id, "type": "message", "status": status, "role": "assistant", "content": content}
}

// ResponsesFunctionCall is a function_call item of status with its arguments (so far: "" in a
// stream's output_item.added).
func ResponsesFunctionCall(id, status, callID, name, args string) map[string]any {
	return map[string]any{"id": id, "type": "function_call", "status": status, "call_id": callID, "name": name, "arguments": args}
}

// ResponsesUsage is a response's usage: the input's tokens (cached of them), the output's (no
// reasoning tokens) and their total.
func ResponsesUsage(input, cached, output int) map[string]any {
	return map[string]any{"input_tokens": input, "input_tokens_details": map[string]any{"cached_tokens": cached},
		"output_tokens": output, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": input + output}
}
