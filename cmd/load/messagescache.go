package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Prompt caching as Anthropic documents it for the Messages API: the prompt is the tools, then
// the system, then the messages, as content blocks; a request marks at most 4 breakpoints
// (cache_control). Each breakpoint writes the prefix up to its block to the cache; a request
// reads the longest prefix written before that ends at a block boundary at or up to 20 blocks
// before one of its breakpoints, and nothing under 1,024 tokens is cached; a cache is the
// model's. Tokens written are billed at 1.25 times the input price, tokens read at 0.1 times.
const (
	anthropicMinTokens   = 1024
	anthropicLookback    = 20
	anthropicMaxBreaks   = 4
	anthropicWritePrice  = 1.25
	anthropicReadPrice   = 0.10
	messagesAgentSteps   = agentSteps
	messagesAgentTool    = "Bash"
	messagesRoundsTool   = "Exec"
	messagesStepIDPrefix = "toolu_step_"
)

// anthropicCache is a model of Anthropic's prompt cache, for measurement: it renders each
// request as blocks (each tool, each system block, each message's content blocks, without their
// cache_control) and answers usage by the rule above.
type anthropicCache struct {
	mu      sync.Mutex
	written map[string]bool // the prefixes written, by their model and text
}

func newAnthropicCache() *anthropicCache { return &anthropicCache{written: map[string]bool{}} }

// messagesCacheRequest is what the cache model reads of a Messages request.
type messagesCacheRequest struct {
	Model    string                 `json:"model"`
	System   json.RawMessage        `json:"system"`
	Tools    []json.RawMessage      `json:"tools"`
	Messages []messagesCacheMessage `json:"messages"`
}

type messagesCacheMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// blocks are a request's content as the cache sees it: each block's rendered text, and whether
// it carries a breakpoint.
func (req messagesCacheRequest) blocks() (texts []string, breaks []bool) {
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
func (c *anthropicCache) usage(req messagesCacheRequest) (input, written, read int) {
	texts, breaks := req.blocks()
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
		if b && len(marks) < anthropicMaxBreaks {
			marks = append(marks, i)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	readBytes := 0
	for _, m := range marks {
		for i := m; i >= 0 && i >= m-anthropicLookback; i-- {
			if c.written[prompt[:ends[i]]] && ends[i] > readBytes {
				readBytes = ends[i]
				break
			}
		}
	}
	writeEnd := readBytes
	for _, m := range marks {
		if p := prompt[:ends[m]]; (len(p)-len(key))/bytesPerToken >= anthropicMinTokens {
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

// messagesCacheModel is the scripted model of the Messages agent loop, behind the cache model:
// it calls the client's tool step after step, twice with a workspace call (beside the step with
// Bash, in a round of its own before it with Exec), and answers once the steps are done.
type messagesCacheModel struct {
	cache *anthropicCache
}

func (m *messagesCacheModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req messagesCacheRequest
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	offered := map[string]bool{}
	for _, t := range req.Tools {
		var d struct{ Name string }
		_ = json.Unmarshal(t, &d)
		offered[d.Name] = true
	}
	content := m.decide(req, offered)
	input, written, read := m.cache.usage(req)
	stop := "end_turn"
	for _, b := range content {
		if b["type"] == "tool_use" {
			stop = "tool_use"
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": "msg_cache", "type": "message", "role": "assistant", "model": req.Model, "content": content,
		"stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": input, "cache_creation_input_tokens": written, "cache_read_input_tokens": read, "output_tokens": 40},
	})
}

func (m *messagesCacheModel) decide(req messagesCacheRequest, offered map[string]bool) []map[string]any {
	steps, afterWorkspace := 0, false
	for i, msg := range req.Messages {
		var blocks []struct {
			Type      string `json:"type"`
			ToolUseID string `json:"tool_use_id"`
		}
		_ = json.Unmarshal(msg.Content, &blocks)
		for _, b := range blocks {
			if b.Type != "tool_result" {
				continue
			}
			if strings.HasPrefix(b.ToolUseID, messagesStepIDPrefix) {
				steps++
			} else if i == len(req.Messages)-1 {
				afterWorkspace = true
			}
		}
	}
	tool := messagesAgentTool
	if offered[messagesRoundsTool] {
		tool = messagesRoundsTool
	}
	if steps == messagesAgentSteps {
		return []map[string]any{{"type": "text", "text": answer("The task is done.", 1)}}
	}
	step := map[string]any{"type": "tool_use", "id": fmt.Sprintf("%s%d", messagesStepIDPrefix, steps), "name": tool,
		"input": map[string]any{"command": fmt.Sprintf("run step %d", steps)}}
	if !offered["add_preferences"] || (steps != 10 && steps != 20) {
		return []map[string]any{step}
	}
	ws := map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_ws_%d", steps), "name": "add_preferences",
		"input": map[string]any{"items": []map[string]any{{"title": fmt.Sprintf("Convention %d", steps)}}, "action_and_reasoning": "The user stated it."}}
	switch {
	case tool == messagesAgentTool:
		return []map[string]any{ws, step}
	case !afterWorkspace:
		return []map[string]any{ws}
	}
	return []map[string]any{step}
}

// messagesAgentLoop is a loop shaped like Claude Code's: a system of three text blocks with a
// breakpoint on the last, the client's tools, one user message, then each request resends the
// history with one more tool_use and its tool_result, its breakpoint on the last user block
// (moved there from the one before, as Claude Code does).
func messagesAgentLoop(post func(body map[string]any) (map[string]any, error), tool, model string) error {
	system := []map[string]any{
		{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;"},
		{"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.", "cache_control": map[string]any{"type": "ephemeral"}},
		{"type": "text", "text": strings.Repeat("Work toward the user's goals with care: read before you edit, run the tests, keep the code style. ", 80),
			"cache_control": map[string]any{"type": "ephemeral"}},
	}
	var tools []any
	for _, n := range []string{tool, "Read", "Edit", "Write", "Grep"} {
		tools = append(tools, map[string]any{"name": n, "description": "The client's " + n + " tool. " + strings.Repeat("It acts on the working folder. ", 20),
			"input_schema": map[string]any{"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}}}})
	}
	msgs := []map[string]any{{"role": "user", "content": []map[string]any{
		{"type": "text", "text": "Fix the failing tests of the soil carbon model and keep the code style."}}}}
	mark := func() {
		for _, m := range msgs {
			for _, b := range m["content"].([]map[string]any) {
				delete(b, "cache_control")
			}
		}
		last := msgs[len(msgs)-1]["content"].([]map[string]any)
		last[len(last)-1]["cache_control"] = map[string]any{"type": "ephemeral"}
	}
	for range messagesAgentSteps + 1 {
		mark()
		reply, err := post(map[string]any{"model": model, "max_tokens": 4096, "system": system, "tools": tools, "messages": msgs})
		if err != nil {
			return err
		}
		var content []map[string]any
		var results []map[string]any
		blocks, _ := reply["content"].([]any)
		for _, b := range blocks {
			block := b.(map[string]any)
			content = append(content, block)
			if block["type"] == "tool_use" {
				results = append(results, map[string]any{"type": "tool_result", "tool_use_id": block["id"],
					"content": "exit 0\n" + strings.Repeat("ok   soil/model  0.12s  measured carbon matches the reference cores\n", 30)})
			}
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": content})
		if len(results) == 0 {
			return nil
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": results})
	}
	return errors.New("the Messages agent loop did not end")
}

// messagesFigures is what a Messages session cost one way.
type messagesFigures struct {
	Input, Written, Read int
}

func (f messagesFigures) prompt() int { return f.Input + f.Written + f.Read }
func (f messagesFigures) cost() float64 {
	return float64(f.Input) + anthropicWritePrice*float64(f.Written) + anthropicReadPrice*float64(f.Read)
}
func (f messagesFigures) String() string {
	return fmt.Sprintf("%9d %9d %9d %9d %7.1f%% %10.0f", f.prompt(), f.Input, f.Written, f.Read,
		100*float64(f.Read)/float64(max(f.prompt(), 1)), f.cost())
}

// runMessagesSession runs the Messages agent loop one way and sums the usage the client was told.
// Each way names a model of its own: the ways do not share a cache.
func runMessagesSession(tool string, way cacheWay, thread string) (messagesFigures, error) {
	var f messagesFigures
	err := messagesAgentLoop(func(body map[string]any) (map[string]any, error) {
		out, err := way.post(thread, body, "Anthropic-Version", "2023-06-01")
		if err != nil {
			return nil, err
		}
		var m struct {
			Usage struct {
				Input   int `json:"input_tokens"`
				Written int `json:"cache_creation_input_tokens"`
				Read    int `json:"cache_read_input_tokens"`
			} `json:"usage"`
		}
		var msg map[string]any
		if json.Unmarshal(out, &m) != nil || json.Unmarshal(out, &msg) != nil {
			return nil, fmt.Errorf("%s: not a message: %s", way.name, out)
		}
		f.Input, f.Written, f.Read = f.Input+m.Usage.Input, f.Written+m.Usage.Written, f.Read+m.Usage.Read
		return msg, nil
	}, tool, "claude-cache-"+way.name)
	return f, err
}

// measureMessagesCache runs the Messages agent loops three ways and reports the figures and the
// target.
func measureMessagesCache(b *strings.Builder, direct, wsproxy string) (bool, error) {
	fmt.Fprintf(b, "\nPrompt cache model of the Messages API: Anthropic's rule (the longest prefix written before that ends\n"+
		"at a block boundary up to %d blocks before a breakpoint, at most %d breakpoints, nothing under %d tokens),\n"+
		"writes at %.2fx and reads at %.2fx of the input price.\n", anthropicLookback, anthropicMaxBreaks, anthropicMinTokens, anthropicWritePrice, anthropicReadPrice)
	ok, run := true, time.Now().UnixNano() // threads of their own on every run
	for n, s := range []struct{ name, tool string }{
		{"Messages agent loop like Claude Code's (30 tool_use steps, 2 workspace changes beside them)", messagesAgentTool},
		{"Messages agent loop, the 2 workspace changes in rounds of their own (no target)", messagesRoundsTool},
	} {
		ways := []cacheWay{{"direct", direct, "", ""}, {"system", wsproxy, "system", ""}, {"tail", wsproxy, "tail", ""}}
		figs := map[string]messagesFigures{}
		for _, way := range ways {
			f, err := runMessagesSession(s.tool, way, fmt.Sprintf("cache-messages-%s-%d-%d", way.name, n, run))
			if err != nil {
				return false, err
			}
			figs[way.name] = f
		}
		fmt.Fprintf(b, "\n%s\n%-8s %9s %9s %9s %9s %8s %10s %9s\n", s.name, "way", "prompt", "input", "written", "read", "hit rate", "input cost", "vs direct")
		for _, way := range ways {
			f := figs[way.name]
			fmt.Fprintf(b, "%-8s %s %8.2fx\n", way.name, f, f.cost()/figs["direct"].cost())
		}
		if s.tool == messagesAgentTool {
			d, tail := figs["direct"], figs["tail"]
			ok = cacheCheck(b, "Messages agent loop: tail's input cost at most 1.15x direct's", tail.cost() <= 1.15*d.cost(),
				fmt.Sprintf("%.2fx", tail.cost()/d.cost())) && ok
		}
	}
	return ok, nil
}
