package wire

import (
	"encoding/json"
	"strconv"
)

// Chat completions (POST /v1/chat/completions): a chat.completion whole, or chat.completion.chunk
// events ended by data: [DONE]; errors in OpenAI's shape. Members in OpenAI's order and with its
// nulls (proxy/testdata/wire/openai): a chunk's id, object, created, model, service_tier,
// system_fingerprint, choices (index, delta, logprobs, finish_reason) and, when the request asked
// for usage, usage (null but in the usage chunk); a whole answer's choices, then usage,
// service_tier and system_fingerprint. OpenAI's obfuscation padding is left out. The bytes are
// appended by hand, strings escaped as encoding/json escapes them, so that the load tool's fake
// model pays little for the answers it encodes for each request.

// ChatHead is what every object of an answer repeats.
type ChatHead struct {
	ID      string
	Created int64
	Model   string
	// ServiceTier and Fingerprint (system_fingerprint) are left out when "".
	ServiceTier, Fingerprint string
	// StreamUsage is that the request asked for usage (stream_options.include_usage): every
	// chunk then carries "usage":null, and UsageChunk the figures.
	StreamUsage bool
}

// ChatCall is a tool call; Arguments is JSON.
type ChatCall struct {
	ID, Name, Arguments string
}

// ChatUsage is an answer's token counts; Cached < 0 leaves prompt_tokens_details out.
type ChatUsage struct {
	Prompt, Completion, Cached int
}

// ChatFinish is the finish_reason of an answer of calls tool calls: tool_calls when there are
// any, else stop.
func ChatFinish(calls int) string {
	if calls > 0 {
		return "tool_calls"
	}
	return "stop"
}

func (h ChatHead) appendStart(b []byte, object string) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, h.ID)
	b = append(b, `,"object":"`+object+`","created":`...)
	b = strconv.AppendInt(b, h.Created, 10)
	b = append(b, `,"model":`...)
	return appendString(b, h.Model)
}

func (h ChatHead) appendTier(b []byte) []byte {
	if h.ServiceTier != "" {
		b = append(b, `,"service_tier":`...)
		b = appendString(b, h.ServiceTier)
	}
	if h.Fingerprint != "" {
		b = append(b, `,"system_fingerprint":`...)
		b = appendString(b, h.Fingerprint)
	}
	return b
}

// Completion is a whole chat completion: the assistant's text (null when it is empty and there
// are calls) and calls, finished by ChatFinish, with usage.
func (h ChatHead) Completion(text string, calls []ChatCall, u ChatUsage) []byte {
	b := make([]byte, 0, 320+len(text)+64*len(calls))
	b = h.appendStart(b, "chat.completion")
	b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	if text == "" && len(calls) > 0 {
		b = append(b, "null"...)
	} else {
		b = appendString(b, text)
	}
	b = append(b, `,"refusal":null,"annotations":[]`...)
	if len(calls) > 0 {
		b = append(b, `,"tool_calls":[`...)
		for i, c := range calls {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = appendString(b, c.ID)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = appendString(b, c.Name)
			b = append(b, `,"arguments":`...)
			b = appendString(b, c.Arguments)
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	b = append(b, `},"logprobs":null,"finish_reason":"`+ChatFinish(len(calls))+`"}],`...)
	b = appendUsage(b, u)
	return append(h.appendTier(b), '}')
}

// Chunk is a chat.completion.chunk of one choice: delta (JSON, one of the Chat…Delta) and its
// finish_reason ("" is null).
func (h ChatHead) Chunk(delta []byte, finish string) []byte {
	return h.appendChunk(make([]byte, 0, 200+len(delta)), delta, finish)
}

// AppendEvent appends to b the server-sent event (ChatEvent) of the chunk of delta and finish
// (Chunk): a stream's event written in place, for a model that encodes a stream per request.
func (h ChatHead) AppendEvent(b, delta []byte, finish string) []byte {
	b = append(b, "data: "...)
	return append(h.appendChunk(b, delta, finish), "\n\n"...)
}

func (h ChatHead) appendChunk(b, delta []byte, finish string) []byte {
	b = h.appendTier(h.appendStart(b, "chat.completion.chunk"))
	b = append(b, `,"choices":[{"index":0,"delta":`...)
	b = append(b, delta...)
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = appendString(b, finish)
	}
	b = append(b, "}]"...)
	if h.StreamUsage {
		b = append(b, `,"usage":null`...)
	}
	return append(b, '}')
}

// UsageChunk is the chunk after the finish's when the request asked for usage: no choices, the
// usage.
func (h ChatHead) UsageChunk(u ChatUsage) []byte {
	b := make([]byte, 0, 256)
	b = h.appendTier(h.appendStart(b, "chat.completion.chunk"))
	b = append(b, `,"choices":[],`...)
	return append(appendUsage(b, u), '}')
}

// ChatEvent is a chunk's server-sent event: data, ended by LF LF as OpenAI ends its.
func ChatEvent(data []byte) []byte {
	b := make([]byte, 0, len(data)+8)
	b = append(b, "data: "...)
	b = append(b, data...)
	return append(b, "\n\n"...)
}

// ChatDone ends a stream.
const ChatDone = "data: [DONE]\n\n"

// The deltas of a stream's chunks.

// ChatRoleDelta opens an answer: the role, with an empty content (and a null refusal) when the
// answer is text, a null content when it is tool calls.
func ChatRoleDelta(calls bool) []byte {
	if calls {
		return []byte(`{"role":"assistant","content":null}`)
	}
	return []byte(`{"role":"assistant","content":"","refusal":null}`)
}

// ChatTextDelta is a piece of the text.
func ChatTextDelta(text string) []byte {
	return append(appendString(append(make([]byte, 0, len(text)+16), `{"content":`...), text), '}')
}

// ChatCallDelta opens the index-th call: its id, type and name, and no arguments yet.
func ChatCallDelta(index int, id, name string) []byte {
	b := strconv.AppendInt(append(make([]byte, 0, 96+len(id)+len(name)), `{"tool_calls":[{"index":`...), int64(index), 10)
	b = appendString(append(b, `,"id":`...), id)
	b = appendString(append(b, `,"type":"function","function":{"name":`...), name)
	return append(b, `,"arguments":""}}]}`...)
}

// ChatArgumentsDelta is a piece of the index-th call's arguments.
func ChatArgumentsDelta(index int, piece string) []byte {
	b := strconv.AppendInt(append(make([]byte, 0, 64+len(piece)), `{"tool_calls":[{"index":`...), int64(index), 10)
	b = appendString(append(b, `,"function":{"arguments":`...), piece)
	return append(b, "}}]}"...)
}

// OpenAIError is an error body in OpenAI's shape, chat completions' and the Responses API's:
// message, type, param and code (each "" is null).
func OpenAIError(msg, typ, param, code string) []byte {
	b := appendString(append(make([]byte, 0, 96+len(msg)), `{"error":{"message":`...), msg)
	for _, f := range [...]struct{ name, v string }{{"type", typ}, {"param", param}, {"code", code}} {
		b = append(b, `,"`+f.name+`":`...)
		if f.v == "" {
			b = append(b, "null"...)
		} else {
			b = appendString(b, f.v)
		}
	}
	return append(b, "}}"...)
}

func appendUsage(b []byte, u ChatUsage) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.Prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.Completion), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.Prompt+u.Completion), 10)
	if u.Cached >= 0 {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(u.Cached), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendString appends s as a JSON string, escaped as encoding/json escapes it: the quote, the
// backslash and \n, \r, \t, \b, \f by a backslash, the other control characters and <, >, & as \u00XX;
// a string with bytes beyond ASCII goes through encoding/json (invalid UTF-8, U+2028, U+2029).
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := len(b)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 0x80:
			q, _ := json.Marshal(s)
			return append(b[:start], q...)
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
