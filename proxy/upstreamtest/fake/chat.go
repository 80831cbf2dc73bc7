package fake

import (
	"net/http"
	"strconv"
	"time"
)

// Chat completions, in OpenAI's shape: a JSON body, or chat.completion.chunk events — the text
// in pieces (the first with the role), then each call's arguments in pieces (its first with its
// id and name), the finish chunk, the usage when the request asks for it
// (stream_options.include_usage) and [DONE], those three with the last piece.

const (
	chatID          = "chatcmpl-model"
	chatChunkPrefix = `{"id":"` + chatID + `","object":"chat.completion.chunk","created":1,"model":`
)

// usage is an answer's token counts; cached < 0 leaves prompt_tokens_details out.
type usage struct{ prompt, completion, cached int }

// fixedUsage is the usage of every answer without PromptCache.
var fixedUsage = usage{prompt: 300, completion: 40, cached: -1}

// memoKey names a constant answer's encoding.
type memoKey struct {
	api                 API
	stream, usage, tool bool
	big                 bool
	model               string
}

func (m *Model) chat(w http.ResponseWriter, r *http.Request, req *Request, tool bool, start time.Time) {
	encode := func() [][]byte {
		a := m.answer(req, tool)
		u := fixedUsage
		if m.openai != nil {
			prompt, cached := m.openai.usage(req)
			u = usage{prompt: prompt, completion: len(a.text())/bytesPerToken + 10, cached: cached}
		}
		if req.Stream {
			return chatEvents(req, a, u, m.opts.Timing.pieces())
		}
		return [][]byte{chatJSON(req, a, u)}
	}
	m.reply(w, r, req, start, memoKey{api: Chat, stream: req.Stream, usage: req.StreamOptions.IncludeUsage, tool: tool, big: req.BigStream, model: req.Model}, encode)
}

// reply writes an answer encode gives: its events at the model's pace, or its JSON body once the
// whole answer's time has passed. A constant model encodes each kind of answer (key) once, but a
// workspace call, each of which is another (WorkspaceCall).
func (m *Model) reply(w http.ResponseWriter, r *http.Request, req *Request, start time.Time, key memoKey, encode func() [][]byte) {
	var out [][]byte
	if !m.constant || key.tool {
		out = encode()
	} else if v, ok := m.memo.Load(key); ok {
		out = v.([][]byte)
	} else {
		out = encode()
		m.memo.Store(key, out)
	}
	if req.Stream {
		m.writeEvents(w, r, start, out)
		return
	}
	if !sleepUntil(r, start.Add(m.opts.Timing.Total())) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out[0])
}

func appendUsage(b []byte, u usage) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.completion), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.prompt+u.completion), 10)
	if u.cached >= 0 {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(u.cached), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

func finishReason(a Answer) string {
	if len(a.Calls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

// chatJSON is a non-streamed chat completion.
func chatJSON(req *Request, a Answer, u usage) []byte {
	b := []byte(`{"id":"` + chatID + `","object":"chat.completion","created":1,"model":`)
	b = strconv.AppendQuote(b, req.Model)
	b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	if text := a.text(); text != "" || len(a.Calls) == 0 {
		b = strconv.AppendQuote(b, text)
	} else {
		b = append(b, "null"...)
	}
	if len(a.Calls) > 0 {
		b = append(b, `,"tool_calls":[`...)
		for i, c := range a.Calls {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = strconv.AppendQuote(b, c.ID)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = strconv.AppendQuote(b, c.Name)
			b = append(b, `,"arguments":`...)
			b = strconv.AppendQuote(b, c.Arguments)
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	b = append(b, `},"finish_reason":"`+finishReason(a)+`"}],`...)
	return append(appendUsage(b, u), '}')
}

// chatEvents are a streamed chat completion's events, one a piece; the last carries the finish
// chunk, the usage (when asked) and [DONE].
func chatEvents(req *Request, a Answer, u usage, n int) [][]byte {
	prefix := strconv.AppendQuote([]byte("data: "+chatChunkPrefix), req.Model)
	prefix = append(prefix, `,"choices":[{"index":0,"delta":`...)
	var out [][]byte
	event := func(delta []byte) {
		b := append(append([]byte(nil), prefix...), delta...)
		out = append(out, append(b, `,"finish_reason":null}]}`+"\n\n"...))
	}
	pieces := a.Pieces
	if pieces == nil && (a.Text != "" || len(a.Calls) == 0) {
		pieces = split(a.Text, n)
	}
	for i, p := range pieces {
		d := []byte(`{"content":`)
		if i == 0 {
			d = []byte(`{"role":"assistant","content":`)
		}
		d = strconv.AppendQuote(d, p)
		event(append(d, '}'))
	}
	for j, c := range a.Calls {
		for i, p := range split(c.Arguments, n) {
			var d []byte
			switch {
			case i == 0 && j == 0 && len(pieces) == 0:
				d = []byte(`{"role":"assistant","content":null,"tool_calls":[{"index":`)
			default:
				d = []byte(`{"tool_calls":[{"index":`)
			}
			d = strconv.AppendInt(d, int64(j), 10)
			if i == 0 {
				d = append(d, `,"id":`...)
				d = strconv.AppendQuote(d, c.ID)
				d = append(d, `,"type":"function","function":{"name":`...)
				d = strconv.AppendQuote(d, c.Name)
				d = append(d, `,"arguments":`...)
			} else {
				d = append(d, `,"function":{"arguments":`...)
			}
			d = strconv.AppendQuote(d, p)
			event(append(d, "}}]}"...))
		}
	}
	last := append(out[len(out)-1], prefix...)
	last = append(last, `{},"finish_reason":"`+finishReason(a)+`"}]}`+"\n\n"...)
	if req.StreamOptions.IncludeUsage {
		last = strconv.AppendQuote(append(last, "data: "+chatChunkPrefix...), req.Model)
		last = append(last, `,"choices":[],`...)
		last = append(appendUsage(last, u), "}\n\n"...)
	}
	out[len(out)-1] = append(last, "data: [DONE]\n\n"...)
	return out
}
