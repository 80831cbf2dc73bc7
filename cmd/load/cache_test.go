package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPromptCacheRule: the model follows OpenAI's published rule — the longest common prefix
// with an earlier request of the same key, in 128-token steps, nothing under 1,024 — over the
// prompt as a model renders it, not the request's JSON bytes.
func TestPromptCacheRule(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0, cachedTokens(1023))
	require.Equal(t, 1024, cachedTokens(1024))
	require.Equal(t, 1024, cachedTokens(1151))
	require.Equal(t, 1152, cachedTokens(1152))

	c := newPromptCache()
	long := strings.Repeat("x", 8000) // 2,000 tokens
	req := func(key, model, last string) cacheRequest {
		return cacheRequest{Model: model, PromptCacheKey: key, Messages: []cacheMessage{
			{Role: "system", Content: []byte(`"` + long + `"`)}, {Role: "user", Content: []byte(`"` + last + `"`)}}}
	}
	p, cached := c.usage(req("", "m", "a"))
	require.Zero(t, cached, "nothing seen yet")
	require.Equal(t, len(renderPrompt(req("", "m", "a")))/bytesPerToken, p)
	_, cached = c.usage(req("", "m", "b"))
	require.Equal(t, 1920, cached, "the shared system prompt, rounded down to 128 tokens")
	_, cached = c.usage(req("", "other", "b"))
	require.Zero(t, cached, "another model has a cache of its own")
	_, cached = c.usage(req("k", "m", "b"))
	require.Zero(t, cached, "so has a prompt_cache_key")

	// Member order in the JSON does not matter; the rendered text does.
	a := renderPrompt(cacheRequest{Tools: []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"f"}}`)}})
	b := renderPrompt(cacheRequest{Tools: []json.RawMessage{json.RawMessage(`{"function":{"name":"f"},"type":"function"}`)}})
	require.Equal(t, a, b)
}
