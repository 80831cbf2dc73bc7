package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestPassThroughIsInvisible: without a thread, bytes in are bytes out, both ways.
func TestPassThroughIsInvisible(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := "{ \"model\" : \"m\",\n \"messages\":[{\"role\":\"user\",\"content\":\"hi\"}], \"functions\": 3, \"x\":\"\\u00e9\" }"
	respBody := "{\"id\": \"x\",  \"weird\" : [1,2,3]}\n"
	e.up.Script(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Upstream", "yes")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write([]byte(respBody))
	})
	resp := e.post("/v1/chat/completions", map[string]string{"Authorization": "Bearer sk-client", "X-Thread-Id": ""}, body)
	require.Equal(t, http.StatusTeapot, resp.StatusCode)
	require.Equal(t, "yes", resp.Header.Get("X-Upstream"))
	require.Equal(t, respBody, testkit.ReadBody(t, resp))
	got := e.up.Requests()[0]
	require.Equal(t, body, string(got.Body))
	require.Equal(t, "/v1/chat/completions", got.Path)
	require.Equal(t, "Bearer sk-client", got.Header.Get("Authorization"))

	// Other routes, with the thread path form too, and a query string.
	e.up.Script(reply(`{"data":[]}`), reply(`{"data":[1]}`))
	resp, err := http.Get(e.srv.URL + "/v1/models?limit=2")
	require.NoError(t, err)
	require.Equal(t, `{"data":[]}`, testkit.ReadBody(t, resp))
	resp.Body.Close()
	resp = e.post("/threads/t1/v1/embeddings", nil, `{"input":"x"}`)
	require.Equal(t, `{"data":[1]}`, testkit.ReadBody(t, resp))
	reqs := e.up.Requests()
	require.Equal(t, "/v1/models?limit=2", reqs[1].Path)
	require.Equal(t, "/v1/embeddings", reqs[2].Path)
	require.Equal(t, `{"input":"x"}`, string(reqs[2].Body))

	// Pass-through needs no database: no thread was created.
	threads, err := e.store.Threads(context.Background(), "", "", workspace.ThreadFilter{}, 10)
	require.NoError(t, err)
	require.Empty(t, threads)
}

func TestPassThroughWorksWithoutPostgres(t *testing.T) {
	t.Parallel()
	_, cfg := dbtest.Schema(t)
	cfg.ConnConfig.Host = "/nonexistent"
	pool, err := pgxpoolNew(cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := setupWithPool(t, pool)
	e.up.Script(reply(cmpl("hello")))
	resp, err := e.goClient("").CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model: "m", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
	})
	require.NoError(t, err)
	require.Equal(t, "hello", resp.Choices[0].Message.Content)

	// A thread turn is never run without its workspace: 503.
	r := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t1"}, `{"messages":[]}`)
	require.Equal(t, http.StatusServiceUnavailable, r.StatusCode)
	testkit.RequireErrorBody(t, testkit.ReadBody(t, r), "server_error", "workspace_unavailable")
	require.Len(t, e.up.Requests(), 1)

	// Readiness follows Postgres; liveness does not.
	rr, err := http.Get(e.srv.URL + "/readyz")
	require.NoError(t, err)
	rr.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, rr.StatusCode)
	rr, err = http.Get(e.srv.URL + "/healthz")
	require.NoError(t, err)
	rr.Body.Close()
	require.Equal(t, http.StatusOK, rr.StatusCode)
	// The admin REST answers 503 too.
	e.admin("GET", "/admin/v1/threads", nil, http.StatusServiceUnavailable, nil)
}

// TestTurnWithToolsGoOpenAI: the model records preferences and the objective in one tool round,
// then answers; the client sees only the answer.
func TestTurnWithToolsGoOpenAI(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(
		reply(cmpl("", call{ID: "c1", Name: "add_preferences", Arguments: args(map[string]any{
			"items":                []map[string]any{{"title": "Academic tone", "subtitle": "Formal", "kind": "hard"}, {"title": "Short paragraphs"}},
			"action_and_reasoning": "The user stated two preferences.",
		})}, call{ID: "c2", Name: "set_objective", Arguments: `{"text":"Write a literature review on soil carbon"}`})),
		reply(cmpl("Noted. Here is the plan.")),
	)
	client := e.goClient("lit-review")
	resp, err := client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model:    "gpt-test",
		Messages: []goopenai.ChatCompletionMessage{{Role: "system", Content: "You are helpful."}, {Role: "user", Content: "Formal tone please, short paragraphs."}},
		Tools:    []goopenai.Tool{{Type: goopenai.ToolTypeFunction, Function: &goopenai.FunctionDefinition{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object"}`)}}},
	})
	require.NoError(t, err)
	require.Equal(t, "Noted. Here is the plan.", resp.Choices[0].Message.Content)
	require.Empty(t, resp.Choices[0].Message.ToolCalls)
	require.Equal(t, goopenai.FinishReasonStop, resp.Choices[0].FinishReason)
	require.Equal(t, "fp_test", resp.SystemFingerprint)
	require.Equal(t, "lit-review", resp.Header().Get("X-Thread-Id"))
	require.Equal(t, "2", resp.Header().Get("X-Workspace-Rounds"))
	// Usage is the sum of both rounds, nested details included.
	require.Equal(t, 20, resp.Usage.PromptTokens)
	require.Equal(t, 10, resp.Usage.CompletionTokens)
	require.Equal(t, 30, resp.Usage.TotalTokens)
	require.Equal(t, 4, resp.Usage.PromptTokensDetails.CachedTokens)

	// Round 1: the system prompt as the client sent it, the block after the user's message, the
	// client's tool then the proxy's five.
	r1 := e.upstreamRequest(0)
	msgs := messages(r1)
	require.Equal(t, map[string]any{"role": "system", "content": "You are helpful."}, msgs[0])
	require.Equal(t, "Formal tone please, short paragraphs.\n\nINSTR\n\n<workspace>\nObjective: (none yet)\nPreferences: (none yet)\n</workspace>", msgs[1]["content"])
	require.Equal(t, append([]string{"get_weather"}, tools.Names...), toolNames(r1))
	// Round 2: the assistant's calls and one tool message per call, with the envelope.
	msgs = messages(e.upstreamRequest(1))
	require.Len(t, msgs, 5)
	require.Equal(t, "assistant", msgs[2]["role"])
	require.Len(t, msgs[2]["tool_calls"], 2)
	require.Equal(t, map[string]any{"role": "tool", "tool_call_id": "c1", "content": `{"ok":true,"result":"recorded 2 preferences"}`}, msgs[3])
	require.Equal(t, `{"ok":true,"result":"objective set: Write a literature review on soil carbon"}`, msgs[4]["content"])
	require.Equal(t, "Bearer sk-client", e.up.Requests()[1].Header.Get("Authorization"))
	require.Empty(t, e.up.Requests()[1].Header.Get("X-Thread-Id"))

	d := e.workspace("lit-review")
	require.Equal(t, "<workspace>\nObjective: Write a literature review on soil carbon\nPreferences:\n"+
		"#1 [hard] Academic tone — Formal\n#2 [soft] Short paragraphs\n</workspace>", d.Block)

	// The recorded calls carry their reasoning.
	var calls page[workspace.ToolCallRecord]
	e.admin("GET", "/admin/v1/threads/lit-review/tool-calls", nil, 200, &calls)
	require.Len(t, calls.Data, 2)
	require.Equal(t, "The user stated two preferences.", calls.Data[0].ActionAndReasoning)
	require.Equal(t, 1, *calls.Data[0].Turn)
	require.Equal(t, 1, *calls.Data[0].Round)

	// Turn 2: the block shows what turn 1 recorded, byte-identical instructions.
	e.up.Script(reply(cmpl("ok")))
	_, err = client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model: "gpt-test", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "next"}},
	})
	require.NoError(t, err)
	msgs = messages(e.upstreamRequest(2))
	require.Equal(t, "next\n\nINSTR\n\n"+d.Block, msgs[0]["content"])
}

// TestOneRoundIsByteIdentical: a turn the model answers at once returns the upstream's body
// unchanged, with every field the proxy does not own.
func TestOneRoundIsByteIdentical(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","system_fingerprint":"fp_1","service_tier":"flex",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"hi","reasoning_content":"thinking…"},"logprobs":{"content":[{"token":"hi","logprob":-0.1}]},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4},"vendor_extra":{"a":1}}`
	e.up.Script(reply(body))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t1"},
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"top_k":40,"chat_template_kwargs":{"enable_thinking":true},"logprobs":true,"x_vendor":{"deep":[1,{"b":"c"}]}}`)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, body, testkit.ReadBody(t, resp))
	require.Equal(t, "1", resp.Header.Get("X-Workspace-Rounds"))
	got := e.upstreamRequest(0)
	require.Equal(t, float64(40), got["top_k"])
	require.Equal(t, map[string]any{"enable_thinking": true}, got["chat_template_kwargs"])
	require.Equal(t, true, got["logprobs"])
	require.Equal(t, map[string]any{"deep": []any{float64(1), map[string]any{"b": "c"}}}, got["x_vendor"])
}

// TestMixedCallsNonStreamed: the proxy runs its own calls, the client gets only its own.
func TestMixedCallsNonStreamed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(reply(cmpl("Checking.",
		call{ID: "p1", Name: "add_preferences", Arguments: `{"items":[{"title":"Celsius"}]}`},
		call{ID: "c1", Name: "get_weather", Arguments: `{"city":"Paris"}`},
	)))
	resp, err := e.goClient("mixed").CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model:    "gpt-test",
		Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Weather in Paris, in Celsius."}},
		Tools:    []goopenai.Tool{{Type: goopenai.ToolTypeFunction, Function: &goopenai.FunctionDefinition{Name: "get_weather"}}},
	})
	require.NoError(t, err)
	ch := resp.Choices[0]
	require.Equal(t, goopenai.FinishReasonToolCalls, ch.FinishReason)
	require.Len(t, ch.Message.ToolCalls, 1)
	require.Equal(t, "get_weather", ch.Message.ToolCalls[0].Function.Name)
	require.Equal(t, "c1", ch.Message.ToolCalls[0].ID)
	require.Equal(t, "Checking.", ch.Message.Content)
	require.Len(t, e.up.Requests(), 1)
	require.Equal(t, "Celsius", e.workspace("mixed").Preferences[0].Title)
}

// TestMaxToolRounds: after MAX_TOOL_ROUNDS tool rounds, one last call without the proxy's tools.
func TestMaxToolRounds(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.MaxToolRounds = 2 })
	list := reply(cmpl("", call{ID: "l", Name: "list_preferences", Arguments: `{}`}))
	e.up.Script(list, list, reply(cmpl("", call{ID: "l3", Name: "list_preferences", Arguments: `{}`})))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "loop"},
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":"auto"}`)
	body := testkit.ReadBody(t, resp)
	require.Equal(t, 200, resp.StatusCode, body)
	require.Equal(t, "3", resp.Header.Get("X-Workspace-Rounds"))
	reqs := e.up.Requests()
	require.Len(t, reqs, 3)
	require.Equal(t, tools.Names, toolNames(reqs[0].JSON(t)))
	last := reqs[2].JSON(t)
	require.NotContains(t, last, "tools")
	require.NotContains(t, last, "tool_choice")
	// The model called a workspace tool it was not offered: the client gets an answer, no calls.
	var c goopenai.ChatCompletionResponse
	require.NoError(t, json.Unmarshal([]byte(body), &c))
	require.Empty(t, c.Choices[0].Message.ToolCalls)
	require.Equal(t, goopenai.FinishReasonStop, c.Choices[0].FinishReason)
	require.Equal(t, 45, c.Usage.TotalTokens)
}

// TestLocksHoldInTheLoop: a preference the user locked survives the model's edit and remove,
// and the model is told to ask the user.
func TestLocksHoldInTheLoop(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var p workspace.Preference
	e.admin("POST", "/admin/v1/threads/lk/preferences", map[string]any{"title": "No jargon", "kind": "hard"}, 201, &p)
	e.admin("PATCH", "/admin/v1/threads/lk/preferences/"+strconv.FormatInt(p.ID, 10), map[string]any{"locked": true}, 200, &p)
	require.True(t, p.Locked)
	e.up.Script(
		reply(cmpl("", call{ID: "a", Name: "remove_preferences", Arguments: `{"indices":[1]}`},
			call{ID: "b", Name: "update_preferences", Arguments: `{"updates":[{"index":1,"title":"Jargon is fine"}]}`})),
		reply(cmpl("That one is locked; please unlock it first.")),
	)
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "lk"}, `{"model":"m","messages":[{"role":"user","content":"drop the jargon rule"}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	r1 := messages(e.upstreamRequest(0))
	require.Contains(t, r1[0]["content"], "#1 [hard] No jargon (locked)")
	msgs := messages(e.upstreamRequest(1))
	require.Equal(t, `{"ok":true,"result":"locked, ask the user to unlock first: #1 \"No jargon\""}`, msgs[len(msgs)-2]["content"])
	require.Equal(t, `{"ok":true,"result":"locked, ask the user to unlock first: #1 \"No jargon\""}`, msgs[len(msgs)-1]["content"])
	d := e.workspace("lk")
	require.Len(t, d.Preferences, 1)
	require.Equal(t, "No jargon", d.Preferences[0].Title)
}

// TestToolErrorsGoBackToTheModel: broken arguments and unknown tools become error envelopes;
// the loop goes on.
func TestToolErrorsGoBackToTheModel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(
		reply(cmpl("", call{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":`},
			call{ID: "b", Name: "made_up_tool", Arguments: `{}`},
			call{Name: "set_objective", Arguments: `{"text":""}`})),
		reply(cmpl("Sorry, fixed.")),
	)
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "errs"}, `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	msgs := messages(e.upstreamRequest(1))
	n := len(msgs)
	require.Equal(t, `{"ok":false,"error":"arguments are not a JSON object"}`, msgs[n-3]["content"])
	require.Contains(t, msgs[n-2]["content"], `unknown tool \"made_up_tool\"`)
	require.Contains(t, msgs[n-1]["content"], `text: must not be empty`)
	// A call without an id gets one, and its tool message answers it.
	assistant := msgs[n-4]["tool_calls"].([]any)
	id := assistant[2].(map[string]any)["id"].(string)
	require.True(t, strings.HasPrefix(id, "call_"), id)
	require.Equal(t, id, msgs[n-1]["tool_call_id"])
	require.Empty(t, e.workspace("errs").Preferences)
}

func TestThreadBindingErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tests := []struct {
		name, path, header, code string
		status                   int
	}{
		{"Mismatch", "/threads/a/v1/chat/completions", "b", "thread_mismatch", 400},
		{"BadHeader", "/v1/chat/completions", "has space", "invalid_thread_id", 400},
		{"BadPath", "/threads/a%2Fb/v1/chat/completions", "", "invalid_thread_id", 400},
		{"TooLong", "/v1/chat/completions", strings.Repeat("x", 129), "invalid_thread_id", 400},
		{"MismatchPassThrough", "/threads/a/v1/models", "b", "thread_mismatch", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := e.post(tt.path, map[string]string{"X-Thread-Id": tt.header}, `{"messages":[]}`)
			require.Equal(t, tt.status, resp.StatusCode)
			testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "invalid_request_error", tt.code)
		})
	}
	// The same id both ways is fine; 128 characters of the allowed set are fine.
	id := strings.Repeat("aZ0._:@-", 16)
	e.up.Script(reply(cmpl("ok")))
	resp := e.post("/threads/"+id+"/v1/chat/completions", map[string]string{"X-Thread-Id": id}, `{"messages":[]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Empty(t, e.up.Remaining())
}

func TestRequestErrors(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.MaxRequestBytes = 1024 })
	th := map[string]string{"X-Thread-Id": "t"}
	tests := []struct {
		name, body, code string
		header           map[string]string
		status           int
	}{
		{"NotJSON", `{"messages":`, "invalid_json", th, 400},
		{"NoMessages", `{"model":"m"}`, "missing_required_parameter", th, 400},
		{"Reserved", `{"messages":[],"tools":[{"type":"function","function":{"name":"add_preferences"}}]}`, "reserved_tool_name", th, 400},
		{"N", `{"messages":[],"n":3}`, "unsupported_parameter", th, 400},
		{"TooLargeTurn", `{"messages":[],"x":"` + strings.Repeat("x", 1100) + `"}`, "request_too_large", th, 413},
		{"TooLargePassThrough", `{"messages":[],"x":"` + strings.Repeat("x", 1100) + `"}`, "request_too_large", nil, 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := e.post("/v1/chat/completions", tt.header, tt.body)
			require.Equal(t, tt.status, resp.StatusCode)
			testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "invalid_request_error", tt.code)
		})
	}
	require.Empty(t, e.up.Requests())
	threads, err := e.store.Threads(context.Background(), "", "", workspace.ThreadFilter{}, 10)
	require.NoError(t, err)
	require.Empty(t, threads, "no turn started for a refused request")

	// Legacy functions: passed through without a workspace, no thread created.
	e.up.Script(reply(`{"legacy":true}`))
	resp := e.post("/v1/chat/completions", th, `{"messages":[],"functions":[{"name":"f"}]}`)
	require.Equal(t, `{"legacy":true}`, testkit.ReadBody(t, resp))
	require.Equal(t, `{"messages":[],"functions":[{"name":"f"}]}`, string(e.up.Requests()[0].Body))
	threads, err = e.store.Threads(context.Background(), "", "", workspace.ThreadFilter{}, 10)
	require.NoError(t, err)
	require.Empty(t, threads)
}

// TestUpstreamErrors: an upstream's error comes back unchanged; one that cannot be reached or
// stays silent gets 502 or 504. What tools wrote before a failure stays written.
func TestUpstreamErrors(t *testing.T) {
	t.Parallel()

	t.Run("ErrorBodyUnchanged", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		body := `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
		e.up.Script(upstreamtest.JSON(429, body))
		resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t"}, `{"messages":[]}`)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, body, testkit.ReadBody(t, resp))
	})

	t.Run("ErrorAfterToolsKeepsTheirWrites", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		boom := upstreamtest.JSON(500, `{"error":{"message":"boom"}}`)
		e.up.Script(reply(cmpl("", call{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":"Kept"}]}`})),
			boom, boom, boom, boom) // the round after the tools, and its three retries
		resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t"}, `{"messages":[]}`)
		require.Equal(t, 500, resp.StatusCode)
		require.Equal(t, `{"error":{"message":"boom"}}`, testkit.ReadBody(t, resp))
		e.up.Script(reply(cmpl("ok")))
		e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t"}, `{"messages":[]}`)
		require.Contains(t, messages(e.upstreamRequest(5))[0]["content"], "#1 [soft] Kept")
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Close()
		for _, h := range []map[string]string{{"X-Thread-Id": "t"}, nil} {
			resp := e.post("/v1/chat/completions", h, `{"messages":[]}`)
			require.Equal(t, http.StatusBadGateway, resp.StatusCode)
			testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "server_error", "upstream_unreachable")
		}
	})

	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		e := setup(t, func(o *Options) { o.UpstreamTimeout = 200 * time.Millisecond })
		e.up.Script(upstreamtest.Hang(nil), upstreamtest.Hang(nil))
		for _, h := range []map[string]string{{"X-Thread-Id": "t"}, nil} {
			resp := e.post("/v1/chat/completions", h, `{"messages":[]}`)
			require.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
			testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "server_error", "upstream_timeout")
		}
	})

	// A redirect is the upstream's answer, as it is to a pass-through: the turn does not follow
	// it (the request would go on, with the client's credentials, where the operator never
	// pointed wsproxy).
	t.Run("RedirectNotFollowed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		body := `{"error":{"message":"moved"}}`
		e.up.Script(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", e.up.URL+"/elsewhere")
			upstreamtest.JSON(http.StatusTemporaryRedirect, body)(w, r)
		}, reply(cmpl("followed")))
		req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"messages":[]}`))
		require.NoError(t, err)
		req.Header.Set("X-Thread-Id", "t")
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
		require.Equal(t, body, testkit.ReadBody(t, resp))
		require.Len(t, e.up.Requests(), 1, "the upstream's redirect was followed")
	})

	t.Run("NotOpenAI", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(reply(`<html>gateway</html>`))
		resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t"}, `{"messages":[]}`)
		require.Equal(t, http.StatusBadGateway, resp.StatusCode)
		testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "server_error", "upstream_invalid_response")
	})
}

func TestUpstreamKeyReplacesClients(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.UpstreamAPIKey = "sk-upstream" })
	e.up.Script(reply(cmpl("a")), reply(cmpl("b")))
	e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t", "Authorization": "Bearer sk-client"}, `{"messages":[]}`)
	e.post("/v1/chat/completions", map[string]string{"Authorization": "Bearer sk-client"}, `{"messages":[]}`)
	for _, r := range e.up.Requests() {
		require.Equal(t, "Bearer sk-upstream", r.Header.Get("Authorization"))
	}
}

func TestErrorMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{apierr.ErrUpstreamTimeout, 504, "upstream_timeout"},
		{apierr.ErrUpstreamUnreachable, 502, "upstream_unreachable"},
		{apierr.ErrUpstreamProtocol, 502, "upstream_invalid_response"},
		{workspace.ErrNotFound, 404, "not_found"},
		{&workspace.ValidationError{Field: "title", Message: "x"}, 400, "invalid_value"},
		{&workspace.DuplicateError{Existing: workspace.Preference{Index: 2, Title: "A"}}, 409, "duplicate_preference"},
		{context.Canceled, apierr.StatusClientClosedRequest, "client_closed_request"},
		{fmt.Errorf("%w: %w", workspace.ErrUnavailable, errors.New("dial tcp: connection refused")), 503, "workspace_unavailable"},
		{fmt.Errorf("%w: %w", workspace.ErrUnavailable, context.DeadlineExceeded), 503, "workspace_unavailable"},
		{errors.New("boom"), 500, "internal_error"},
		{fmt.Errorf("encode response: %w", errors.New("json: unsupported value")), 500, "internal_error"},
	}
	for _, tt := range tests {
		e := apierr.From(tt.err)
		require.Equal(t, tt.status, e.Status, "%v", tt.err)
		require.Equal(t, tt.code, e.Code, "%v", tt.err)
	}
	require.Contains(t, apierr.From(&workspace.DuplicateError{Existing: workspace.Preference{Index: 2, Title: "A"}}).Message, `#2 "A"`)
}

// TestPassThroughFlushesEvents: a streamed pass-through response reaches the client event by
// event (the upstream holds its second event until the client has the first).
func TestPassThroughFlushesEvents(t *testing.T) {
	t.Parallel()
	e := setup(t)
	gotFirst := make(chan struct{})
	e.up.Script(func(w http.ResponseWriter, r *http.Request) {
		upstreamtest.StreamRaw([]string{"data: one\n\n"})(w, r)
		select {
		case <-gotFirst:
		case <-time.After(10 * time.Second):
			return
		}
		upstreamtest.WriteRaw(w, "data: two\n\n", "data: [DONE]\n\n")
	})
	resp := e.post("/v1/chat/completions", nil, `{"stream":true,"messages":[]}`)
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "data: one\n", line)
	close(gotFirst)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	require.Equal(t, "\ndata: two\n\ndata: [DONE]\n\n", string(rest))
}

// TestRetryAfterTools: a round that follows executed tools is retried when the upstream fails
// in a way that may pass; the client gets its answer and the tools ran once.
func TestRetryAfterTools(t *testing.T) {
	t.Parallel()
	th := map[string]string{"X-Thread-Id": "r"}

	t.Run("NonStreamed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(reply(cmpl("", call{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":"Once"}]}`})),
			upstreamtest.JSON(503, `{"error":{"message":"overloaded"}}`),
			upstreamtest.JSON(429, `{"error":{"message":"slow down"}}`),
			func(w http.ResponseWriter, r *http.Request) { // cut off mid-body
				w.Header().Set("Content-Length", "1000")
				_, _ = io.WriteString(w, `{"id":`)
			},
			reply(cmpl("Recorded.")))
		resp := e.post("/v1/chat/completions", th, `{"messages":[]}`)
		body := testkit.ReadBody(t, resp)
		require.Equal(t, 200, resp.StatusCode, body)
		require.Contains(t, body, "Recorded.")
		require.Equal(t, "2", resp.Header.Get("X-Workspace-Rounds"), "a retried round is one round")
		require.Len(t, e.workspace("r").Preferences, 1)
		require.Len(t, e.up.Requests(), 5)
		require.Equal(t, e.up.Requests()[1].Body, e.up.Requests()[4].Body, "the same round, sent again")
	})

	t.Run("Streamed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.Stream(upstreamtest.ToolCallChunks("chatcmpl-r", 5, call{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":"Once"}]}`})...),
			upstreamtest.StreamNoDone(upstreamtest.ContentChunks("chatcmpl-x", "lost")[0]), // ends early, before any content
			upstreamtest.Stream(upstreamtest.ContentChunks("chatcmpl-y", "Recorded.")...))
		tr := checkStream(t, streamBody(t, e.post("/v1/chat/completions", th, `{"stream":true,"messages":[]}`)))
		require.Equal(t, "Recorded.", tr.content)
		require.Len(t, e.workspace("r").Preferences, 1)
	})

	t.Run("NotAfterPartOfTheRoundWentOut", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.Stream(upstreamtest.ToolCallChunks("chatcmpl-r", 5, call{ID: "a", Name: "list_preferences", Arguments: `{}`})...),
			upstreamtest.StreamNoDone(upstreamtest.ContentChunks("chatcmpl-x", "half")[:2]...))
		body := streamBody(t, e.post("/v1/chat/completions", th, `{"stream":true,"messages":[]}`))
		require.Contains(t, body, `"content":"half"`)
		require.Contains(t, body, `"code":"upstream_invalid_response"`)
		require.Len(t, e.up.Requests(), 2)
	})

	t.Run("NotTheFirstRound", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.JSON(503, `{"error":{"message":"overloaded"}}`))
		resp := e.post("/v1/chat/completions", th, `{"messages":[]}`)
		require.Equal(t, 503, resp.StatusCode)
		require.Len(t, e.up.Requests(), 1)
	})
}
