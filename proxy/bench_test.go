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
	"strings"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
)

// chatBody is a realistic chat request of about size bytes: a system prompt, a conversation,
// two client tools and vendor fields.
func chatBody(size int) []byte {
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

func BenchmarkRewrite(b *testing.B) {
	block := tools.TailInstructions + "\n\n" + tools.RenderBlock("Write a review", []tools.Preference{{Title: "Formal", Kind: "hard"}, {Title: "Short", Kind: "soft"}})
	for _, size := range []int{1 << 10, 100 << 10} {
		body := chatBody(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.Logf("request body: %d bytes", len(body))
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				req, err := ParseChatRequest(body)
				if err != nil {
					b.Fatal(err)
				}
				req.InjectWorkspace(block, PlaceTail)
				_ = req.Body(true)
			}
		})
	}
}

// BenchmarkSSEDecode: one upstream content chunk read, decoded and re-encoded for the client.
func BenchmarkSSEDecode(b *testing.B) {
	chunk := "data: " + upstreamtest.Chunk("chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", `{"content":" the"}`, "") + "\n\n"
	req, _ := ParseChatRequest([]byte(`{"messages":[]}`))
	stream := strings.NewReader(strings.Repeat(chunk, 1024))
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)))
	var out []byte
	s := newChatSSE(req, nil, nil, "", emitFunc(func(c []byte) error { out = sse.AppendEvent(out[:0], c); return nil }))
	r := sse.NewReader(stream)
	for b.Loop() {
		data, err := r.Next()
		if err == io.EOF {
			stream.Reset(strings.Repeat(chunk, 1024))
			r = sse.NewReader(stream)
			s.rd = newStreamRound()
			continue
		}
		if err := s.chunk(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSSEEncode: one chunk written as an event.
func BenchmarkSSEEncode(b *testing.B) {
	chunk := []byte(upstreamtest.Chunk("chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", `{"content":" the"}`, ""))
	b.ReportAllocs()
	var out []byte
	for b.Loop() {
		out = sse.AppendEvent(out[:0], chunk)
	}
}

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
			body, path := chatBody(1<<10), "/v1/chat/completions"
			if tc.responses {
				// The same conversation as Responses input items.
				body, path = bytes.Replace(body, []byte(`"messages":`), []byte(`"input":`), 1), "/v1/responses"
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			var clients atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				thread := fmt.Sprintf("bench-%d", clients.Add(1))
				if _, err := e.store.Workspace(tools.ThreadID{Name: thread}).AddPreference(context.Background(), tools.PreferenceInput{Title: "Formal"}); err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					req, _ := http.NewRequest("POST", e.srv.URL+path, bytes.NewReader(body))
					req.Header.Set("X-Thread-Id", thread)
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Error(resp.Status)
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
	body := chatBody(1 << 10)
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

// BenchmarkHostileBodies: the rewrite of 8 MiB bodies of the hostile shapes (a security probe's),
// as a thread turn does it: parse, inject, the upstream body. B/op over the body's size is the
// memory a shape costs; a refused shape costs its parse.
func BenchmarkHostileBodies(b *testing.B) {
	block := tools.TailInstructions + "\n\n" + tools.RenderBlock("", nil)
	for _, hb := range upstreamtest.HostileBodies(8 << 20) {
		b.Run(hb.Name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(hb.Body)))
			var allocated uint64
			for b.Loop() {
				req, err := ParseChatRequest(hb.Body)
				if err != nil {
					continue // refused: a 400 naming the index
				}
				req.InjectWorkspace(block, PlaceTail)
				allocated += uint64(req.Body(true).Len())
				_ = req.IsClientTool("get_weather")
			}
		})
	}
}
