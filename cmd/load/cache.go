package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"

	"github.com/wsproxy/wsproxy/proxy/demo"
)

// Prompt caching as OpenAI documents it: a request's prompt shares the longest prefix it can
// with an earlier request (of the same prompt_cache_key, else the same model); that prefix is
// served from the cache, rounded down to a multiple of 128 tokens, and nothing under 1,024.
const (
	cacheMinTokens  = 1024
	cacheStepTokens = 128
	// bytesPerToken approximates a tokenizer: about 4 bytes of English text a token.
	bytesPerToken = 4
	// cachedPriceRatio is the price of a cached input token relative to an uncached one.
	cachedPriceRatio = 0.10
)

// promptCache is a model of an upstream's prompt cache, for measurement. It renders each prompt
// as a model sees it — the tools, then the messages in order, each in a canonical form (not the
// request's JSON bytes, whose member order varies) — and answers usage by the rule above.
type promptCache struct {
	mu     sync.Mutex
	seen   map[string][]string // prompts seen, per key
	render func(req cacheRequest) string
}

type cacheRequest struct {
	Model          string            `json:"model"`
	PromptCacheKey string            `json:"prompt_cache_key"`
	Tools          []json.RawMessage `json:"tools"`
	Messages       []cacheMessage    `json:"messages"`
}

type cacheMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

// text is a message's content as text.
func (m cacheMessage) text() string { return demo.ContentText(m.Content) }

// renderPrompt is the prompt as a chat template lays it out: each tool's definition, then each
// message's role, text and tool calls, in order.
func renderPrompt(req cacheRequest) string {
	var b strings.Builder
	for _, t := range req.Tools {
		b.Write(canonical(t))
		b.WriteByte('\n')
	}
	for _, m := range req.Messages {
		fmt.Fprintf(&b, "<|%s|>%s", m.Role, m.text())
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

func newPromptCache() *promptCache {
	return &promptCache{seen: map[string][]string{}, render: renderPrompt}
}

// usage returns the prompt's tokens and the part of them served from the cache, and remembers
// the prompt.
func (c *promptCache) usage(req cacheRequest) (prompt, cached int) {
	p := c.render(req)
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

// cacheModel is the scripted model of the cache sessions, behind the prompt cache. Its answers
// depend only on where the conversation is, so the client's history is the same whether it
// talks to the model directly or through wsproxy; through wsproxy it also keeps the workspace.
type cacheModel struct {
	cache *promptCache
}

const (
	chatTurns  = 40
	agentSteps = 30
)

func (m *cacheModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req cacheRequest
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	offered := map[string]bool{}
	for _, t := range req.Tools {
		var d struct {
			Function struct{ Name string } `json:"function"`
		}
		_ = json.Unmarshal(t, &d)
		offered[d.Function.Name] = true
	}
	content, calls := m.decide(req, offered)
	prompt, cached := m.cache.usage(req)
	msg := map[string]any{"role": "assistant", "content": content}
	finish := "stop"
	if len(calls) > 0 {
		msg["content"], msg["tool_calls"], finish = nil, calls, "tool_calls"
	}
	completion := len(content)/bytesPerToken + 10
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": "chatcmpl-cache", "object": "chat.completion", "created": 1, "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
			"prompt_tokens_details": map[string]any{"cached_tokens": cached}},
	})
}

// decide is the model: the chat session records, edits or removes a preference every third turn
// (a round of its own before the answer); the agent loop calls the client's tool (shell, or
// exec) step after step, twice with a workspace call: beside it (parallel calls, as agents
// make them) with shell, in a round of its own before it with exec.
func (m *cacheModel) decide(req cacheRequest, offered map[string]bool) (string, []any) {
	last := req.Messages[len(req.Messages)-1]
	afterWorkspace := last.Role == "tool" && strings.HasPrefix(last.text(), `{"ok":`)
	users, steps := 0, 0
	for _, msg := range req.Messages {
		switch {
		case msg.Role == "user":
			users++
		case msg.Role == "tool" && strings.HasPrefix(msg.ToolCallID, "call_step"):
			steps++
		}
	}
	if tool := map[bool]string{true: "shell", false: "exec"}[offered["shell"]]; offered[tool] { // the agent loop
		if steps == agentSteps {
			return answer("The task is done.", 1), nil
		}
		step := toolCall(fmt.Sprintf("call_step_%d", steps), tool, map[string]any{"cmd": fmt.Sprintf("run step %d", steps)})
		if !offered["add_preferences"] || (steps != 10 && steps != 20) {
			return "", []any{step}
		}
		ws := workspaceCall("add_preferences", map[string]any{"items": []map[string]any{{"title": fmt.Sprintf("Convention %d", steps)}}})
		switch {
		case tool == "shell":
			return "", []any{ws, step}
		case !afterWorkspace:
			return "", []any{ws}
		}
		return "", []any{step}
	}
	scoped := strings.Contains(req.Messages[0].text(), scopedMark) // the user changes a scope instead
	if offered["add_preferences"] && !afterWorkspace && users%3 == 0 && !scoped {
		switch users / 3 % 3 {
		case 1:
			return "", []any{workspaceCall("add_preferences", map[string]any{"items": []map[string]any{{"title": fmt.Sprintf("Preference %d", users)}}})}
		case 2:
			return "", []any{workspaceCall("update_preferences", map[string]any{"updates": []map[string]any{{"index": 1, "subtitle": fmt.Sprintf("as of turn %d", users)}}})}
		default:
			return "", []any{workspaceCall("remove_preferences", map[string]any{"indices": []int{1}})}
		}
	}
	return answer(fmt.Sprintf("Answer to turn %d.", users), 2000), nil
}

func answer(head string, size int) string {
	return head + " " + strings.Repeat("The soil keeps carbon in its organic matter, and the field measures it by core. ", size/80)
}

func toolCall(id, name string, args map[string]any) map[string]any {
	a, _ := json.Marshal(args)
	return map[string]any{"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": string(a)}}
}

func workspaceCall(name string, args map[string]any) map[string]any {
	args["action_and_reasoning"] = "The user stated it."
	return toolCall("call_ws", name, args)
}

// cacheWay is one way of running a session: straight to the model, or through wsproxy with a
// placement.
type cacheWay struct {
	name      string
	url       string // …/v1/chat/completions
	placement string // "" when direct
	parents   string // through wsproxy: the thread's parents (X-Workspace-Parents), "" for none
}

// post sends body to the way's URL (through wsproxy: in thread, with the way's placement) and
// returns the answer of a 200.
func (way cacheWay) post(thread string, body map[string]any, header ...string) ([]byte, error) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", way.url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if way.placement != "" {
		req.Header.Set("X-Thread-Id", thread)
		req.Header.Set("X-Workspace-Placement", way.placement)
		if way.parents != "" {
			req.Header.Set("X-Workspace-Parents", way.parents)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("%s: %d %s", way.name, resp.StatusCode, out)
	}
	return out, nil
}

// cacheFigures is what a session cost one way.
type cacheFigures struct {
	Prompt, Cached int
}

func (f cacheFigures) uncached() int    { return f.Prompt - f.Cached }
func (f cacheFigures) hitRate() float64 { return float64(f.Cached) / float64(max(f.Prompt, 1)) }
func (f cacheFigures) cost() float64 {
	return float64(f.uncached()) + cachedPriceRatio*float64(f.Cached)
}
func (f *cacheFigures) add(p, c int) { f.Prompt += p; f.Cached += c }
func (f cacheFigures) String() string {
	return fmt.Sprintf("%9d %9d %9d %7.1f%% %10.0f", f.Prompt, f.Cached, f.uncached(), 100*f.hitRate(), f.cost())
}

// session drives one scripted conversation and sums the usage the client got.
type session func(post func(msgs []map[string]any, tools []any) (map[string]any, error)) error

// scopedMark in a session's system prompt tells the model to leave the workspace alone: the
// user changes the thread's scope instead.
const scopedMark = "(scoped)"

// chatSession: a ~1.5K-token system prompt, two client tools, 40 turns of a growing chat.
var chatSession = chatWith("", nil)

// scopedChatSession is chatSession whose thread's list the model leaves alone, while the user
// changes the thread's scope (edit) before every third turn (docs/spec.md §17).
func scopedChatSession(edit func(turn int) error) session { return chatWith(" "+scopedMark, edit) }

// chatWith is the chat session with mark in its system prompt and, when edit is not nil, edit
// called before every third turn.
func chatWith(mark string, edit func(turn int) error) session {
	return func(post func([]map[string]any, []any) (map[string]any, error)) error {
		system := "You are a careful research assistant" + mark + ". " + strings.Repeat("Cite sources, keep the user's terms, and prefer primary literature over reviews. ", 75)
		msgs := []map[string]any{{"role": "system", "content": system}}
		for turn := 1; turn <= chatTurns; turn++ {
			if edit != nil && turn%3 == 0 {
				if err := edit(turn); err != nil {
					return err
				}
			}
			msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("Turn %d: ", turn) + strings.Repeat("Tell me more about how soil carbon is measured in the field. ", 16)})
			reply, err := post(msgs, clientTools("search", "fetch"))
			if err != nil {
				return err
			}
			msgs = append(msgs, reply)
		}
		return nil
	}
}

// agentSession: one user message, then a loop shaped like Codex CLI's: each request resends the
// history with one more client tool call and its result.
func agentSession(post func([]map[string]any, []any) (map[string]any, error)) error {
	return agentLoop(post, "shell")
}

// agentSessionRounds is agentSession with a model that changes the workspace in rounds of their
// own rather than beside its client calls.
func agentSessionRounds(post func([]map[string]any, []any) (map[string]any, error)) error {
	return agentLoop(post, "exec")
}

func agentLoop(post func([]map[string]any, []any) (map[string]any, error), tool string) error {
	msgs := []map[string]any{{"role": "user", "content": "Fix the failing tests of the soil carbon model and keep the code style."}}
	for range agentSteps + 1 {
		reply, err := post(msgs, clientTools(tool, "apply_patch"))
		if err != nil {
			return err
		}
		msgs = append(msgs, reply)
		calls, _ := reply["tool_calls"].([]any)
		if len(calls) == 0 {
			return nil
		}
		id := calls[0].(map[string]any)["id"]
		msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": id, "content": "exit 0\n" + strings.Repeat("ok   soil/model  0.12s  measured carbon matches the reference cores\n", 30)})
	}
	return errors.New("the agent loop did not end")
}

func clientTools(names ...string) []any {
	var out []any
	for _, n := range names {
		out = append(out, map[string]any{"type": "function", "function": map[string]any{"name": n, "description": "The client's " + n + " tool.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"arg": map[string]any{"type": "string"}}}}})
	}
	return out
}

// runSession runs a session one way and returns the usage the client was told.
func runSession(s session, way cacheWay, thread string) (cacheFigures, error) {
	var f cacheFigures
	err := s(func(msgs []map[string]any, tools []any) (map[string]any, error) {
		b, err := way.post(thread, map[string]any{"model": way.name, "messages": msgs, "tools": tools})
		if err != nil {
			return nil, err
		}
		var c struct {
			Choices []struct {
				Message map[string]any `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) == 0 {
			return nil, fmt.Errorf("%s: not a chat completion: %s", way.name, b)
		}
		f.add(c.Usage.PromptTokens, c.Usage.PromptTokensDetails.CachedTokens)
		return c.Choices[0].Message, nil
	})
	return f, err
}

// cacheCmd measures what each placement costs a conversation's prompt cache: scripted chat,
// agent and Messages agent sessions, each straight to a cache-modelling upstream (OpenAI's rule
// for chat completions, Anthropic's for the Messages API) and through wsproxy with the system
// and the tail placement. It fails when a tail target is missed.
func cacheCmd(args []string) error {
	fs := flag.NewFlagSet("cache", flag.ContinueOnError)
	bin := fs.String("wsproxy", "bin/wsproxy", "the wsproxy binary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("DATABASE_URL is required (make bench-cache provides one)")
	}
	models := http.NewServeMux()
	models.Handle("/v1/chat/completions", &cacheModel{cache: newPromptCache()})
	models.Handle("/v1/messages", &messagesCacheModel{cache: newAnthropicCache()})
	up := httptest.NewServer(models)
	defer up.Close()
	addr, cmd, err := startWsproxy(*bin, "DATABASE_URL="+dbURL, "UPSTREAM_BASE_URL="+up.URL+"/v1", "ANTHROPIC_UPSTREAM_BASE_URL="+up.URL,
		"ADMIN_TOKEN="+adminToken, "LOG_LEVEL=warn")
	if err != nil {
		return err
	}
	defer stop(cmd)
	report, ok, err := measureCache(up.URL, "http://"+addr)
	fmt.Print(report)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("a tail placement target was missed")
	}
	return nil
}

// measureCache runs the sessions three ways, straight to the upstream at direct and through
// wsproxy at wsproxy (base URLs), and reports the figures and the targets.
func measureCache(directBase, wsproxyBase string) (string, bool, error) {
	direct, wsproxy := directBase+"/v1/chat/completions", wsproxyBase+"/v1/chat/completions"
	var b strings.Builder
	ok, n := true, 0
	fmt.Fprintf(&b, "Prompt cache model: OpenAI's rule (longest common prefix with an earlier request, in 128-token steps,\n"+
		"nothing under 1,024), %d bytes a token, cached input at %.0f%% of the price; cost in uncached-token units.\n", bytesPerToken, 100*cachedPriceRatio)
	for _, s := range []struct {
		name string
		run  session
	}{
		{"chat (40 turns, a preference change every third)", chatSession},
		{"agent loop (30 client tool calls, 2 workspace changes beside them)", agentSession},
		{"agent loop, the 2 workspace changes in rounds of their own (no target)", agentSessionRounds},
	} {
		n++
		ways := []cacheWay{{"direct", direct, "", ""}, {"system", wsproxy, "system", ""}, {"tail", wsproxy, "tail", ""}}
		figs := map[string]cacheFigures{}
		for _, way := range ways {
			f, err := runSession(s.run, way, fmt.Sprintf("cache-%s-%d", way.name, n))
			if err != nil {
				return b.String(), false, err
			}
			figs[way.name] = f
		}
		fmt.Fprintf(&b, "\n%s\n%-8s %9s %9s %9s %8s %10s %9s\n", s.name, "way", "prompt", "cached", "uncached", "hit rate", "input cost", "vs direct")
		for _, way := range ways {
			f := figs[way.name]
			fmt.Fprintf(&b, "%-8s %s %8.2fx\n", way.name, f, f.cost()/figs["direct"].cost())
		}
		d, sys, tail := figs["direct"], figs["system"], figs["tail"]
		switch {
		case strings.HasPrefix(s.name, "chat"):
			ok = cacheCheck(&b, "chat: tail's input cost at most half of system's", tail.cost() <= 0.5*sys.cost(),
				fmt.Sprintf("%.0f vs %.0f (%.2fx)", tail.cost(), sys.cost(), tail.cost()/sys.cost())) && ok
			ok = cacheCheck(&b, "chat: tail's hit rate within 3 points of direct's", 100*(d.hitRate()-tail.hitRate()) <= 3,
				fmt.Sprintf("%.1f%% vs %.1f%%", 100*tail.hitRate(), 100*d.hitRate())) && ok
		case !strings.Contains(s.name, "no target"):
			ok = cacheCheck(&b, "agent loop: tail's input cost at most 1.15x direct's", tail.cost() <= 1.15*d.cost(),
				fmt.Sprintf("%.2fx", tail.cost()/d.cost())) && ok
		}
	}
	if err := measureScopeCache(&b, direct, wsproxy, wsproxyBase, &ok); err != nil {
		return b.String(), false, err
	}
	met, err := measureMessagesCache(&b, directBase+"/v1/messages", wsproxyBase+"/v1/messages")
	if err != nil {
		return b.String(), false, err
	}
	return b.String(), ok && met, nil
}

func cacheCheck(b *strings.Builder, what string, ok bool, figures string) bool {
	verdict := "MET "
	if !ok {
		verdict = "MISS"
	}
	fmt.Fprintf(b, "  [%s] %s: %s\n", verdict, what, figures)
	return ok
}

// measureScopeCache runs the chat session with a scope the user changes every third turn (a
// preference added to it through the admin REST), and checks that it costs each child only its
// block, as the thread's own changes do: tail's hit rate within 3 points of direct's.
func measureScopeCache(b *strings.Builder, direct, wsproxy, wsproxyBase string, ok *bool) error {
	figs := map[string]cacheFigures{}
	ways := []cacheWay{{"direct", direct, "", ""}, {"system", wsproxy, "system", "cache-scope-system"}, {"tail", wsproxy, "tail", "cache-scope-tail"}}
	for _, way := range ways {
		edit := func(turn int) error {
			if way.placement == "" {
				return nil
			}
			req, _ := http.NewRequest("POST", wsproxyBase+"/admin/v1/threads/"+way.parents+"/preferences",
				strings.NewReader(fmt.Sprintf(`{"title":"Scope rule %d"}`, turn)))
			req.Header.Set("Authorization", "Bearer "+adminToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				return fmt.Errorf("scope edit: %s", resp.Status)
			}
			return nil
		}
		f, err := runSession(scopedChatSession(edit), way, "cache-scoped-"+way.name)
		if err != nil {
			return err
		}
		figs[way.name] = f
	}
	fmt.Fprintf(b, "\nchat with a scope (40 turns, the user adds to the thread's scope every third)\n%-8s %9s %9s %9s %8s %10s %9s\n",
		"way", "prompt", "cached", "uncached", "hit rate", "input cost", "vs direct")
	for _, way := range ways {
		f := figs[way.name]
		fmt.Fprintf(b, "%-8s %s %8.2fx\n", way.name, f, f.cost()/figs["direct"].cost())
	}
	d, tail := figs["direct"], figs["tail"]
	*ok = cacheCheck(b, "scope change: tail's hit rate within 3 points of direct's (a scope's change costs its block only)",
		100*(d.hitRate()-tail.hitRate()) <= 3, fmt.Sprintf("%.1f%% vs %.1f%%", 100*tail.hitRate(), 100*d.hitRate())) && *ok
	return nil
}
