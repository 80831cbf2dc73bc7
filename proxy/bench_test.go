package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

// BenchmarkTurn is a whole thread turn over HTTP against an in-process upstream and real
// Postgres: without a tool call, and with one tool round.
func BenchmarkTurn(b *testing.B) {
	answer := []byte(upstreamtest.Completion("Here is the plan."))
	toolCall := []byte(upstreamtest.Completion("", upstreamtest.Call{ID: "c", Name: "update_preferences",
		Arguments: `{"updates":[{"index":1,"subtitle":"x"}],"action_and_reasoning":"bench"}`}))
	// The same turns on the Responses API (not stored: every round sends the whole input).
	rAnswer := []byte(upstreamtest.ResponseSpec{ID: "r", Flavor: upstreamtest.VLLM, Items: []upstreamtest.Item{upstreamtest.Message("m", "Here is the plan.")}}.JSON())
	rToolCall := []byte(upstreamtest.ResponseSpec{ID: "r", Flavor: upstreamtest.VLLM, Items: []upstreamtest.Item{upstreamtest.FunctionCall("f", "c", "update_preferences",
		`{"updates":[{"index":1,"subtitle":"x"}],"action_and_reasoning":"bench"}`)}}.JSON())
	for _, tc := range []struct {
		name      string
		replies   [][]byte
		traced    bool
		responses bool
	}{
		{"NoToolCall", [][]byte{answer}, false, false}, {"OneToolRound", [][]byte{toolCall, answer}, false, false},
		// With tracing on: every span sampled and exported (to a discarding exporter, in batches).
		{"OneToolRoundTraced", [][]byte{toolCall, answer}, true, false},
		{"ResponsesNoToolCall", [][]byte{rAnswer}, false, true}, {"ResponsesOneToolRound", [][]byte{rToolCall, rAnswer}, false, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var e *env
			if tc.traced {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				e = setupWithPool(b, dbtest.NewPool(b, &dbtest.Options{Tracer: db.NewTracer(tp)}), func(o *Options) { o.TracerProvider = tp })
			} else {
				e = setup(b)
			}
			e.up.Fallback = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				// A turn's first call gets the first reply, a call after tool results the last.
				body, _ := io.ReadAll(r.Body)
				reply := tc.replies[0]
				if bytes.Contains(body, []byte(`"role":"tool"`)) || bytes.Contains(body, []byte(`"function_call_output"`)) {
					reply = tc.replies[len(tc.replies)-1]
				}
				_, _ = w.Write(reply)
			}
			body, path := upstreamtest.ChatBody(1<<10), "/v1/chat/completions"
			if tc.responses {
				// The same conversation as Responses input items.
				body, path = bytes.Replace(body, []byte(`"messages":`), []byte(`"input":`), 1), "/v1/responses"
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			var clients atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				thread := fmt.Sprintf("bench-%d", clients.Add(1))
				if _, err := e.store.Workspace(workspace.ThreadID{Name: thread}).AddPreference(context.Background(), workspace.PreferenceInput{Title: "Formal"}); err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					req, _ := http.NewRequest("POST", e.srv.URL+path, bytes.NewReader(body))
					req.Header.Set("X-Thread-Id", thread)
					if !post200(b, client, req) {
						return
					}
				}
			})
		})
	}
}

// BenchmarkPassThrough: a request without a thread through wsproxy, and through a bare
// httputil.ReverseProxy for comparison, against the same in-process upstream.
func BenchmarkPassThrough(b *testing.B) {
	answer := []byte(upstreamtest.Completion("Here is the plan."))
	body := upstreamtest.ChatBody(1 << 10)
	run := func(b *testing.B, url string) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := client.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	e := setup(b)
	e.up.Fallback = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}
	b.Run("wsproxy", func(b *testing.B) { run(b, e.srv.URL+"/v1/chat/completions") })
	target, _ := url.Parse(e.up.Server.URL)
	bare := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }})
	defer bare.Close()
	b.Run("bare", func(b *testing.B) { run(b, bare.URL+"/v1/chat/completions") })
}

// BenchmarkMCPToolCall is one MCP tools/call over HTTP against real Postgres: the same
// update_preferences the tool round of BenchmarkTurn/OneToolRound runs, as one JSON-RPC request
// (MCP 2025-11-25, no handshake: the server keeps no session), with the admin token (the thread
// an argument) and with a thread token (checked against its link on every request).
func BenchmarkMCPToolCall(b *testing.B) {
	e := setup(b)
	var clients atomic.Int64 // each a thread of its own, in every run of the benchmark
	for _, tc := range []struct {
		name  string
		token func(thread string) string // "" is the admin token's
	}{
		{"AdminToken", nil},
		{"ThreadToken", func(thread string) string {
			var link struct{ Token string }
			e.admin("POST", "/admin/v1/threads/"+thread+"/links", map[string]any{"kind": "mcp"}, 201, &link)
			return link.Token
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				thread := fmt.Sprintf("mcp-%d", clients.Add(1))
				if _, err := e.store.Workspace(workspace.ThreadID{Name: thread}).AddPreference(context.Background(), workspace.PreferenceInput{Title: "Formal"}); err != nil {
					b.Error(err)
					return
				}
				token, args := adminToken, `{"thread":"`+thread+`","updates":[{"index":1,"subtitle":"x"}],"action_and_reasoning":"bench"}`
				if tc.token != nil {
					token, args = tc.token(thread), `{"updates":[{"index":1,"subtitle":"x"}],"action_and_reasoning":"bench"}`
				}
				body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"update_preferences","arguments":` + args + `}}`)
				for pb.Next() {
					req, _ := http.NewRequest("POST", e.srv.URL+"/mcp", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Accept", "application/json, text/event-stream")
					req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
					req.Header.Set("Authorization", "Bearer "+token)
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					out, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || !bytes.Contains(out, []byte(`updated #1`)) {
						b.Error(resp.Status, string(out))
						return
					}
				}
			})
		})
	}
}

// BenchmarkClientLimits is a thread turn and a pass-through without client keys (NoKey), of a
// client with a key but no counting (Key: the counter off, what a client cost before limits),
// and of one with its limits set and counted (KeyLimits: requests_per_minute, tokens_per_day,
// max_threads, never reached), each reporting the process's CPU time per request (cpu-ns/op: the
// proxy, the client and the upstream, all in-process; Postgres apart) beside the wall time.
// KeyLimits against NoKey is what make bench-load's keyed target compares.
func BenchmarkClientLimits(b *testing.B) {
	answer := []byte(upstreamtest.Completion("Here is the plan."))
	body := upstreamtest.ChatBody(1 << 10)
	lim := ClientLimits{RequestsPerMinute: 1 << 40, TokensPerDay: 1 << 50, MaxThreads: 1 << 20}
	for _, route := range []string{"Turn", "PassThrough"} {
		for _, mode := range []string{"NoKey", "Key", "KeyLimits"} {
			b.Run(route+"/"+mode, func(b *testing.B) {
				e := setup(b, func(o *Options) {
					o.UpstreamAPIKey = "sk-upstream-operator"
					if mode == "NoKey" {
						return
					}
					keys, err := ParseClientKeys("alice=" + limitsKey("alice"))
					if err != nil {
						b.Fatal(err)
					}
					o.ClientKeys = keys
					if mode == "KeyLimits" {
						o.Limits = func(string) ClientLimits { return lim }
					}
				})
				if mode == "Key" {
					e.proxy.stopLimits()
					e.proxy.counter, e.proxy.stopLimits = nil, func() {}
				}
				e.up.Fallback = func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write(answer)
				}
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
				var clients atomic.Int64
				b.ReportAllocs()
				before := cpuTime()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					thread := fmt.Sprintf("bench-%d", clients.Add(1))
					for pb.Next() {
						req, _ := http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", bytes.NewReader(body))
						if mode == "NoKey" {
							req.Header.Set("Authorization", "Bearer sk-client-upstream-key")
						} else {
							req.Header.Set("Authorization", "Bearer "+limitsKey("alice"))
						}
						if route == "Turn" {
							req.Header.Set("X-Thread-Id", thread)
						}
						if !post200(b, client, req) {
							return
						}
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// cpuTime is the CPU time the process has used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// post200 sends req, reads its answer whole, and reports whether it was a 200 (else the
// benchmark fails).
func post200(b *testing.B, client *http.Client, req *http.Request) bool {
	resp, err := client.Do(req)
	if err != nil {
		b.Error(err)
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Error(resp.Status)
		return false
	}
	return true
}
