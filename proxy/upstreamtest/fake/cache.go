package fake

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// The prompt caches the fake models (Options.PromptCache), for measurement: a request's usage
// says how much of its prompt a provider would have served from its cache.

// Prompt caching as OpenAI documents it: a request's prompt shares the longest prefix it can
// with an earlier request (of the same prompt_cache_key, else the same model); that prefix is
// served from the cache, rounded down to a multiple of 128 tokens, and nothing under 1,024.
const (
	cacheMinTokens  = 1024
	cacheStepTokens = 128
	// bytesPerToken approximates a tokenizer: about 4 bytes of English text a token.
	bytesPerToken = 4
)

// BytesPerToken is how many bytes of a prompt the fake counts as a token.
const BytesPerToken = bytesPerToken

// openAICache is a model of an upstream's prompt cache. It renders each prompt as a model sees
// it — the tools, then the messages in order, each in a canonical form (not the request's JSON
// bytes, whose member order varies) — and answers usage by the rule above.
type openAICache struct {
	mu   sync.Mutex
	seen map[string][]string // prompts seen, per key
}

func newOpenAICache() *openAICache { return &openAICache{seen: map[string][]string{}} }

// renderPrompt is the prompt as a chat template lays it out: each tool's definition, then each
// message's role, text and tool calls, in order.
func renderPrompt(req *Request) string {
	var b strings.Builder
	for _, t := range req.Tools {
		b.Write(canonical(t))
		b.WriteByte('\n')
	}
	for _, m := range req.Messages {
		fmt.Fprintf(&b, "<|%s|>%s", m.Role, m.Text())
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			b.Write(canonical(m.ToolCalls))
		}
		b.WriteString("<|end|>\n")
	}
	return b.String()
}

// canonical re-encodes JSON with sorted keys, so equal values render equal.
func canonical(raw json.RawMessage) []byte {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return raw
	}
	b, _ := json.Marshal(v)
	return b
}

// usage returns the prompt's tokens and the part of them served from the cache, and remembers
// the prompt.
func (c *openAICache) usage(req *Request) (prompt, cached int) {
	p := renderPrompt(req)
	key := req.PromptCacheKey
	if key == "" {
		key = "model:" + req.Model
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	best := 0
	for _, earlier := range c.seen[key] {
		best = max(best, commonPrefix(p, earlier))
	}
	c.seen[key] = append(c.seen[key], p)
	return len(p) / bytesPerToken, cachedTokens(best / bytesPerToken)
}

// cachedTokens applies the rule to a common prefix of n tokens.
func cachedTokens(n int) int {
	if n < cacheMinTokens {
		return 0
	}
	return n / cacheStepTokens * cacheStepTokens
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// Prompt caching as Anthropic documents it for the Messages API: the prompt is the tools, then
// the system, then the messages, as content blocks; a request marks at most 4 breakpoints
// (cache_control). Each breakpoint writes the prefix up to its block to the cache; a request
// reads the longest prefix written before that ends at a block boundary at or up to 20 blocks
// before one of its breakpoints, and nothing under 1,024 tokens is cached; a cache is the
// model's. Tokens written are billed at 1.25 times the input price, tokens read at 0.1 times.
const (
	AnthropicMinTokens = 1024
	AnthropicLookback  = 20
	AnthropicMaxBreaks = 4
)

// anthropicCache is a model of Anthropic's prompt cache: it renders each request as blocks
// (each tool, each system block, each message's content blocks, without their cache_control)
// and answers usage by the rule above.
type anthropicCache struct {
	mu      sync.Mutex
	written map[string]bool // the prefixes written, by their model and text
}

func newAnthropicCache() *anthropicCache { return &anthropicCache{written: map[string]bool{}} }

// cacheBlocks are a request's content as the cache sees it: each block's rendered text, and
// whether it carries a breakpoint.
func cacheBlocks(req *Request) (texts []string, breaks []bool) {
	add := func(prefix string, raw json.RawMessage) {
		var m map[string]any
		if json.Unmarshal(raw, &m) != nil {
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return
			}
			m = map[string]any{"type": "text", "text": s} // a string is its one text block
		}
		_, marked := m["cache_control"]
		delete(m, "cache_control")
		b, _ := json.Marshal(m)
		texts, breaks = append(texts, prefix+string(b)), append(breaks, marked)
	}
	list := func(prefix string, raw json.RawMessage) {
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			add(prefix, raw)
			return
		}
		for _, it := range items {
			add(prefix, it)
		}
	}
	for _, t := range req.Tools {
		add("tool:", t)
	}
	if len(req.System) > 0 && string(req.System) != "null" {
		list("system:", req.System)
	}
	for _, m := range req.Messages {
		list(m.Role+":", m.Content)
	}
	return texts, breaks
}

// usage returns the request's input tokens (after the cached prefix), the tokens written to and
// read from the cache, and writes its breakpoints' prefixes.
func (c *anthropicCache) usage(req *Request) (input, written, read int) {
	texts, breaks := cacheBlocks(req)
	ends := make([]int, len(texts)) // the prefix length in bytes at the end of each block
	var all strings.Builder
	for i, t := range texts {
		all.WriteString(t)
		ends[i] = all.Len()
	}
	key := req.Model + "\x00"
	prompt := key + all.String()
	for i := range ends {
		ends[i] += len(key)
	}
	var marks []int
	for i, b := range breaks {
		if b && len(marks) < AnthropicMaxBreaks {
			marks = append(marks, i)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	readBytes := 0
	for _, m := range marks {
		for i := m; i >= 0 && i >= m-AnthropicLookback; i-- {
			if c.written[prompt[:ends[i]]] && ends[i] > readBytes {
				readBytes = ends[i]
				break
			}
		}
	}
	writeEnd := readBytes
	for _, m := range marks {
		if p := prompt[:ends[m]]; (len(p)-len(key))/bytesPerToken >= AnthropicMinTokens {
			c.written[p] = true
			writeEnd = max(writeEnd, ends[m])
		}
	}
	if readBytes > 0 {
		readBytes -= len(key)
	}
	if writeEnd > 0 {
		writeEnd -= len(key)
	}
	read = readBytes / bytesPerToken
	written = writeEnd/bytesPerToken - read
	return (len(prompt)-len(key))/bytesPerToken - read - written, written, read
}
