package fake_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// BenchmarkChat is the fake's own cost of a chat completion, with no pacing: a constant answer
// (encoded once, then written), and a tool round's (encoded for each request).
func BenchmarkChat(b *testing.B) {
	const body = `{"model":"m","stream":%s,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		name   string
		stream string
		tool   bool
	}{{"Stream", "true", false}, {"JSON", "false", false}, {"ToolStream", "true", true}, {"ToolJSON", "false", true}} {
		b.Run(c.name, func(b *testing.B) {
			m := fake.New(fake.Options{Timing: fake.Timing{Chunks: 40}, ToolRound: c.tool})
			req := strings.Replace(body, "%s", c.stream, 1)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				m.ServeHTTP(w, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(req)))
				if w.Code != 200 {
					b.Fatal(w.Code, w.Body.String())
				}
			}
		})
	}
}
