package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// modelTiming is how a model server answers: the first chunk of a streamed answer after TTFT,
// then the others Interval apart; a non-streamed answer after the same total.
type modelTiming struct {
	TTFT     time.Duration
	Chunks   int
	Interval time.Duration
}

// defaultModelTiming is a hosted model's: 400 ms to the first token, then 40 chunks at 25 ms.
var defaultModelTiming = modelTiming{TTFT: 400 * time.Millisecond, Chunks: 40, Interval: 25 * time.Millisecond}

// total is the time from the request to the last chunk (the first chunk at TTFT, the last one
// Chunks-1 intervals later).
func (t modelTiming) total() time.Duration {
	return t.TTFT + time.Duration(max(t.Chunks-1, 0))*t.Interval
}

// flags registers the timing's flags on fs, with t's values as their defaults.
func (t *modelTiming) flags(fs *flag.FlagSet) {
	fs.DurationVar(&t.TTFT, "ttft", t.TTFT, "time to the first token")
	fs.IntVar(&t.Chunks, "chunks", t.Chunks, "chunks of a streamed answer (the first at -ttft)")
	fs.DurationVar(&t.Interval, "interval", t.Interval, "time between two chunks")
}

// toolRoundHeader asks the model upstream for a round with a workspace call first: a request
// that carries it and whose last message is not a tool result is answered with an
// update_preferences call on the thread's first preference. A proxy forwards it as any header.
const toolRoundHeader = "X-Load-Tool-Round"

// toolArguments are the arguments of the model's workspace call.
const toolArguments = `{"updates":[{"index":1,"subtitle":"measured"}],"action_and_reasoning":"load"}`

// modelUpstream answers chat completions with a model's timing: text in Chunks pieces, or (see
// toolRoundHeader) a workspace call whose arguments come in Chunks pieces at the same pace. A
// streamed answer ends with the usage when the request asks for it (stream_options.include_usage,
// as wsproxy does).
type modelUpstream struct {
	timing modelTiming
}

const modelChunkPrefix = `{"id":"chatcmpl-model","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,"delta":`

func (m *modelUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	start := time.Now()
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	toolCall := r.Header.Get(toolRoundHeader) != "" && (len(req.Messages) == 0 || req.Messages[len(req.Messages)-1].Role != "tool")
	if !req.Stream {
		m.answerJSON(w, r, start, toolCall)
		return
	}
	pieces := textPieces(m.timing.Chunks)
	if toolCall {
		pieces = argumentPieces(m.timing.Chunks)
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 512)
	for i, piece := range pieces {
		if !sleepUntil(r, start.Add(m.timing.TTFT+time.Duration(i)*m.timing.Interval)) {
			return
		}
		if i == 0 {
			w.Header().Set("Content-Type", "text/event-stream")
		}
		buf = append(buf[:0], "data: "+modelChunkPrefix...)
		switch {
		case toolCall && i == 0:
			buf = append(buf, `{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_load","type":"function","function":{"name":"update_preferences","arguments":`...)
			buf = strconv.AppendQuote(buf, piece)
			buf = append(buf, `}}]}`...)
		case toolCall:
			buf = append(buf, `{"tool_calls":[{"index":0,"function":{"arguments":`...)
			buf = strconv.AppendQuote(buf, piece)
			buf = append(buf, `}}]}`...)
		case i == 0:
			buf = append(buf, `{"role":"assistant","content":`...)
			buf = strconv.AppendQuote(buf, piece)
			buf = append(buf, '}')
		default:
			buf = append(buf, `{"content":`...)
			buf = strconv.AppendQuote(buf, piece)
			buf = append(buf, '}')
		}
		buf = append(buf, `,"finish_reason":null}]}`+"\n\n"...)
		if i == len(pieces)-1 { // the finish chunk, the usage and [DONE] leave with the last piece
			finish := "stop"
			if toolCall {
				finish = "tool_calls"
			}
			buf = append(buf, "data: "+modelChunkPrefix+`{},"finish_reason":"`+finish+`"}]}`+"\n\n"...)
			if req.StreamOptions.IncludeUsage {
				buf = append(buf, `data: {"id":"chatcmpl-model","object":"chat.completion.chunk","created":1,"model":"bench","choices":[],"usage":{"prompt_tokens":300,"completion_tokens":40,"total_tokens":340}}`+"\n\n"...)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if _, err := w.Write(buf); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// answerJSON answers a non-streamed request after the stream's total time.
func (m *modelUpstream) answerJSON(w http.ResponseWriter, r *http.Request, start time.Time, toolCall bool) {
	if !sleepUntil(r, start.Add(m.timing.total())) {
		return
	}
	message := `{"role":"assistant","content":` + strconv.Quote(strings.Join(textPieces(m.timing.Chunks), "")) + `}`
	finish := "stop"
	if toolCall {
		message = `{"role":"assistant","content":null,"tool_calls":[{"id":"call_load","type":"function","function":{"name":"update_preferences","arguments":` + strconv.Quote(toolArguments) + `}}]}`
		finish = "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"id":"chatcmpl-model","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":` + message +
		`,"finish_reason":"` + finish + `"}],"usage":{"prompt_tokens":300,"completion_tokens":40,"total_tokens":340}}`))
}

// sleepUntil waits until t; false when the client left first (a chunk written after it left
// fails, which ends the stream too).
func sleepUntil(r *http.Request, t time.Time) bool {
	time.Sleep(time.Until(t))
	return r.Context().Err() == nil
}

// textPieces are the n pieces of a text answer (about a token each).
func textPieces(n int) []string {
	p := make([]string, max(n, 1))
	for i := range p {
		p[i] = " word"
	}
	p[0] = "Soil"
	return p
}

// argumentPieces are toolArguments in n pieces (as even as its length allows; empty ones when
// n is larger than it).
func argumentPieces(n int) []string {
	n = max(n, 1)
	p := make([]string, n)
	for i := range p {
		p[i] = toolArguments[i*len(toolArguments)/n : (i+1)*len(toolArguments)/n]
	}
	return p
}

// statsPath serves a process's figures to the latency harness: JSON, and with ?reset the peak
// starts again from what is open now.
const statsPath = "/_load/stats"

// loadStats are the figures of the harness's own processes (the model upstream, the bare
// proxy).
type loadStats struct {
	Goroutines int   `json:"goroutines"`
	Open       int64 `json:"open_connections"`
	Peak       int64 `json:"peak_open_connections"`
	Accepted   int64 `json:"accepted_connections"`
}

// connCounter counts a server's connections (its connState is the http.Server's ConnState) and
// serves them with the process's goroutines at statsPath.
type connCounter struct {
	open, peak, accepted atomic.Int64
}

func (c *connCounter) connState(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		c.accepted.Add(1)
		n := c.open.Add(1)
		for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
		}
	case http.StateClosed, http.StateHijacked:
		c.open.Add(-1)
	}
}

func (c *connCounter) serveStats(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("reset") {
		c.peak.Store(c.open.Load())
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(loadStats{Goroutines: runtime.NumGoroutine(), Open: c.open.Load(), Peak: c.peak.Load(), Accepted: c.accepted.Load()})
}

// serveCounted serves h on a new listener at addr, printing its address first (as spawn
// expects), its connections counted and served at statsPath.
func serveCounted(addr string, h http.Handler) error {
	c := &connCounter{}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	srv := &http.Server{ReadHeaderTimeout: time.Minute, ConnState: c.connState, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == statsPath {
			c.serveStats(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})}
	return srv.Serve(ln)
}

func modelCmd(args []string) error {
	fs := flag.NewFlagSet("model", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	timing := defaultModelTiming
	timing.flags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return serveCounted(*addr, &modelUpstream{timing: timing})
}
