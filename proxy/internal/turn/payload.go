package turn

import (
	"bytes"
	"encoding/json"
	"io"
	"net"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// replacement is a top-level member a round sends in place of the client's (or adds).
type replacement struct {
	key   string
	value json.RawMessage // nil: the client's, if any
}

// roundBody writes a round's request: the client's members in their order, the conversation
// (member conv) as runs, the tools as toolRuns — without any tool, tools, tool_choice and
// parallel_tool_calls are dropped (an upstream refuses the last two without tools) — and the
// replacements' values in place of the client's; the conversation, tools and replacements the
// client did not send come last.
func roundBody(top rawjson.Object, conv string, runs, toolRuns []Payload, replace ...replacement) Payload {
	replaced := func(k string) int {
		for i, r := range replace {
			if r.key == k && r.value != nil {
				return i
			}
		}
		return -1
	}
	w := payloadWriter{buf: make([]byte, 0, 1024)}
	w.byte('{')
	hasConv, hasTools := false, false
	written := make([]bool, len(replace)) // the replacements written in place
	for i, k := range top.Keys {
		switch r := replaced(k); {
		case k == conv:
			hasConv = true
			w.member(k)
			w.array(runs)
		case k == "tools":
			hasTools = true
			if len(toolRuns) > 0 {
				w.member(k)
				w.array(toolRuns)
			}
		case r >= 0:
			written[r] = true
			w.member(k)
			w.raw(replace[r].value)
		case k == "tool_choice" || k == "parallel_tool_calls":
			if len(toolRuns) > 0 {
				w.member(k)
				w.raw(top.Vals[i])
			}
		default:
			w.member(k)
			w.raw(top.Vals[i])
		}
	}
	if !hasConv {
		w.member(conv)
		w.array(runs)
	}
	if !hasTools && len(toolRuns) > 0 {
		w.member("tools")
		w.array(toolRuns)
	}
	for i, r := range replace {
		if !written[i] && r.value != nil {
			w.member(r.key)
			w.raw(r.value)
		}
	}
	w.byte('}')
	return w.payload()
}

// Payload is an upstream request body as pieces, which alias what they were built from: a
// round's body is written out, never joined into one buffer.
type Payload [][]byte

// Len is the body's length in bytes.
func (p Payload) Len() int {
	n := 0
	for _, b := range p {
		n += len(b)
	}
	return n
}

// inMemoryBody is the size up to which Reader joins a body into one buffer.
const inMemoryBody = 64 << 10

// Reader reads the body from its start; each call gives a reader of its own. A body of up to
// inMemoryBody bytes is joined into one buffer first: net/http writes a *bytes.Reader's body
// with the request's head in one write, where for any other reader it flushes the head in a
// write of its own and copies the body through a buffer it allocates per request (the
// exception of golang/go#22088 for in-memory readers). A larger body is read from its pieces,
// never copied whole.
func (p Payload) Reader() io.Reader {
	if p.Len() <= inMemoryBody {
		return bytes.NewReader(p.joined())
	}
	b := net.Buffers(append([][]byte(nil), p...))
	return &b
}

// joined is the body joined into one buffer.
func (p Payload) joined() []byte { return bytes.Join(p, nil) }

// payloadWriter builds a Payload: small values are copied into a shared buffer, large ones
// (the client's messages and tools) go in as pieces of their own.
type payloadWriter struct {
	pieces  Payload
	buf     []byte
	members int
}

// largeValue is the size from which a value goes in as a piece of its own.
const largeValue = 512

func (w *payloadWriter) byte(c byte) { w.buf = append(w.buf, c) }

// member starts an object member: a comma when it is not the first, the key and its colon.
func (w *payloadWriter) member(key string) {
	if w.members > 0 {
		w.byte(',')
	}
	w.members++
	w.buf = rawjson.AppendString(w.buf, key)
	w.byte(':')
}

// array writes an array whose elements are the runs' (a run holds one or more elements).
func (w *payloadWriter) array(runs []Payload) {
	w.byte('[')
	for i, run := range runs {
		if i > 0 {
			w.byte(',')
		}
		for _, piece := range run {
			w.raw(piece)
		}
	}
	w.byte(']')
}

func (w *payloadWriter) raw(v []byte) {
	if len(v) < largeValue {
		w.buf = append(w.buf, v...)
		return
	}
	w.flush()
	w.pieces = append(w.pieces, v)
}

func (w *payloadWriter) flush() {
	if len(w.buf) > 0 {
		w.pieces = append(w.pieces, w.buf)
		w.buf = w.buf[len(w.buf):] // the next small values go on in the same array
	}
}

func (w *payloadWriter) payload() Payload {
	w.flush()
	return w.pieces
}
