package wire

import "encoding/json"

// Anthropic's Messages API (POST /v1/messages): a message whole, or the events of its stream —
// message_start, each content block's start, deltas and stop, message_delta with the stop
// reason, message_stop; errors in Anthropic's shape.

// MessagesMessage is a message: its id, model, content blocks (as given), stop_reason (nil in a
// stream's message_start) and usage.
func MessagesMessage(id, model string, content, stop, usage any) map[string]any {
	return map[string]any{"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
		"stop_reason": stop, "stop_sequence": nil, "usage": usage}
}

// MessagesText is a text block.
func MessagesText(text string) map[string]any { return map[string]any{"type": "text", "text": text} }

// MessagesToolUse is a tool_use block whole (a message's; a stream's starts with an empty input,
// MessagesToolUseStart).
func MessagesToolUse(id, name string, input json.RawMessage) map[string]any {
	return map[string]any{"type": "tool_use", "id": id, "name": name, "input": input}
}

// MessagesToolUseStart is a tool_use block as a stream's content_block_start gives it: its input
// comes in input_json_delta deltas.
func MessagesToolUseStart(id, name string) map[string]any {
	return map[string]any{"type": "tool_use", "id": id, "name": name, "input": map[string]any{}}
}

// MessagesEvent is a stream's event of type typ: fields with their type, as the event's data.
func MessagesEvent(typ string, fields map[string]any) []byte {
	fields["type"] = typ
	b, _ := json.Marshal(fields)
	out := make([]byte, 0, len(b)+len(typ)+16)
	out = append(out, "event: "+typ+"\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// The events of a stream, each the fields of its MessagesEvent.

// MessagesStart is message_start's: the message with no content and no stop reason yet.
func MessagesStart(id, model string, usage any) map[string]any {
	return map[string]any{"message": MessagesMessage(id, model, []any{}, nil, usage)}
}

// MessagesBlockStart is content_block_start's of the index-th block.
func MessagesBlockStart(index int, block map[string]any) map[string]any {
	return map[string]any{"index": index, "content_block": block}
}

// MessagesDelta is content_block_delta's of the index-th block.
func MessagesDelta(index int, delta map[string]any) map[string]any {
	return map[string]any{"index": index, "delta": delta}
}

// MessagesBlockStop is content_block_stop's of the index-th block.
func MessagesBlockStop(index int) map[string]any { return map[string]any{"index": index} }

// MessagesEnd is message_delta's: the stop reason, and the usage.
func MessagesEnd(stop string, usage any) map[string]any {
	return map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": usage}
}

// MessagesError is an error body in Anthropic's shape, its members in Anthropic's order: its
// type (invalid_request_error, overloaded_error, …) and message.
func MessagesError(typ, msg string) []byte {
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e.Type, e.Error.Type, e.Error.Message = "error", typ, msg
	b, _ := json.Marshal(e)
	return b
}

// MessagesTextDelta is a text block's delta.
func MessagesTextDelta(text string) map[string]any {
	return map[string]any{"type": "text_delta", "text": text}
}

// MessagesInputDelta is a tool_use block's delta: a piece of its input's JSON.
func MessagesInputDelta(partial string) map[string]any {
	return map[string]any{"type": "input_json_delta", "partial_json": partial}
}
