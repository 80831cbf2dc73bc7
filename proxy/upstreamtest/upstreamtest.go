// Package upstreamtest is a scripted OpenAI-compatible upstream for tests: a real HTTP server
// that answers each chat request with the next scripted reply (a JSON body, a stream of
// server-sent events, or any handler) and records what it received.
package upstreamtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/proxy/demo"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// Request is one request the upstream received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	// RemoteAddr is the client's address: one per connection.
	RemoteAddr string
}

// JSON decodes the body into a generic map.
func (r Request) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("upstream request body is not JSON: %v\n%s", err, r.Body)
	}
	return m
}

// Reply answers one request.
type Reply func(w http.ResponseWriter, r *http.Request)

// Server is the scripted upstream. Its URL ends in /v1, like an OpenAI base URL.
type Server struct {
	*httptest.Server
	URL string // base URL, …/v1

	mu       sync.Mutex
	t        testing.TB
	replies  []Reply
	requests []Request
	// Fallback answers requests when the script is empty; nil fails the test.
	Fallback Reply
}

// New starts a scripted upstream, closed when the test ends.
func New(t testing.TB, replies ...Reply) *Server {
	s := &Server{t: t, replies: replies}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.Server.URL + "/v1"
	t.Cleanup(s.Close)
	return s
}

// Script appends replies.
func (s *Server) Script(replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replies = append(s.replies, replies...)
}

// Requests returns what the upstream received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Remaining is how many scripted replies are unused.
func (s *Server) Remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.replies)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header.Clone(), Body: body, RemoteAddr: r.RemoteAddr})
	var reply Reply
	if len(s.replies) > 0 {
		reply, s.replies = s.replies[0], s.replies[1:]
	} else {
		reply = s.Fallback
	}
	s.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body)) // the reply may read it again
	if reply == nil {
		s.t.Errorf("upstreamtest: unscripted request %s %s", r.Method, r.URL.Path)
		wire.WriteJSON(w, http.StatusInternalServerError, wire.OpenAIError("unscripted", "server_error", "", ""))
		return
	}
	reply(w, r)
}

// JSON replies with status and body.
func JSON(status int, body string) Reply {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// Stream replies with server-sent events, one per data string, each flushed, then [DONE].
func Stream(data ...string) Reply { return StreamRaw(events(data, true)) }

// StreamNoDone is Stream without the final [DONE].
func StreamNoDone(data ...string) Reply { return StreamRaw(events(data, false)) }

func events(data []string, done bool) []string {
	out := make([]string, 0, len(data)+1)
	for _, d := range data {
		out = append(out, "data: "+d+"\n\n")
	}
	if done {
		out = append(out, "data: [DONE]\n\n")
	}
	return out
}

// StreamRaw replies with the given raw pieces of an event stream, each written and flushed.
func StreamRaw(pieces []string) Reply {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		WriteRaw(w, pieces...)
	}
}

// WriteRaw writes and flushes pieces of an event stream whose header is already sent.
func WriteRaw(w http.ResponseWriter, pieces ...string) {
	rc := http.NewResponseController(w)
	for _, p := range pieces {
		if _, err := io.WriteString(w, p); err != nil {
			return
		}
		_ = rc.Flush()
	}
}

// Events renders data strings as server-sent events.
func Events(data ...string) []string { return events(data, false) }

// Hang waits until the client goes away (or a minute), answering nothing; it reports the
// cancellation on gone when gone is not nil.
func Hang(gone chan<- struct{}) Reply {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			if gone != nil {
				close(gone)
			}
		case <-time.After(time.Minute):
		}
	}
}

// Call is a tool call in a scripted reply.
type Call struct {
	ID, Name, Arguments string
}

// head is what every object of a scripted chat answer repeats.
func head(id string) wire.ChatHead {
	return wire.ChatHead{ID: id, Created: 1700000000, Model: "gpt-test", ServiceTier: "default", Fingerprint: "fp_test"}
}

// Completion is a non-streamed chat completion with content and/or tool calls, in OpenAI's
// shape, with usage.
func Completion(content string, calls ...Call) string {
	cs := make([]wire.ChatCall, len(calls))
	for i, c := range calls {
		cs[i] = wire.ChatCall(c)
	}
	return string(head("chatcmpl-test").Completion(content, cs, wire.ChatUsage{Prompt: 10, Completion: 5, Cached: 2}))
}

// Chunk is one chat.completion.chunk in OpenAI's shape with the given delta (JSON) and finish
// reason ("" for null).
func Chunk(id, delta, finish string) string { return string(head(id).Chunk([]byte(delta), finish)) }

// UsageChunk is OpenAI's final usage chunk (empty choices).
func UsageChunk(id string, prompt, completion int) string {
	return string(head(id).UsageChunk(wire.ChatUsage{Prompt: prompt, Completion: completion, Cached: -1}))
}

// ContentChunks is an OpenAI-style streamed answer: a role chunk, one chunk per piece of text, a
// finish chunk.
func ContentChunks(id string, pieces ...string) []string {
	h := head(id)
	out := []string{string(h.Chunk(wire.ChatRoleDelta(false), ""))}
	for _, p := range pieces {
		out = append(out, string(h.Chunk(wire.ChatTextDelta(p), "")))
	}
	return append(out, string(h.Chunk([]byte(`{}`), "stop")))
}

// ToolCallChunks streams tool calls the way OpenAI does: per call, a first delta with index, id,
// type and name, then the arguments split into pieces of at most split bytes; then the
// tool_calls finish chunk.
func ToolCallChunks(id string, split int, calls ...Call) []string {
	h := head(id)
	out := []string{string(h.Chunk(wire.ChatRoleDelta(true), ""))}
	for i, c := range calls {
		out = append(out, string(h.Chunk(wire.ChatCallDelta(i, c.ID, c.Name), "")))
		for a := c.Arguments; a != ""; {
			n := Cut(a, split)
			out = append(out, string(h.Chunk(wire.ChatArgumentsDelta(i, a[:n]), "")))
			a = a[n:]
		}
	}
	return append(out, string(h.Chunk([]byte(`{}`), "tool_calls")))
}

// Cut is where a piece of at most n bytes of s ends at a character's boundary (at least one
// character, for n > 0): a streamed piece of a string is valid UTF-8, as a provider streams it.
func Cut(s string, n int) int {
	switch {
	case n >= len(s):
		return len(s)
	case n <= 0:
		return 0
	}
	for i := n; i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return i
		}
	}
	_, size := utf8.DecodeRuneInString(s)
	return size
}

// Args encodes tool arguments.
func Args(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Join joins chunk lists.
func Join(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// LastUserMessage is the client's text of the last user message of a chat request body.
func LastUserMessage(body []byte) string {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &req)
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == "user" {
			var s string
			if json.Unmarshal(req.Messages[i].Content, &s) == nil {
				return demo.ClientText(s)
			}
			return strings.TrimSpace(string(req.Messages[i].Content))
		}
	}
	return ""
}

// HostileBody is a chat request body of about size bytes shaped to make a proxy work hard: the
// shapes a security probe used (millions of tiny elements where the API wants objects).
type HostileBody struct {
	Name string
	Body []byte
}

// HostileBodies are the hostile shapes, each of about size bytes.
func HostileBodies(size int) []HostileBody {
	repeat := func(prefix, elem, suffix string) []byte {
		n := (size - len(prefix) - len(suffix)) / (len(elem) + 1)
		var b bytes.Buffer
		b.Grow(size)
		b.WriteString(prefix)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(elem)
		}
		b.WriteString(suffix)
		return b.Bytes()
	}
	user := `{"role":"user","content":"x"}`
	return []HostileBody{
		{"ToolsOfZeros", repeat(`{"messages":[`+user+`],"tools":[`, "0", `]}`)},
		{"MessagesOfZeros", repeat(`{"messages":[`+user+`,`, "0", `]}`)},
		{"MessagesOfEmptyObjects", repeat(`{"messages":[`, "{}", `]}`)},
		{"ToolsOfEmptyObjects", repeat(`{"messages":[`+user+`],"tools":[`, "{}", `]}`)},
		{"ToolsWithNames", repeat(`{"messages":[`+user+`],"tools":[`, `{"function":{"name":"f"}}`, `]}`)},
		{"OneLongMessage", []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("x", size-50) + `"}]}`)},
	}
}

// ChatBody is a realistic chat request of about size bytes: a system prompt, a conversation,
// two client tools and vendor fields.
func ChatBody(size int) []byte {
	var msgs []string
	msgs = append(msgs, `{"role":"system","content":"You are a careful research assistant. Cite sources."}`)
	line := strings.Repeat("The soil carbon literature is vast and uneven. ", 4)
	for total := 0; total < size-400; total += 2 * (len(line) + 40) {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, line), fmt.Sprintf(`{"role":"assistant","content":%q}`, line))
	}
	return []byte(`{"model":"gpt-4o","temperature":0.3,"top_k":40,"chat_template_kwargs":{"enable_thinking":false},"messages":[` +
		strings.Join(msgs, ",") + `],"tools":[{"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}},` +
		`{"type":"function","function":{"name":"fetch","parameters":{"type":"object","properties":{"url":{"type":"string"}}}}}]}`)
}
