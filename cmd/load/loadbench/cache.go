package loadbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// The prompt-cache measurement of make bench-cache: scripted sessions, each straight to the fake
// model with its prompt cache (proxy/upstreamtest/fake, Options.PromptCache) and through wsproxy
// with each placement. The sessions (the client's side) and their scripts (the model's side)
// are here together: the model's answers depend only on where the conversation is, so the
// client's history is the same whether it talks to the model directly or through wsproxy;
// through wsproxy it also keeps the workspace.

// cachedPriceRatio is the price of a cached input token relative to an uncached one (OpenAI).
const cachedPriceRatio = 0.10

const (
	chatTurns  = 40
	agentSteps = 30
)

// cacheScript is the model of the cache sessions, in both APIs.
func cacheScript(req *fake.Request) fake.Answer {
	switch req.API {
	case fake.Messages:
		return messagesCacheScript(req)
	case fake.Gemini:
		return geminiCacheScript(req)
	}
	return chatCacheScript(req)
}

// chatCacheScript is the chat sessions' model: the chat session records, edits or removes a
// preference every third turn (a round of its own before the answer); the agent loop calls the
// client's tool (shell, or exec) step after step, twice with a workspace call: beside it
// (parallel calls, as agents make them) with shell, in a round of its own before it with exec.
func chatCacheScript(req *fake.Request) fake.Answer {
	offered := req.ToolNames()
	last := req.Messages[len(req.Messages)-1]
	afterWorkspace := last.Role == "tool" && strings.HasPrefix(last.Text(), `{"ok":`)
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
			return fake.Answer{Text: answer("The task is done.", 1)}
		}
		step := toolCall(fmt.Sprintf("call_step_%d", steps), tool, map[string]any{"cmd": fmt.Sprintf("run step %d", steps)})
		if !offered["add_preferences"] || (steps != 10 && steps != 20) {
			return fake.Answer{Calls: []fake.Call{step}}
		}
		ws := workspaceCall("add_preferences", map[string]any{"items": []map[string]any{{"title": fmt.Sprintf("Convention %d", steps)}}})
		switch {
		case tool == "shell":
			return fake.Answer{Calls: []fake.Call{ws, step}}
		case !afterWorkspace:
			return fake.Answer{Calls: []fake.Call{ws}}
		}
		return fake.Answer{Calls: []fake.Call{step}}
	}
	scoped := strings.Contains(req.Messages[0].Text(), scopedMark) // the user changes a scope instead
	if offered["add_preferences"] && !afterWorkspace && users%3 == 0 && !scoped {
		return fake.Answer{Calls: []fake.Call{rotatingWorkspaceCall(users)}}
	}
	return fake.Answer{Text: answer(fmt.Sprintf("Answer to turn %d.", users), 2000)}
}

func answer(head string, size int) string {
	return head + " " + strings.Repeat("The soil keeps carbon in its organic matter, and the field measures it by core. ", size/80)
}

func toolCall(id, name string, args map[string]any) fake.Call {
	a, _ := json.Marshal(args)
	return fake.Call{ID: id, Name: name, Arguments: string(a)}
}

func workspaceCall(name string, args map[string]any) fake.Call {
	args["action_and_reasoning"] = "The user stated it."
	return toolCall("call_ws", name, args)
}

// rotatingWorkspaceCall is the workspace call a session's user asks for every third turn, in
// turn: an added preference, the first one updated, the first one removed.
func rotatingWorkspaceCall(users int) fake.Call {
	switch users / 3 % 3 {
	case 1:
		return workspaceCall("add_preferences", map[string]any{"items": []map[string]any{{"title": fmt.Sprintf("Preference %d", users)}}})
	case 2:
		return workspaceCall("update_preferences", map[string]any{"updates": []map[string]any{{"index": 1, "subtitle": fmt.Sprintf("as of turn %d", users)}}})
	default:
		return workspaceCall("remove_preferences", map[string]any{"indices": []int{1}})
	}
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

// Cache measures what each placement costs a conversation's prompt cache (make bench-cache):
// scripted chat, agent, Messages and Gemini agent sessions, each straight to the fake model with
// its prompt cache (OpenAI's rule for chat completions, Anthropic's for the Messages API, Gemini's
// implicit caching for the Gemini API) and through wsproxy with the system and the tail
// placement. Run fails when a tail target is missed.
type Cache struct {
	Wsproxy     string // the wsproxy binary
	DatabaseURL string
}

// Run runs the sessions and prints the figures and the targets.
func (c Cache) Run(ctx context.Context) error {
	if c.DatabaseURL == "" {
		return errors.New("the cache measurement needs a Postgres")
	}
	up := httptest.NewServer(fake.New(fake.Options{PromptCache: true, Script: cacheScript}))
	defer up.Close()
	addr, cmd, err := startWsproxy(c.Wsproxy, "DATABASE_URL="+c.DatabaseURL, "UPSTREAM_BASE_URL="+up.URL+"/v1", "ANTHROPIC_UPSTREAM_BASE_URL="+up.URL, "GEMINI_UPSTREAM_BASE_URL="+up.URL,
		"ADMIN_TOKEN="+adminToken, "LOG_LEVEL=warn")
	if err != nil {
		return err
	}
	defer stop(cmd)
	report, ok, err := measureCache(ctx, up.URL, "http://"+addr)
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
func measureCache(ctx context.Context, directBase, wsproxyBase string) (string, bool, error) {
	direct, wsproxy := directBase+"/v1/chat/completions", wsproxyBase+"/v1/chat/completions"
	var b strings.Builder
	ok, n := true, 0
	run := time.Now().UnixNano() // threads of their own on every run: a Postgres may be reused
	fmt.Fprintf(&b, "Prompt cache model: OpenAI's rule (longest common prefix with an earlier request, in 128-token steps,\n"+
		"nothing under 1,024), %d bytes a token, cached input at %.0f%% of the price; cost in uncached-token units.\n", fake.BytesPerToken, 100*cachedPriceRatio)
	for _, s := range []struct {
		name string
		run  session
	}{
		{"chat (40 turns, a preference change every third)", chatSession},
		{"agent loop (30 client tool calls, 2 workspace changes beside them)", agentSession},
		{"agent loop, the 2 workspace changes in rounds of their own (no target)", agentSessionRounds},
	} {
		if err := ctx.Err(); err != nil {
			return b.String(), false, err
		}
		n++
		ways := []cacheWay{{"direct", direct, "", ""}, {"system", wsproxy, "system", ""}, {"tail", wsproxy, "tail", ""}}
		figs := map[string]cacheFigures{}
		for _, way := range ways {
			f, err := runSession(s.run, way, fmt.Sprintf("cache-%s-%d-%d", way.name, n, run))
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
	if err := measureScopeCache(&b, direct, wsproxy, wsproxyBase, run, &ok); err != nil {
		return b.String(), false, err
	}
	met, err := measureMessagesCache(&b, directBase+"/v1/messages", wsproxyBase+"/v1/messages")
	if err != nil {
		return b.String(), false, err
	}
	gmet, err := measureGeminiCache(&b, directBase, wsproxyBase)
	if err != nil {
		return b.String(), false, err
	}
	return b.String(), ok && met && gmet, nil
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
func measureScopeCache(b *strings.Builder, direct, wsproxy, wsproxyBase string, run int64, ok *bool) error {
	figs := map[string]cacheFigures{}
	ways := []cacheWay{{"direct", direct, "", ""}, {"system", wsproxy, "system", fmt.Sprintf("cache-scope-system-%d", run)},
		{"tail", wsproxy, "tail", fmt.Sprintf("cache-scope-tail-%d", run)}}
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
		f, err := runSession(scopedChatSession(edit), way, fmt.Sprintf("cache-scoped-%s-%d", way.name, run))
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
