package fake

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPromptCacheRule: the model follows OpenAI's published rule — the longest common prefix
// with an earlier request of the same key, in 128-token steps, nothing under 1,024 — over the
// prompt as a model renders it, not the request's JSON bytes.
func TestPromptCacheRule(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0, cachedTokens(1023))
	require.Equal(t, 1024, cachedTokens(1024))
	require.Equal(t, 1024, cachedTokens(1151))
	require.Equal(t, 1152, cachedTokens(1152))

	c := newOpenAICache()
	long := strings.Repeat("x", 8000) // 2,000 tokens
	req := func(key, model, last string) *Request {
		return &Request{Model: model, PromptCacheKey: key, Messages: []Message{
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
	a := renderPrompt(&Request{Tools: []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"f"}}`)}})
	b := renderPrompt(&Request{Tools: []json.RawMessage{json.RawMessage(`{"function":{"name":"f"},"type":"function"}`)}})
	require.Equal(t, a, b)
}

// TestAnthropicCacheRule: the Messages API's model follows Anthropic's published rule — a
// breakpoint writes the prefix up to its block (nothing under 1,024 tokens); a request reads the
// longest prefix written before that ends at a block boundary up to 20 blocks before one of its
// breakpoints; the cache is the model's — over the blocks as the model sees them, without their
// cache_control.
func TestAnthropicCacheRule(t *testing.T) {
	t.Parallel()
	c := newAnthropicCache()
	long := strings.Repeat("x", 8000) // 2,000 tokens
	mark := `,"cache_control":{"type":"ephemeral"}`
	req := func(model string, blocks ...string) *Request {
		content := "[" + strings.Join(blocks, ",") + "]"
		return &Request{API: Messages, Model: model, System: json.RawMessage(`[{"type":"text","text":"` + long + `"` + mark + `}]`),
			Messages: []Message{{Role: "user", Content: json.RawMessage(content)}}}
	}
	text := func(s string, marked bool) string {
		if marked {
			return `{"type":"text","text":"` + s + `"` + mark + `}`
		}
		return `{"type":"text","text":"` + s + `"}`
	}
	input, written, read := c.usage(req("m", text("a", true)))
	require.Zero(t, read, "nothing written yet")
	require.Greater(t, written, 2000)
	require.Less(t, input, 5)
	first := written

	_, written, read = c.usage(req("m", text("a", false), text("b", true)))
	require.Equal(t, first, read, "the earlier breakpoint's prefix, one block before the new one, without its cache_control")
	require.Less(t, written, 10, "the new block alone is written")

	_, _, read = c.usage(req("other", text("a", true)))
	require.Zero(t, read, "another model has a cache of its own")

	short := &Request{API: Messages, Model: "s", Messages: []Message{{Role: "user", Content: json.RawMessage(`[` + text("hi", true) + `]`)}}}
	_, written, _ = c.usage(short)
	require.Zero(t, written, "nothing under 1,024 tokens is cached")

	var far []string
	for i := range 25 {
		far = append(far, text(strconv.Itoa(i), false))
	}
	_, _, read = c.usage(req("m", append([]string{text("a", false)}, append(far, text("z", true))...)...))
	require.Greater(t, read, 1900, "the system breakpoint's prefix")
	require.Less(t, read, first, "not the prefix 26 blocks back from the last breakpoint")
}

// TestGeminiCacheRule: the Gemini API's model follows Google's implicit caching — the longest
// common prefix with an earlier request to the same model, no step, nothing under 1,024 tokens
// (Flash's minimum) — over the prompt as the model renders it (declarations, system, contents).
func TestGeminiCacheRule(t *testing.T) {
	t.Parallel()
	c := newGeminiCache()
	req := func(model, system, last string) *Request {
		return &Request{API: Gemini, Model: model, SystemInstruction: json.RawMessage(`{"parts":[{"text":"` + system + `"}]}`),
			Messages: []Message{{Role: "user", Parts: json.RawMessage(`[{"text":"` + last + `"}]`)}}}
	}
	long := strings.Repeat("x", 8000) // 2,000 tokens
	p, cached := c.usage(req("m", long, "a"))
	require.Zero(t, cached, "nothing seen yet")
	require.Equal(t, len(renderGeminiPrompt(req("m", long, "a")))/bytesPerToken, p)
	_, cached = c.usage(req("m", long, "b"))
	require.Equal(t, commonPrefix(renderGeminiPrompt(req("m", long, "a")), renderGeminiPrompt(req("m", long, "b")))/bytesPerToken, cached)
	require.Greater(t, cached, 2000, "the whole shared prefix, no step")
	_, cached = c.usage(req("other", long, "b"))
	require.Zero(t, cached, "another model has a cache of its own")
	short := strings.Repeat("y", 4*GeminiMinTokens-100)
	c.usage(req("m", short, "a"))
	_, cached = c.usage(req("m", short, "b"))
	require.Zero(t, cached, "under the minimum")
}
