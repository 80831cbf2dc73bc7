package fake

import (
	"net/http"
	"time"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// Chat completions, in OpenAI's shape: a JSON body, or chat.completion.chunk events — the text
// in pieces (the first with the role), then each call's arguments in pieces (its first with its
// id and name), the finish chunk, the usage when the request asks for it
// (stream_options.include_usage) and [DONE], those three with the last piece.

const chatID = "chatcmpl-model"

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

// chatHead is what every object of the answer to req repeats, in OpenAI's shape but for its
// optional service_tier and system_fingerprint, left out (as OpenAI-compatible servers leave them)
// to keep the bytes a load run moves near a real answer's fewest.
func chatHead(req *Request) wire.ChatHead {
	return wire.ChatHead{ID: chatID, Created: 1, Model: req.Model, StreamUsage: req.StreamOptions.IncludeUsage}
}

func chatUsage(u usage) wire.ChatUsage {
	return wire.ChatUsage{Prompt: u.prompt, Completion: u.completion, Cached: u.cached}
}

func chatCalls(calls []Call) []wire.ChatCall {
	out := make([]wire.ChatCall, len(calls))
	for i, c := range calls {
		out[i] = wire.ChatCall(c)
	}
	return out
}

// chatJSON is a non-streamed chat completion.
func chatJSON(req *Request, a Answer, u usage) []byte {
	return chatHead(req).Completion(a.text(), chatCalls(a.Calls), chatUsage(u))
}

// chatEvents are a streamed chat completion's events, one a piece (the role's chunk with the
// first, each call's opening chunk with its arguments' first piece); the last carries the finish
// chunk, the usage (when asked) and [DONE]. They are written one after the other in one buffer.
func chatEvents(req *Request, a Answer, u usage, n int) [][]byte {
	h := chatHead(req)
	pieces := a.Pieces
	if pieces == nil && (a.Text != "" || len(a.Calls) == 0) {
		pieces = split(a.Text, n)
	}
	buf := make([]byte, 0, (len(pieces)+len(a.Calls)*n+4)*192+len(a.text()))
	var ends []int // where each piece's events end in buf
	for i, p := range pieces {
		if i == 0 {
			buf = h.AppendEvent(buf, wire.ChatRoleDelta(false), "")
		}
		buf = h.AppendEvent(buf, wire.ChatTextDelta(p), "")
		ends = append(ends, len(buf))
	}
	for j, c := range a.Calls {
		for i, p := range split(c.Arguments, n) {
			if i == 0 {
				if j == 0 && len(pieces) == 0 {
					buf = h.AppendEvent(buf, wire.ChatRoleDelta(true), "")
				}
				buf = h.AppendEvent(buf, wire.ChatCallDelta(j, c.ID, c.Name), "")
			}
			buf = h.AppendEvent(buf, wire.ChatArgumentsDelta(j, p), "")
			ends = append(ends, len(buf))
		}
	}
	buf = h.AppendEvent(buf, []byte(`{}`), wire.ChatFinish(len(a.Calls)))
	if req.StreamOptions.IncludeUsage {
		buf = append(buf, wire.ChatEvent(h.UsageChunk(chatUsage(u)))...)
	}
	buf = append(buf, wire.ChatDone...)
	ends[len(ends)-1] = len(buf)
	out := make([][]byte, len(ends))
	from := 0
	for i, end := range ends {
		out[i], from = buf[from:end:end], end
	}
	return out
}
