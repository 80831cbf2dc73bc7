package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The coding agents' requests as they really send them, captured against agentFake and kept as
// the fixtures of proxy/testdata/agents (its README says how): TestAgentRequests runs Claude Code,
// Codex CLI and Gemini CLI (the pinned npm clients) and checks the facts the recognisers of
// proxy/internal/turn (kind.go) rest on; with UPDATE_AGENT_FIXTURES=1 it rewrites the fixtures
// from what it captured.

// runAgent runs an npm client's command in work with HOME=home and env (the provider variables
// of the test's own environment left out), and returns what it printed.
func runAgent(t *testing.T, home, work string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npmBin(t, name), args...)
	cmd.Dir = work
	cmd.Env = append(agentEnv(), "HOME="+home)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %q: %s", name, args, out)
	t.Logf("%s %q:\n%s", name, args, out)
	return string(out)
}

// agentEnv is the test's environment without any provider's settings: an agent meets only the
// servers a test names.
func agentEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc([]string{"OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_", "CODEX_", "CLAUDE_"}, func(p string) bool { return strings.HasPrefix(k, p) }) {
			env = append(env, kv)
		}
	}
	return env
}

// claudeEnv is Claude Code offline against baseURL (as TestClaudeCodeEndToEnd runs it).
func claudeEnv(baseURL string) []string {
	return []string{"ANTHROPIC_BASE_URL=" + baseURL, "ANTHROPIC_AUTH_TOKEN=wsproxy-capture", "ANTHROPIC_API_KEY=",
		"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}
}

// codexProvider is the -c flags of a Codex custom provider at baseURL (a custom provider has
// supports_websockets off unless websockets is true).
func codexProvider(baseURL string, websockets bool) []string {
	p := `model_providers.wsproxy={name="wsproxy", base_url="` + baseURL + `", wire_api="responses", env_key="WSPROXY_KEY"`
	if websockets {
		p += `, supports_websockets=true`
	}
	return []string{"-c", "model_provider=wsproxy", "-c", p + "}"}
}

// geminiHome prepares a home for Gemini CLI in headless mode with an API key.
func geminiHome(t *testing.T) string {
	home := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".gemini"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, ".gemini", "settings.json"), []byte(`{"security":{"auth":{"selectedType":"gemini-api-key"}}}`), 0o600))
	return home
}

func geminiEnv(baseURL string) []string {
	return []string{"GOOGLE_GEMINI_BASE_URL=" + baseURL, "GEMINI_API_KEY=sk-capture", "GEMINI_CLI_TRUST_WORKSPACE=true"}
}

// agentReply answers each agent's requests as its provider would in kind: Claude Code's
// compaction gets the <analysis>/<summary> it asks for (else it asks again), Gemini CLI's
// classifier the JSON of its schema; anything else a short text.
func agentReply(r capturedRequest) string {
	body := string(r.Body)
	switch {
	case strings.Contains(body, "an <analysis> block followed by a <summary> block"):
		return "<analysis>The user stated a goal and a preference.</analysis>\n<summary>1. Primary Request and Intent: a tidy repository; tabs.</summary>"
	case strings.Contains(body, `"responseMimeType":"application/json"`):
		return `{"complexity_reasoning":"A simple statement.","complexity_score":10}`
	}
	return "OK."
}

// lastText is the text of a body's last message or input item (a string content, or its first
// text part), decoded: for the checks only, the recognisers read raw JSON.
func lastText(t *testing.T, body json.RawMessage, list string) string {
	t.Helper()
	var v map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &v))
	var items []map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(v[list], &items))
	last := items[len(items)-1]
	var s string
	if json.Unmarshal(last["content"], &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	require.NoError(t, json.Unmarshal(last["content"], &parts))
	return parts[0].Text
}

// turnMetadata is Codex's x-codex-turn-metadata header, decoded.
func turnMetadata(t *testing.T, r capturedRequest) map[string]any {
	t.Helper()
	h := r.Headers["X-Codex-Turn-Metadata"]
	require.Len(t, h, 1)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(h[0]), &m))
	return m
}

func keep(t *testing.T, fixtures map[string]capturedRequest, folders map[string]string) {
	t.Helper()
	if os.Getenv("UPDATE_AGENT_FIXTURES") == "1" {
		writeFixtures(t, fixtures, folders)
	}
}

// TestAgentRequests captures what the three agents send in the modes wsproxy must recognise
// (docs/spec.md §18), checks what tells each request apart, and (UPDATE_AGENT_FIXTURES=1) keeps
// them as proxy/testdata/agents.
func TestAgentRequests(t *testing.T) {
	t.Parallel()

	t.Run("ClaudeCode", func(t *testing.T) {
		f := newAgentFake(t, agentReply)
		home, work := t.TempDir(), t.TempDir()
		env := claudeEnv(f.URL)
		runAgent(t, home, work, env, "claude", "-p", "My goal is a tidy repository.")
		runAgent(t, home, work, env, "claude", "-p", "--continue", "I prefer tabs.")
		runAgent(t, home, work, env, "claude", "-p", "--continue", "/compact")
		runAgent(t, home, work, env, "claude", "-p", "--continue", "What is my goal?")
		rs := f.Requests()
		// One request a run: no title or topic request in print mode, /compact one request.
		require.Len(t, rs, 4, "%v", rs)
		session := rs[0].Headers["X-Claude-Code-Session-Id"]
		require.Len(t, session, 1)
		for i, r := range rs {
			require.Equal(t, "POST /v1/messages beta=true", r.Method+" "+r.Path+" "+r.Query)
			require.Equal(t, session, r.Headers["X-Claude-Code-Session-Id"], "--continue keeps the session's id (#%d)", i)
			require.Equal(t, i == 2, strings.Contains(r.Headers["Anthropic-Beta"][0], "fallback-credit-2026-06-01"),
				"only the compaction request carries the fallback-credit beta (#%d)", i)
		}
		compact := lastText(t, rs[2].Body, "messages")
		require.True(t, strings.HasPrefix(compact, "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."), compact)
		require.Contains(t, compact, "Your task is to create a detailed summary of the conversation so far")
		require.Contains(t, string(rs[2].Body), `"tools":[`, "the compaction request still carries Claude Code's tools")
		require.Contains(t, string(rs[3].Body), "This session is being continued from a previous conversation")
		keep(t, map[string]capturedRequest{"claude-code-turn": rs[0], "claude-code-compact": rs[2], "claude-code-after-compact": rs[3]},
			map[string]string{home: "/home/agent", work: "/work/project"})
	})

	t.Run("ClaudeCodeInteractive", func(t *testing.T) {
		// The interactive session (under script(1), for a terminal), with Claude Code's
		// nonessential traffic on: its first prompt sends a title request beside the turn.
		f := newAgentFake(t, agentReply)
		// Its home is removed once Claude Code's own children (a plugin marketplace's clone, which
		// fails offline) are done with it.
		home, err := os.MkdirTemp("", "claude-interactive-")
		require.NoError(t, err)
		t.Cleanup(func() {
			for i := 0; os.RemoveAll(home) != nil && i < 50; i++ {
				time.Sleep(100 * time.Millisecond)
			}
		})
		work := t.TempDir()
		config := fmt.Sprintf(`{"hasCompletedOnboarding":true,"theme":"dark","customApiKeyResponses":{"approved":["wsproxy-capture"]},"projects":{%q:{"hasTrustDialogAccepted":true,"hasCompletedProjectOnboarding":true}}}`, work)
		require.NoError(t, os.WriteFile(filepath.Join(home, ".claude.json"), []byte(config), 0o600))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "script", "-q", "-c", npmBin(t, "claude")+" 'My goal is a tidy repository.'", "/dev/null")
		cmd.Dir = work
		cmd.Env = append(agentEnv(), "HOME="+home, "TERM=xterm", "ANTHROPIC_BASE_URL="+f.URL, "ANTHROPIC_AUTH_TOKEN=wsproxy-capture",
			"ANTHROPIC_API_KEY=", "DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1")
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		defer stdin.Close()
		require.NoError(t, cmd.Start())
		var posts []capturedRequest
		require.Eventually(t, func() bool {
			posts = posts[:0]
			for _, r := range f.Requests() {
				if r.Method == http.MethodPost {
					posts = append(posts, r)
				}
			}
			return len(posts) >= 2
		}, time.Minute, 100*time.Millisecond, "the title request and the turn")
		// Ctrl-C twice: Claude Code exits, and script with it.
		_, _ = io.WriteString(stdin, "\x03")
		time.Sleep(200 * time.Millisecond)
		_, _ = io.WriteString(stdin, "\x03")
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
		}
		i := slices.IndexFunc(posts, func(r capturedRequest) bool {
			return strings.Contains(string(r.Body), "You are naming a coding session")
		})
		require.GreaterOrEqual(t, i, 0, "a title request")
		title := posts[i]
		require.Equal(t, "POST /v1/messages beta=true", title.Method+" "+title.Path+" "+title.Query)
		require.Contains(t, string(title.Body), `"tools":[]`)
		require.Contains(t, string(title.Body), `"format":{"type":"json_schema"`)
		require.Contains(t, title.Headers["Anthropic-Beta"][0], "structured-outputs-2025-12-15")
		require.NotContains(t, string(posts[1-i].Body), "You are naming a coding session")
		keep(t, map[string]capturedRequest{"claude-code-title": title, "claude-code-interactive-turn": posts[1-i]},
			map[string]string{home: "/home/agent", work: "/work/project"})
	})

	t.Run("CodexCustomProvider", func(t *testing.T) {
		f := newAgentFake(t, nil)
		home, work := t.TempDir(), t.TempDir()
		// A tiny auto-compaction limit (the fake reports 5,000 input tokens a turn): the resumed
		// session compacts before its turn.
		args := append([]string{"exec", "--skip-git-repo-check", "-m", "gpt-5.1", "-c", "model_auto_compact_token_limit=1000"}, codexProvider(f.URL+"/v1", false)...)
		env := []string{"WSPROXY_KEY=sk-capture"}
		runAgent(t, home, work, env, "codex", append(args, "My goal is a tidy repository.")...)
		out := runAgent(t, home, work, env, "codex", append(args, "resume", "--last", "I prefer tabs.")...)
		require.Contains(t, out, "context compacted")
		rs := f.Requests()
		require.Len(t, rs, 3, "no WebSocket attempt: a custom provider has supports_websockets off")
		for i, r := range rs {
			require.Equal(t, "POST /v1/responses", r.Method+" "+r.Path)
			require.Equal(t, rs[0].Headers["Session-Id"], r.Headers["Session-Id"], "session-id is the session's (#%d)", i)
			require.Equal(t, r.Headers["Session-Id"], r.Headers["Thread-Id"])
			require.Equal(t, []string{"remote_compaction_v2"}, r.Headers["X-Codex-Beta-Features"])
		}
		require.Equal(t, []any{"turn", "compaction", "turn"}, []any{turnMetadata(t, rs[0])["request_kind"], turnMetadata(t, rs[1])["request_kind"], turnMetadata(t, rs[2])["request_kind"]})
		require.Equal(t, "responses", turnMetadata(t, rs[1])["compaction"].(map[string]any)["implementation"])
		require.True(t, strings.HasPrefix(lastText(t, rs[1].Body, "input"), "You are performing a CONTEXT CHECKPOINT COMPACTION."))
		require.Contains(t, string(rs[1].Body), `"tools":[]`, "the local compaction request carries no tools")
		require.Contains(t, string(rs[1].Body), `\"request_kind\":\"compaction\"`, "and says what it is in client_metadata too")
		require.NotContains(t, string(rs[1].Body), "compaction_trigger")
		keep(t, map[string]capturedRequest{"codex-turn": rs[0], "codex-compact-local": rs[1], "codex-after-compact": rs[2]},
			map[string]string{home: "/home/agent", work: "/work/project"})
	})

	t.Run("CodexOpenAIProvider", func(t *testing.T) {
		// Codex's own OpenAI provider (openai_base_url at the fake): WebSockets first, and the
		// remote compaction of a compaction_trigger item.
		f := newAgentFake(t, nil)
		home, work := t.TempDir(), t.TempDir()
		args := []string{"exec", "--skip-git-repo-check", "-m", "gpt-5.1", "-c", "model_auto_compact_token_limit=1000", "-c", `openai_base_url="` + f.URL + `/v1"`}
		env := []string{"CODEX_API_KEY=sk-capture"}
		runAgent(t, home, work, env, "codex", append(args, "My goal is a tidy repository.")...)
		out := runAgent(t, home, work, env, "codex", append(args, "resume", "--last", "I prefer tabs.")...)
		require.Contains(t, out, "context compacted")
		rs := f.Requests()
		var got []string
		for _, r := range rs {
			got = append(got, r.Method+" "+r.Path+" "+turnMetadata(t, r)["request_kind"].(string))
		}
		// Each run: one upgrade (the fake's 426), then HTTP at once.
		require.Equal(t, []string{"GET /v1/responses prewarm", "POST /v1/responses turn", "GET /v1/responses prewarm", "POST /v1/responses compaction", "POST /v1/responses turn"}, got)
		require.Equal(t, []string{"websocket"}, rs[0].Headers["Upgrade"])
		require.Equal(t, []string{"responses_websockets=2026-02-06"}, rs[0].Headers["Openai-Beta"])
		require.Equal(t, `{"type":"compaction_trigger"}`, lastItem(t, rs[3].Body))
		require.Equal(t, "responses_compaction_v2", turnMetadata(t, rs[3])["compaction"].(map[string]any)["implementation"])
		keep(t, map[string]capturedRequest{"codex-websocket-upgrade": rs[0], "codex-compaction-trigger": rs[3]},
			map[string]string{home: "/home/agent", work: "/work/project"})
	})

	t.Run("GeminiCLI", func(t *testing.T) {
		f := newAgentFake(t, agentReply)
		home, work := geminiHome(t), t.TempDir()
		runAgent(t, home, work, geminiEnv(f.URL), "gemini", "-p", "My goal is a tidy repository.")
		runAgent(t, home, work, geminiEnv(f.URL), "gemini", "-p", "I prefer tabs.")
		other := geminiHome(t)
		runAgent(t, other, work, geminiEnv(f.URL), "gemini", "-p", "My goal is a tidy repository.")
		rs := f.Requests()
		var got []string
		for _, r := range rs {
			got = append(got, r.Method+" "+r.Path+" "+r.Query)
		}
		classifier := "POST /v1beta/models/gemini-3.5-flash-lite:generateContent "
		// The model of the turn is the classifier's choice: a score of 10 picks a flash model.
		turn := "POST /v1beta/models/gemini-3.8-flash:streamGenerateContent alt=sse"
		require.Equal(t, []string{classifier, turn, classifier, turn, classifier, turn}, got)
		require.Contains(t, string(rs[0].Body), `"responseMimeType":"application/json"`)
		require.Contains(t, string(rs[0].Body), `"responseJsonSchema":{`)
		require.NotContains(t, string(rs[0].Body), `"tools"`)
		require.Contains(t, string(rs[1].Body), `"functionDeclarations":[`)
		require.NotContains(t, string(rs[1].Body), `"responseMimeType"`)
		// No header names a session: the same names on every request, and the one id among them is
		// the installation's (the same for two sessions in one home, another in another home).
		for _, r := range rs {
			require.ElementsMatch(t, []string{"Accept", "Accept-Encoding", "Accept-Language", "Connection", "Content-Length", "Content-Type", "Host",
				"Sec-Fetch-Mode", "User-Agent", "X-Gemini-Api-Privileged-User-Id", "X-Goog-Api-Client", "X-Goog-Api-Key"}, slices.Collect(maps.Keys(r.Headers)))
		}
		id := rs[0].Headers["X-Gemini-Api-Privileged-User-Id"]
		require.Equal(t, id, rs[3].Headers["X-Gemini-Api-Privileged-User-Id"], "two sessions in one home: one id")
		require.NotEqual(t, id, rs[5].Headers["X-Gemini-Api-Privileged-User-Id"], "another home: another id")
		keep(t, map[string]capturedRequest{"gemini-classifier": rs[0], "gemini-turn": rs[1]},
			map[string]string{home: "/home/agent", work: "/work/project"})
	})
}

// lastItem is the raw last element of a body's input array.
func lastItem(t *testing.T, body json.RawMessage) string {
	t.Helper()
	var v struct {
		Input []json.RawMessage `json:"input"`
	}
	require.NoError(t, json.Unmarshal(body, &v))
	return string(v.Input[len(v.Input)-1])
}
