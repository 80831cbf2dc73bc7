package proxy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

// member is the raw value of a top-level member of a JSON body.
func member(t *testing.T, body []byte, key string) string {
	t.Helper()
	o, err := rawjson.Parse(body)
	require.NoError(t, err)
	return string(o.Get(key))
}

// TestPromptCacheFriendly: the requests of a conversation share their history as a byte prefix,
// whatever the workspace does (docs/spec.md §3.1): earlier messages keep their bytes, a tool round only
// appends, the tool list is the same bytes on every thread, and a thread's prompt_cache_key is
// stable, opaque and the client's own when it sent one.
func TestPromptCacheFriendly(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.PromptCacheKey = PromptCacheKeyThread })
	add := call{ID: "c1", Name: "add_preferences", Arguments: `{"items":[{"title":"Short paragraphs"}],"action_and_reasoning":"stated"}`}
	e.up.Script(reply(cmpl("", add)), reply(cmpl("Noted.")), reply(cmpl("Hello again.")), reply(cmpl("Other thread.")))
	history := `{"role":"system","content":"Be brief."},{"role":"user","content":"I prefer short paragraphs."}`
	tools_ := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	post := func(thread, msgs string) {
		resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": thread}, `{"model":"m","tools":`+tools_+`,"messages":[`+msgs+`]}`)
		require.Equal(t, 200, resp.StatusCode)
		testkit.ReadBody(t, resp)
	}
	post("cache", history)
	post("cache", history+`,{"role":"assistant","content":"Noted."},{"role":"user","content":"Hi!"}`)
	post("cache-2", `{"role":"user","content":"Hi"}`)
	reqs := e.up.Requests()
	require.Len(t, reqs, 4)

	// Round 2 of turn 1 starts with round 1's messages, byte for byte, then appends.
	m1, m2 := member(t, reqs[0].Body, "messages"), member(t, reqs[1].Body, "messages")
	require.True(t, strings.HasPrefix(m2, m1[:len(m1)-1]+","), "round 2 appends to round 1:\n%s\n%s", m1, m2)
	// Turn 2 shares the history up to the end of the user's own text of turn 1.
	m3 := member(t, reqs[2].Body, "messages")
	shared := `[` + history[:len(history)-2]
	require.True(t, strings.HasPrefix(m1, shared) && strings.HasPrefix(m3, shared), "%s\n%s", m1, m3)
	require.Contains(t, m3, `"Hi!\n\nINSTR\n\n<workspace>\nObjective: (none yet)\nPreferences:\n#1 [soft] Short paragraphs\n</workspace>"`)

	// The tool list: the same bytes on both threads and in every round offering the workspace tools.
	for _, r := range reqs[1:] {
		require.Equal(t, member(t, reqs[0].Body, "tools"), member(t, r.Body, "tools"))
	}
	require.True(t, strings.HasPrefix(member(t, reqs[0].Body, "tools"), tools_[:len(tools_)-1]+","))

	// prompt_cache_key: stable per thread, distinct between threads, never the thread id.
	k1, k2, k3 := member(t, reqs[0].Body, "prompt_cache_key"), member(t, reqs[2].Body, "prompt_cache_key"), member(t, reqs[3].Body, "prompt_cache_key")
	require.Equal(t, k1, k2)
	require.NotEqual(t, k1, k3)
	require.Regexp(t, `^"wsp_[0-9a-f]{32}"$`, k1)
	require.NotContains(t, k1, "cache")
	e.up.Script(reply(cmpl("ok")))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "cache"}, `{"prompt_cache_key":"mine","messages":[]}`)
	testkit.ReadBody(t, resp)
	require.Equal(t, `"mine"`, member(t, e.up.Requests()[4].Body, "prompt_cache_key"), "the client's own key is kept")

	// With the default (auto) and an upstream that is not OpenAI's, no key is set.
	e3 := setup(t)
	e3.up.Script(reply(cmpl("ok")))
	testkit.ReadBody(t, e3.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t"}, `{"messages":[]}`))
	require.Empty(t, member(t, e3.up.Requests()[0].Body, "prompt_cache_key"))
}

// TestUsagePerThread: the usage the upstream reported, cached tokens included, is summed over a
// turn's rounds and kept per thread; a streamed turn whose client did not ask for usage is
// counted too (the proxy asks the upstream and keeps the usage chunk from the client).
func TestUsagePerThread(t *testing.T) {
	t.Parallel()
	e := setup(t)
	add := call{ID: "c1", Name: "set_objective", Arguments: `{"text":"Count tokens","action_and_reasoning":"goal"}`}
	e.up.Script(reply(cmpl("", add)), reply(cmpl("Done.")))
	testkit.ReadBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "usage"}, `{"messages":[{"role":"user","content":"go"}]}`))
	require.Eventually(t, func() bool { return e.workspace("usage").Usage.PromptTokens == 20 }, 5e9, 1e7)
	require.Equal(t, workspace.Usage{PromptTokens: 20, CachedPromptTokens: 4, CompletionTokens: 10}, e.workspace("usage").Usage)

	usageChunk := `{"id":"s","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":7,"total_tokens":107,"prompt_tokens_details":{"cached_tokens":64}}}`
	e.up.Script(upstreamtest.Stream(append(upstreamtest.ContentChunks("s", "Hi"), usageChunk)...))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "usage"},
		`{"stream":true,"stream_options":{"x":1},"messages":[{"role":"user","content":"go"}]}`)
	body := streamBody(t, resp)
	require.NotContains(t, body, `"prompt_tokens"`, "the client did not ask for usage")
	var sent struct {
		StreamOptions map[string]any `json:"stream_options"`
	}
	require.NoError(t, json.Unmarshal(e.up.Requests()[2].Body, &sent))
	require.Equal(t, map[string]any{"x": 1.0, "include_usage": true}, sent.StreamOptions)
	require.Eventually(t, func() bool { return e.workspace("usage").Usage.PromptTokens == 120 }, 5e9, 1e7)
	require.Equal(t, workspace.Usage{PromptTokens: 120, CachedPromptTokens: 68, CompletionTokens: 17}, e.workspace("usage").Usage)
}
