package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// The recipes of docs/upstreams.md, "Composed with a gateway": wsproxy in front of a LiteLLM
// proxy and in front of OpenRouter, each against a fake that answers as that gateway publishes
// (LiteLLM's response headers of docs/proxy/response_headers; OpenRouter's generation ids and
// its usage accounting in the body).

// withHeaders is reply answering with the gateway's response headers h.
func withHeaders(h map[string]string, reply upstreamtest.Reply) upstreamtest.Reply {
	return func(w http.ResponseWriter, r *http.Request) {
		for k, v := range h {
			w.Header().Set(k, v)
		}
		reply(w, r)
	}
}

// liteLLMHeaders are the headers a LiteLLM proxy puts on an answer, the round's own call id and
// cost among them.
func liteLLMHeaders(callID, cost, keySpend string) map[string]string {
	return map[string]string{
		"x-litellm-call-id":                 callID,
		"x-litellm-model-id":                "9d4e5f0b2c1a-model",
		"x-litellm-model-group":             "gpt-4o-mini",
		"x-litellm-model-api-base":          "https://api.openai.com",
		"x-litellm-version":                 "1.80.0",
		"x-litellm-response-cost":           cost,
		"x-litellm-key-spend":               keySpend,
		"x-litellm-response-duration-ms":    "812.4",
		"x-litellm-overhead-duration-ms":    "3.1",
		"x-litellm-attempted-retries":       "0",
		"x-litellm-attempted-fallbacks":     "0",
		"x-ratelimit-remaining-requests":    "9999",
		"llm_provider-openai-processing-ms": "640",
	}
}

// liteLLMCompletion is a chat completion as a LiteLLM proxy returns it (its OpenAI-shaped body,
// function_call and tool_calls null when absent, token details with nulls).
func liteLLMCompletion(id, content string, prompt, completion int, calls ...call) string {
	msg := map[string]any{"role": "assistant", "content": content, "tool_calls": nil, "function_call": nil}
	finish := "stop"
	if len(calls) > 0 {
		var tcs []any
		for _, c := range calls {
			tcs = append(tcs, map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}})
		}
		msg["content"], msg["tool_calls"], finish = nil, tcs, "tool_calls"
	}
	b, _ := json.Marshal(map[string]any{
		"id": id, "created": 1764640000, "model": "gpt-4o-mini-2024-07-18", "object": "chat.completion",
		"system_fingerprint": "fp_litellm", "service_tier": "default",
		"choices": []any{map[string]any{"finish_reason": finish, "index": 0, "message": msg}},
		"usage": map[string]any{"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": prompt + completion,
			"completion_tokens_details": map[string]any{"accepted_prediction_tokens": 0, "audio_tokens": 0, "reasoning_tokens": 0, "rejected_prediction_tokens": 0},
			"prompt_tokens_details":     map[string]any{"audio_tokens": nil, "cached_tokens": 0},
			// What LiteLLM adds for an Anthropic model: the tokens written to its prompt cache.
			"cache_creation_input_tokens": prompt / 10},
	})
	return string(b)
}

// sseChunks are the JSON data of a chat stream's events, [DONE] left out.
func sseChunks(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &m), data)
		out = append(out, m)
	}
	return out
}

// streamedUsage is the usage of the chunk of a chat stream that carries one.
func streamedUsage(t *testing.T, chunks []map[string]any) map[string]any {
	t.Helper()
	var usage map[string]any
	for _, c := range chunks {
		if u, ok := c["usage"].(map[string]any); ok {
			require.Nil(t, usage, "one chunk carries the usage")
			usage = u
		}
	}
	require.NotNil(t, usage, "a chunk carries the usage")
	return usage
}

const gatewayTurn = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"My goal is a trip to Lisbon. I prefer small hotels."}]}`

var addHotels = call{ID: "call_1", Name: "add_preferences", Arguments: `{"items":[{"title":"Small hotels"}],"action_and_reasoning":"The user prefers small hotels."}`}

// TestLiteLLMGateway: wsproxy → LiteLLM proxy (docs/upstreams.md). The client's x-litellm-*
// headers and its virtual key reach LiteLLM on every round of a turn; a non-streamed turn's
// client gets the last round's x-litellm-* headers (its call id, its cost) and the usage summed
// over the rounds; a streamed turn's gets the summed usage and none of LiteLLM's headers (the
// stream's headers go out before the rounds end). The Messages API goes to LiteLLM's
// /v1/messages the same way.
func TestLiteLLMGateway(t *testing.T) {
	t.Parallel()
	e := setup(t)
	client := map[string]string{
		"Authorization":                 "Bearer sk-litellm-alice", // a LiteLLM virtual key, forwarded: no UPSTREAM_API_KEY
		"x-litellm-tags":                "team-a,essay",
		"x-litellm-timeout":             "120",
		"x-litellm-num-retries":         "2",
		"x-litellm-spend-logs-metadata": `{"project":"lisbon"}`,
	}
	requireForwarded := func(reqs []upstreamtest.Request) {
		t.Helper()
		for _, r := range reqs {
			require.Equal(t, "/v1/chat/completions", r.Path)
			require.Equal(t, "Bearer sk-litellm-alice", r.Header.Get("Authorization"))
			for k, v := range client {
				require.Equal(t, v, r.Header.Get(k), "round %s: %s", r.Path, k)
			}
		}
	}

	t.Run("json", func(t *testing.T) {
		e.up.Script(
			withHeaders(liteLLMHeaders("call-round-1", "0.000042", "1.200042"), reply(liteLLMCompletion("chatcmpl-r1", "", 120, 30, addHotels))),
			withHeaders(liteLLMHeaders("call-round-2", "0.000058", "1.200100"), reply(liteLLMCompletion("chatcmpl-r2", "Noted: small hotels.", 180, 20))),
		)
		before := len(e.up.Requests())
		h := map[string]string{"X-Thread-Id": "litellm-json"}
		for k, v := range client {
			h[k] = v
		}
		resp := e.post("/v1/chat/completions", h, gatewayTurn)
		body := testkit.ReadBody(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		reqs := e.up.Requests()[before:]
		require.Len(t, reqs, 2, "a tool round, then the answer")
		requireForwarded(reqs)

		require.Equal(t, "2", resp.Header.Get("X-Workspace-Rounds"))
		// The last round's headers: its call id and its cost alone (LiteLLM's spend logs have both
		// rounds; x-litellm-key-spend is the key's total after the last).
		require.Equal(t, "call-round-2", resp.Header.Get("x-litellm-call-id"))
		require.Equal(t, "0.000058", resp.Header.Get("x-litellm-response-cost"))
		require.Equal(t, "1.200100", resp.Header.Get("x-litellm-key-spend"))
		require.Equal(t, "9d4e5f0b2c1a-model", resp.Header.Get("x-litellm-model-id"))
		require.Equal(t, "1.80.0", resp.Header.Get("x-litellm-version"))
		require.Equal(t, "640", resp.Header.Get("llm_provider-openai-processing-ms"))

		var answer struct {
			ID      string `json:"id"`
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage map[string]any `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &answer), body)
		require.Equal(t, "chatcmpl-r2", answer.ID)
		require.Equal(t, "Noted: small hotels.", answer.Choices[0].Message.Content)
		require.Equal(t, 300.0, answer.Usage["prompt_tokens"])
		require.Equal(t, 50.0, answer.Usage["completion_tokens"])
		require.Equal(t, 350.0, answer.Usage["total_tokens"])
		require.Equal(t, map[string]any{"audio_tokens": nil, "cached_tokens": 0.0}, answer.Usage["prompt_tokens_details"])
		require.Equal(t, 30.0, answer.Usage["cache_creation_input_tokens"], "summed like every number")
		require.Equal(t, "Small hotels", e.workspace("litellm-json").Preferences[0].Title)
		// The thread's totals (docs/spec.md §8): chat completions' cache writes are not read.
		require.Eventually(t, func() bool { return e.workspace("litellm-json").Usage.PromptTokens == 300 }, 5*time.Second, 10*time.Millisecond)
		require.Zero(t, e.workspace("litellm-json").Usage.CacheWriteTokens)
	})

	t.Run("stream", func(t *testing.T) {
		e.up.Script(
			withHeaders(liteLLMHeaders("call-round-1", "0.000042", "1.2"), upstreamtest.Stream(upstreamtest.Join(
				upstreamtest.ToolCallChunks("chatcmpl-s1", 16, addHotels),
				[]string{upstreamtest.UsageChunk("chatcmpl-s1", 120, 30)})...)),
			withHeaders(liteLLMHeaders("call-round-2", "0.000058", "1.3"), upstreamtest.Stream(upstreamtest.Join(
				upstreamtest.ContentChunks("chatcmpl-s2", "Noted: ", "small hotels."),
				[]string{upstreamtest.UsageChunk("chatcmpl-s2", 180, 20)})...)),
		)
		before := len(e.up.Requests())
		h := map[string]string{"X-Thread-Id": "litellm-stream"}
		for k, v := range client {
			h[k] = v
		}
		resp := e.post("/v1/chat/completions", h, strings.Replace(gatewayTurn, `{"model"`, `{"stream":true,"stream_options":{"include_usage":true},"model"`, 1))
		body := streamBody(t, resp)
		reqs := e.up.Requests()[before:]
		require.Len(t, reqs, 2)
		requireForwarded(reqs)

		// The stream's headers went out with its first event: LiteLLM's are not among them.
		require.Empty(t, resp.Header.Get("x-litellm-call-id"))
		require.Empty(t, resp.Header.Get("x-litellm-response-cost"))
		usage := streamedUsage(t, sseChunks(t, body))
		require.Equal(t, 300.0, usage["prompt_tokens"])
		require.Equal(t, 50.0, usage["completion_tokens"])
		require.Contains(t, body, "small hotels.")
	})

	t.Run("messages", func(t *testing.T) {
		// ANTHROPIC_UPSTREAM_BASE_URL is LiteLLM's root: the turn's rounds go to its /v1/messages,
		// the virtual key in x-api-key, as Anthropic's clients send it.
		headers := func(callID, cost string) map[string]string {
			h := liteLLMHeaders(callID, cost, "2.0")
			h["x-litellm-model-group"] = "claude-sonnet-4-5"
			return h
		}
		e.up.Script(
			withHeaders(headers("call-m1", "0.0031"), upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_r1", Blocks: []upstreamtest.Block{
				upstreamtest.ToolUseBlock("toolu_1", "add_preferences", addHotels.Arguments)}})),
			withHeaders(headers("call-m2", "0.0047"), upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_r2", Blocks: []upstreamtest.Block{
				upstreamtest.TextBlock("Noted: small hotels.")}})),
		)
		before := len(e.up.Requests())
		resp := e.post("/threads/litellm-messages/v1/messages", map[string]string{
			"x-api-key": "sk-litellm-alice", "anthropic-version": "2023-06-01", "x-litellm-tags": "team-a"},
			`{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"I prefer small hotels."}]}`)
		body := testkit.ReadBody(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		reqs := e.up.Requests()[before:]
		require.Len(t, reqs, 2)
		for _, r := range reqs {
			require.Equal(t, "/v1/messages", r.Path)
			require.Equal(t, "sk-litellm-alice", r.Header.Get("X-Api-Key"))
			require.Equal(t, "team-a", r.Header.Get("x-litellm-tags"))
		}
		require.Equal(t, "call-m2", resp.Header.Get("x-litellm-call-id"))
		require.Equal(t, "0.0047", resp.Header.Get("x-litellm-response-cost"))
		var m struct {
			Usage map[string]float64 `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &m), body)
		require.Equal(t, map[string]float64{"input_tokens": 20, "cache_creation_input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 10}, m.Usage)
	})
}

// TestLiteLLMGatewayKeys: the operator's key toward LiteLLM. With CLIENT_KEYS, the clients' keys
// are wsproxy's: every header that may carry a credential is stripped (x-litellm-api-key among
// them, LiteLLM's own header for its virtual keys) and LiteLLM gets UPSTREAM_API_KEY alone; the
// x-litellm-* headers that carry no credential pass. Without CLIENT_KEYS, UPSTREAM_API_KEY
// replaces the client's Authorization only: a client's x-litellm-api-key goes on, and LiteLLM
// reads it before Authorization.
func TestLiteLLMGatewayKeys(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-wsproxy-alice")
	require.NoError(t, err)
	for _, c := range []struct {
		name       string
		configure  func(*Options)
		litellmKey string // the x-litellm-api-key LiteLLM gets
	}{
		{"client keys", func(o *Options) { o.ClientKeys, o.UpstreamAPIKey = keys, "sk-litellm-operator" }, ""},
		{"operator key only", func(o *Options) { o.UpstreamAPIKey = "sk-litellm-operator" }, "Bearer sk-litellm-alice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, c.configure)
			e.up.Script(
				withHeaders(liteLLMHeaders("call-1", "0.00001", "0.5"), reply(liteLLMCompletion("chatcmpl-1", "", 10, 5, addHotels))),
				withHeaders(liteLLMHeaders("call-2", "0.00002", "0.5"), reply(liteLLMCompletion("chatcmpl-2", "Noted.", 12, 3))),
			)
			resp := e.post("/threads/keys/v1/chat/completions", map[string]string{
				"Authorization":     "Bearer sk-wsproxy-alice",
				"x-litellm-api-key": "Bearer sk-litellm-alice",
				"x-litellm-tags":    "team-a",
			}, gatewayTurn)
			body := testkit.ReadBody(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			require.Equal(t, "call-2", resp.Header.Get("x-litellm-call-id"))
			reqs := e.up.Requests()
			require.Len(t, reqs, 2)
			for _, r := range reqs {
				require.Equal(t, "Bearer sk-litellm-operator", r.Header.Get("Authorization"))
				require.Equal(t, c.litellmKey, r.Header.Get("x-litellm-api-key"))
				require.Equal(t, "team-a", r.Header.Get("x-litellm-tags"))
			}
		})
	}
	require.True(t, clientCredential("x-litellm-api-key"))
	for _, h := range []string{"x-litellm-tags", "x-litellm-timeout", "x-litellm-num-retries", "x-litellm-stream-timeout",
		"x-litellm-spend-logs-metadata", "x-litellm-customer-id", "x-litellm-end-user-id", "HTTP-Referer", "X-Title", "X-OpenRouter-Title"} {
		require.False(t, clientCredential(h), h)
	}
}

// openRouterUsage is OpenRouter's usage accounting of one generation: the tokens, the cost in
// credits, whether the key was the user's own provider key, the cost's details.
func openRouterUsage(prompt, completion int, cost float64) map[string]any {
	return map[string]any{
		"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
		"cost": cost, "is_byok": false,
		"prompt_tokens_details":     map[string]any{"cached_tokens": 0, "cache_write_tokens": 0, "audio_tokens": 0},
		"cost_details":              map[string]any{"upstream_inference_cost": nil},
		"completion_tokens_details": map[string]any{"reasoning_tokens": 0, "image_tokens": 0},
	}
}

// openRouterCompletion is a chat completion as OpenRouter returns it: the generation's id, the
// provider that served it, native_finish_reason, the usage accounting.
func openRouterCompletion(id, content string, usage map[string]any, calls ...call) string {
	msg := map[string]any{"role": "assistant", "content": content, "refusal": nil, "reasoning": nil}
	finish := "stop"
	if len(calls) > 0 {
		var tcs []any
		for i, c := range calls {
			tcs = append(tcs, map[string]any{"index": i, "id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}})
		}
		msg["tool_calls"], finish = tcs, "tool_calls"
	}
	b, _ := json.Marshal(map[string]any{
		"id": id, "provider": "OpenAI", "model": "openai/gpt-4o-mini", "object": "chat.completion", "created": 1764640000,
		"system_fingerprint": "fp_openrouter",
		"choices":            []any{map[string]any{"logprobs": nil, "finish_reason": finish, "native_finish_reason": finish, "index": 0, "message": msg}},
		"usage":              usage,
	})
	return string(b)
}

// openRouterStream is a generation streamed as OpenRouter streams it: a processing comment
// first, chunks with the generation's id and provider, the usage on a last chunk, then [DONE].
func openRouterStream(id string, usage map[string]any, deltas ...string) upstreamtest.Reply {
	pieces := []string{": OPENROUTER PROCESSING\n\n"}
	chunk := func(delta, finish string, u map[string]any) string {
		c := map[string]any{"id": id, "provider": "OpenAI", "model": "openai/gpt-4o-mini", "object": "chat.completion.chunk", "created": 1764640000,
			"choices": []any{map[string]any{"index": 0, "delta": json.RawMessage(delta), "finish_reason": nil, "native_finish_reason": nil, "logprobs": nil}}}
		if finish != "" {
			c["choices"].([]any)[0].(map[string]any)["finish_reason"] = finish
			c["choices"].([]any)[0].(map[string]any)["native_finish_reason"] = finish
		}
		if u != nil {
			c["usage"] = u
		}
		b, _ := json.Marshal(c)
		return "data: " + string(b) + "\n\n"
	}
	for i, d := range deltas {
		finish := ""
		if i == len(deltas)-1 {
			finish = "stop"
			if strings.Contains(d, "tool_calls") {
				finish = "tool_calls"
			}
		}
		pieces = append(pieces, chunk(d, finish, nil))
	}
	pieces = append(pieces, chunk(`{"role":"assistant","content":""}`, "", usage), "data: [DONE]\n\n")
	return upstreamtest.StreamRaw(pieces)
}

// TestOpenRouterGateway: wsproxy → OpenRouter (docs/upstreams.md). The client's app attribution
// (HTTP-Referer, X-Title, X-OpenRouter-Title) reaches OpenRouter on every round, with client keys
// too, the operator's key in Authorization. The client gets OpenRouter's extras as they came:
// non-streamed, the last round's body (its generation id, its provider) with the usage summed —
// cost the sum of the rounds' costs, the turn's whole price; streamed, the first round's
// generation id on every chunk and the summed usage on the last.
func TestOpenRouterGateway(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-wsproxy-alice")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys, o.UpstreamAPIKey = keys, "sk-or-v1-operator" })
	client := map[string]string{
		"Authorization":      "Bearer sk-wsproxy-alice",
		"HTTP-Referer":       "https://essays.example.com",
		"X-Title":            "Essay helper",
		"X-OpenRouter-Title": "Essay helper",
	}
	requireForwarded := func(reqs []upstreamtest.Request) {
		t.Helper()
		for _, r := range reqs {
			require.Equal(t, "/v1/chat/completions", r.Path)
			require.Equal(t, "Bearer sk-or-v1-operator", r.Header.Get("Authorization"))
			for _, k := range []string{"HTTP-Referer", "X-Title", "X-OpenRouter-Title"} {
				require.Equal(t, client[k], r.Header.Get(k), k)
			}
		}
	}
	cost1, cost2 := 0.0000321, 0.0000517

	t.Run("json", func(t *testing.T) {
		e.up.Script(
			reply(openRouterCompletion("gen-1764640000-r1", "", openRouterUsage(150, 40, cost1), addHotels)),
			reply(openRouterCompletion("gen-1764640001-r2", "Noted: small hotels.", openRouterUsage(210, 25, cost2))),
		)
		before := len(e.up.Requests())
		resp := e.post("/threads/openrouter-json/v1/chat/completions", client, gatewayTurn)
		body := testkit.ReadBody(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		reqs := e.up.Requests()[before:]
		require.Len(t, reqs, 2)
		requireForwarded(reqs)

		var answer map[string]any
		require.NoError(t, json.Unmarshal([]byte(body), &answer), body)
		require.Equal(t, "gen-1764640001-r2", answer["id"], "the last round's generation")
		require.Equal(t, "OpenAI", answer["provider"])
		choice := answer["choices"].([]any)[0].(map[string]any)
		require.Equal(t, "stop", choice["native_finish_reason"])
		usage := answer["usage"].(map[string]any)
		require.Equal(t, 360.0, usage["prompt_tokens"])
		require.Equal(t, 65.0, usage["completion_tokens"])
		require.InDelta(t, cost1+cost2, usage["cost"], 1e-12, "the turn's cost: both generations'")
		require.Equal(t, false, usage["is_byok"], "not a number: the last round's")
		require.Equal(t, map[string]any{"upstream_inference_cost": nil}, usage["cost_details"])
		require.Equal(t, map[string]any{"cached_tokens": 0.0, "cache_write_tokens": 0.0, "audio_tokens": 0.0}, usage["prompt_tokens_details"])
	})

	t.Run("stream", func(t *testing.T) {
		e.up.Script(
			openRouterStream("gen-1764640002-s1", openRouterUsage(150, 40, cost1),
				fmt.Sprintf(`{"role":"assistant","content":"","tool_calls":[{"index":0,"id":%q,"type":"function","function":{"name":%q,"arguments":%q}}]}`,
					addHotels.ID, addHotels.Name, addHotels.Arguments)),
			openRouterStream("gen-1764640003-s2", openRouterUsage(210, 25, cost2),
				`{"role":"assistant","content":"Noted: "}`, `{"content":"small hotels."}`),
		)
		before := len(e.up.Requests())
		// OpenRouter sends the usage whether asked or not; through wsproxy, as from OpenAI, the
		// client gets it when it asks (stream_options.include_usage).
		streamed := strings.Replace(gatewayTurn, `{"model"`, `{"stream":true,"stream_options":{"include_usage":true},"model"`, 1)
		resp := e.post("/threads/openrouter-stream/v1/chat/completions", client, streamed)
		body := streamBody(t, resp)
		reqs := e.up.Requests()[before:]
		require.Len(t, reqs, 2)
		requireForwarded(reqs)

		chunks := sseChunks(t, body)
		for _, c := range chunks {
			require.Equal(t, "gen-1764640002-s1", c["id"], "every chunk carries the turn's first id")
		}
		usage := streamedUsage(t, chunks)
		require.Equal(t, 360.0, usage["prompt_tokens"])
		require.InDelta(t, cost1+cost2, usage["cost"], 1e-12)
		require.Contains(t, body, "small hotels.")
	})

	t.Run("stream without include_usage", func(t *testing.T) {
		e.up.Script(openRouterStream("gen-1764640004-s3", openRouterUsage(90, 10, cost1), `{"role":"assistant","content":"Hello."}`))
		resp := e.post("/threads/openrouter-stream/v1/chat/completions", client, strings.Replace(gatewayTurn, `{"model"`, `{"stream":true,"model"`, 1))
		body := streamBody(t, resp)
		for _, c := range sseChunks(t, body) {
			require.NotContains(t, c, "usage", "the client did not ask for it")
		}
		require.Contains(t, body, "Hello.")
	})

	// The thread's totals (the admin REST's usage) count the tokens; cost is the client's to read.
	require.Eventually(t, func() bool { return e.workspace("alice~openrouter-stream").Usage.PromptTokens == 450 }, 5*time.Second, 10*time.Millisecond)
	require.Zero(t, e.workspace("alice~openrouter-stream").Usage.CacheWriteTokens, "chat completions report no cache writes wsproxy reads")
}
