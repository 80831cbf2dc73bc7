// Package fake is a configurable fake model server: one http.Handler that speaks chat
// completions, Anthropic's Messages API and Google's Gemini API, JSON and server-sent events, for load runs,
// benchmarks and tests that need a model rather than a script of replies (for those,
// upstreamtest).
//
// What it answers is a Script's (by default: a text of Timing.Chunks words, or a workspace
// call when the request asks for a tool round); its options say how:
//
//   - Timing: a hosted model's pace (the first piece of a stream after TTFT, the others
//     Interval apart, a JSON answer after the same total), or, when zero, as fast as it can:
//     the whole stream in writes of 4 KiB, as a fast server would;
//   - ToolRound: every turn's first round is a workspace call (ToolRoundHeader asks the same of
//     one request);
//   - PromptCache: usage by the provider's prompt-cache rule (OpenAI's for chat completions,
//     Anthropic's for the Messages API, Gemini's implicit caching for the Gemini API) instead of
//     fixed figures;
//   - API: the wire API of every path, or by path (…/messages is the Messages API,
//     …/models/{model}:generateContent and :streamGenerateContent the Gemini API);
//   - Faults: shares of requests answered with a 503, a closed connection, a stall or a body cut
//     short.
//
// The answers of the default script, with no faults, are encoded once and kept: the fake's
// own CPU stays out of what a load run measures. A workspace call is encoded for each: each one
// sets another subtitle (WorkspaceCall), so that every tool round writes.
package fake

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wsproxy/wsproxy/proxy/demo"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// Timing is how a model answers: the first piece of a streamed answer after TTFT, then the
// others Interval apart; a non-streamed answer after the same total. Chunks is the number of
// pieces of an answer (its text, or each call's arguments); at most 1 is one piece.
type Timing struct {
	TTFT     time.Duration
	Chunks   int
	Interval time.Duration
}

// HostedTiming is a hosted model's: 400 ms to the first token, then 40 chunks at 25 ms.
var HostedTiming = Timing{TTFT: 400 * time.Millisecond, Chunks: 40, Interval: 25 * time.Millisecond}

// Total is the time from the request to the last piece (the first at TTFT, the last one
// Chunks-1 intervals later).
func (t Timing) Total() time.Duration {
	return t.TTFT + time.Duration(max(t.Chunks-1, 0))*t.Interval
}

// pieces is the number of pieces of an answer.
func (t Timing) pieces() int { return max(t.Chunks, 1) }

// API is a wire API the fake speaks.
type API string

const (
	// Chat is OpenAI's chat completions.
	Chat API = "chat"
	// Messages is Anthropic's Messages API.
	Messages API = "messages"
	// Gemini is Google's Gemini API (generateContent, streamGenerateContent).
	Gemini API = "gemini"
)

// Faults are the shares of requests (0 to 1, summed at most 1) the fake answers wrongly.
type Faults struct {
	Status  float64 // a 503 with the API's error body
	Reset   float64 // the connection closed, nothing answered
	Stall   float64 // nothing answered for StallFor (or until the client leaves)
	BadJSON float64 // a 200 whose JSON body is cut short
	// StallFor is how long a stall lasts.
	StallFor time.Duration
}

func (f Faults) any() bool { return f.Status+f.Reset+f.Stall+f.BadJSON > 0 }

// The names of the faults, as Model.Injected counts them.
const (
	FaultStatus  = "upstream 503"
	FaultReset   = "connection reset"
	FaultStall   = "stall"
	FaultBadJSON = "invalid JSON"
)

// Options configure a Model.
type Options struct {
	Timing Timing
	// ToolRound answers every request whose last message is not a tool result with the
	// next workspace call (WorkspaceCall), whatever the script; without it, only requests that carry
	// ToolRoundHeader.
	ToolRound bool
	// Script decides the other answers; nil is DefaultScript.
	Script Script
	// PromptCache answers usage by the provider's prompt-cache rule (a cache per Model):
	// OpenAI's for chat completions, Anthropic's for the Messages API, Gemini's implicit caching
	// for the Gemini API. Without it, usage is fixed: 300 tokens in, 40 out.
	PromptCache bool
	// API is the wire API of every request; "" chooses by path: a path ending in /messages is
	// the Messages API, one ending in :generateContent or :streamGenerateContent the Gemini API
	// (the model and whether it streams read from the path), any other chat completions.
	API    API
	Faults Faults
}

// ToolRoundHeader asks the fake for a round with a workspace call first: a request that carries
// it and whose last message is not a tool result is answered with the next WorkspaceCall. A proxy
// forwards it as any header.
const ToolRoundHeader = "X-Load-Tool-Round"

// ToolArguments are the arguments of the n-th workspace call a Model answers (from 1): the
// thread's first preference's subtitle set to "measured n". No two calls of a Model set the same
// subtitle, so every tool round changes the item it updates — a write, with its event — whatever
// thread it runs on, as a model's real call would.
func ToolArguments(n int64) string {
	return `{"updates":[{"index":1,"subtitle":"measured ` + strconv.FormatInt(n, 10) + `"}],"action_and_reasoning":"load"}`
}

// WorkspaceCall is the n-th workspace call of a Model, a tool round's.
func WorkspaceCall(n int64) Call {
	return Call{ID: "call_load", Name: "update_preferences", Arguments: ToolArguments(n)}
}

// Call is a tool call of an answer; Arguments is JSON.
type Call struct {
	ID, Name, Arguments string
}

// Answer is what the model answers: text, tool calls, or both.
type Answer struct {
	Text string
	// Pieces, when set, are how a stream sends the text (Text is then their concatenation);
	// else the text is cut into Timing.Chunks pieces of about the same length.
	Pieces []string
	Calls  []Call
}

func (a Answer) text() string {
	if a.Pieces != nil {
		return strings.Join(a.Pieces, "")
	}
	return a.Text
}

// Script decides a request's answer.
type Script func(r *Request) Answer

// DefaultScript answers a text of Timing.Chunks words ("Soil word word …"); a request with the
// member "big_stream": true gets about 10 MB of text instead, in pieces of 64 bytes (for memory
// measurements).
func DefaultScript(t Timing) Script {
	text := Answer{Pieces: wordPieces(t.pieces())}
	return func(r *Request) Answer {
		if r.BigStream {
			return bigAnswer
		}
		return text
	}
}

// wordPieces are n pieces of a text answer (about a token each).
func wordPieces(n int) []string {
	p := make([]string, max(n, 1))
	for i := range p {
		p[i] = " word"
	}
	p[0] = "Soil"
	return p
}

// bigAnswer is about 10 MB of events.
var bigAnswer = func() Answer {
	p := make([]string, 10<<20/120)
	for i := range p {
		p[i] = strings.Repeat("x", 64)
	}
	return Answer{Pieces: p}
}()

// Request is what the fake reads of a request, in either API.
type Request struct {
	API    API         `json:"-"`
	Header http.Header `json:"-"`

	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	PromptCacheKey string          `json:"prompt_cache_key"`
	BigStream      bool            `json:"big_stream"`
	System         json.RawMessage `json:"system"` // Messages
	// Tools are the tools offered: a Gemini request's functionDeclarations, each a tool.
	Tools    []json.RawMessage `json:"tools"`
	Messages []Message         `json:"messages"` // a Gemini request's contents
	// Gemini
	Contents          []Message       `json:"contents"`
	SystemInstruction json.RawMessage `json:"systemInstruction"`
}

// Message is a message of a request. In the Messages API, Content is a string or blocks; in the
// Gemini API, a content's role is user or model and its parts are Parts.
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Parts      json.RawMessage `json:"parts"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

// Text is the message's content as text: the string, or its parts' texts.
func (m Message) Text() string {
	if m.Content == nil {
		return demo.ContentText(m.Parts)
	}
	return demo.ContentText(m.Content)
}

// Blocks are a Messages message's content blocks (none for a string).
func (m Message) Blocks() []Block {
	var b []Block
	_ = json.Unmarshal(m.Content, &b)
	return b
}

// Block is what the fake reads of a content block.
type Block struct {
	Type      string `json:"type"`
	ToolUseID string `json:"tool_use_id"`
}

// ToolNames are the names of the tools the request offers.
func (r *Request) ToolNames() map[string]bool {
	out := map[string]bool{}
	for _, t := range r.Tools {
		var d struct {
			Name     string                `json:"name"`     // Messages
			Function struct{ Name string } `json:"function"` // chat completions
		}
		_ = json.Unmarshal(t, &d)
		if r.API != Chat {
			out[d.Name] = true
		} else {
			out[d.Function.Name] = true
		}
	}
	return out
}

// AfterToolResult reports whether the request's last message is a tool's result: a tool message
// (chat), a user message with a tool_result block (Messages), a content with a functionResponse
// part (Gemini).
func (r *Request) AfterToolResult() bool {
	if len(r.Messages) == 0 {
		return false
	}
	last := r.Messages[len(r.Messages)-1]
	if r.API == Gemini {
		for _, p := range last.GeminiParts() {
			if p.FunctionResponse != nil {
				return true
			}
		}
		return false
	}
	if r.API == Messages {
		for _, b := range last.Blocks() {
			if b.Type == "tool_result" {
				return true
			}
		}
		return false
	}
	return last.Role == "tool"
}

// Model is the fake model server.
type Model struct {
	opts      Options
	script    Script
	constant  bool // the script is the default one: its answers are encoded once (memo)
	memo      sync.Map
	openai    *openAICache
	anthropic *anthropicCache
	google    *geminiCache

	mu       sync.Mutex
	injected map[string]int
	// calls counts the workspace calls answered (WorkspaceCall's n).
	calls atomic.Int64
}

// New is a fake model server with opts.
func New(opts Options) *Model {
	m := &Model{opts: opts, script: opts.Script, injected: map[string]int{}}
	if m.script == nil {
		m.script, m.constant = DefaultScript(opts.Timing), !opts.PromptCache
	}
	if opts.PromptCache {
		m.openai, m.anthropic, m.google = newOpenAICache(), newAnthropicCache(), newGeminiCache()
	}
	return m
}

// Injected counts the faults injected so far, by name (FaultStatus, …).
func (m *Model) Injected() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int, len(m.injected))
	for k, v := range m.injected {
		out[k] = v
	}
	return out
}

func (m *Model) api(r *http.Request) API {
	if m.opts.API != "" {
		return m.opts.API
	}
	if strings.HasSuffix(r.URL.Path, "/messages") {
		return Messages
	}
	if geminiMethod(r.URL.Path) != "" {
		return Gemini
	}
	return Chat
}

func (m *Model) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	req := &Request{API: m.api(r), Header: r.Header}
	body, _ := io.ReadAll(r.Body)
	err := json.Unmarshal(body, req)
	if req.API == Gemini {
		req.fromGemini(r.URL.Path)
	}
	if err != nil || len(req.Messages) == 0 {
		writeError(w, req.API, http.StatusBadRequest, "invalid_request_error", "bad request")
		return
	}
	if m.opts.Faults.any() && m.fault(w, r, req.API) {
		return
	}
	tool := (m.opts.ToolRound || r.Header.Get(ToolRoundHeader) != "") && !req.AfterToolResult()
	switch req.API {
	case Messages:
		m.messages(w, r, req, tool, start)
		return
	case Gemini:
		m.gemini(w, r, req, tool, start)
		return
	}
	m.chat(w, r, req, tool, start)
}

// answer is the request's answer: the next workspace call for a tool round, or the script's.
func (m *Model) answer(req *Request, tool bool) Answer {
	if tool {
		return Answer{Calls: []Call{WorkspaceCall(m.calls.Add(1))}}
	}
	return m.script(req)
}

// fault injects a fault at the options' rates; false when the request is to be answered.
func (m *Model) fault(w http.ResponseWriter, r *http.Request, api API) bool {
	f := m.opts.Faults
	count := func(name string) {
		m.mu.Lock()
		m.injected[name]++
		m.mu.Unlock()
	}
	switch x := rand.Float64(); {
	case x < f.Status:
		count(FaultStatus)
		writeError(w, api, http.StatusServiceUnavailable, "overloaded", "overloaded")
	case x < f.Status+f.Reset:
		count(FaultReset)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	case x < f.Status+f.Reset+f.Stall:
		count(FaultStall)
		select {
		case <-r.Context().Done():
		case <-time.After(f.StallFor):
		}
	case x < f.Status+f.Reset+f.Stall+f.BadJSON:
		count(FaultBadJSON)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":`)
	default:
		return false
	}
	return true
}

// writeError answers an error in the API's shape.
func writeError(w http.ResponseWriter, api API, status int, typ, msg string) {
	if api == Gemini {
		writeGeminiError(w, status, msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if api == Messages {
		_, _ = w.Write(wire.MessagesError(typ, msg))
		return
	}
	_, _ = w.Write(wire.OpenAIError(msg, typ, "", ""))
}

// sleepUntil waits until t; false when the client left first (a piece written after it left
// fails, which ends the stream too).
func sleepUntil(r *http.Request, t time.Time) bool {
	time.Sleep(time.Until(t))
	return r.Context().Err() == nil
}

// writeEvents writes a stream's events, event i due at TTFT + i intervals after start: those due
// at once leave together, in writes of at most 4 KiB, each flushed.
func (m *Model) writeEvents(w http.ResponseWriter, r *http.Request, start time.Time, events [][]byte) {
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	t := m.opts.Timing
	var buf []byte
	send := func() bool {
		for len(buf) > 0 {
			n := min(len(buf), 4096)
			if _, err := w.Write(buf[:n]); err != nil {
				return false
			}
			if err := rc.Flush(); err != nil {
				return false
			}
			buf = buf[n:]
		}
		return true
	}
	for i, ev := range events {
		if due := start.Add(t.TTFT + time.Duration(i)*t.Interval); time.Until(due) > 0 {
			if !send() || !sleepUntil(r, due) {
				return
			}
		}
		buf = append(buf, ev...) // a copy: events may be the memo's
	}
	send()
}

// split cuts s into n pieces of about the same length (empty ones when n is larger than it),
// at rune boundaries.
func split(s string, n int) []string {
	n = max(n, 1)
	p := make([]string, n)
	from := 0
	for i := range p {
		to := (i + 1) * len(s) / n
		for to < len(s) && to > from && !runeStart(s[to]) {
			to--
		}
		to = max(to, from)
		p[i], from = s[from:to], to
	}
	return p
}

func runeStart(b byte) bool { return b&0xC0 != 0x80 }
