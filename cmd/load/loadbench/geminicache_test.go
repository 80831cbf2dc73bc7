package loadbench

import (
	"strings"
	"testing"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// TestGeminiAgentLoopDirect: the Gemini agent loop runs straight to the fake model, streamed:
// every turn is its function calls then the model's answer, and the implicit cache serves most
// of each prompt.
func TestGeminiAgentLoopDirect(t *testing.T) {
	up := upstreamtest.Fake(t, fake.Options{PromptCache: true, Script: cacheScript})
	f, err := runGeminiSession(strings.TrimSuffix(up.URL, "/v1"), cacheWay{name: "direct"}, "")
	if err != nil {
		t.Fatal(err)
	}
	reqs := up.Requests()
	if want := geminiTurns * (geminiTurnSteps + 1); len(reqs) != want || f.hitRate() < 0.9 {
		t.Fatalf("%d requests, %d expected; figures %+v (hit rate %.2f)", len(reqs), want, f, f.hitRate())
	}
	if p := reqs[0].Path; p != "/v1beta/models/gemini-cache-direct:streamGenerateContent?alt=sse" {
		t.Fatalf("path %s", p)
	}
}
