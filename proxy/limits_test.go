package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/limits"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// clientKey is the key of a test client.
func limitsKey(client string) string { return "sk-" + client + "-0123456789abcdef" }

// setupLimits is a proxy whose clients (keys limitsKey(name)) have the limits of lim, with
// every wire API's upstream at the scripted one, and the counter's clock held inside one minute
// (no request meets a window's end).
func setupLimits(t *testing.T, pool *pgxpool.Pool, lim map[string]ClientLimits, configure ...func(*Options)) *env {
	t.Helper()
	var spec []string
	for name := range lim {
		spec = append(spec, name+"="+limitsKey(name))
	}
	keys, err := ParseClientKeys(strings.Join(spec, ","))
	require.NoError(t, err)
	e := setupWithPool(t, pool, append([]func(*Options){func(o *Options) {
		o.ClientKeys, o.UpstreamAPIKey = keys, "sk-upstream-operator"
		anthropic := o.Upstreams["anthropic"]
		o.Upstreams["anthropic"] = Upstream{URL: anthropic.URL, APIKey: "sk-ant-operator"}
		o.Upstreams["gemini"] = Upstream{URL: anthropic.URL, APIKey: "AIza-operator"}
		o.Limits = func(client string) ClientLimits { return lim[client] }
	}}, configure...)...)
	now := time.Now().UTC().Truncate(time.Minute).Add(30 * time.Second)
	e.proxy.counter.SetClock(func() time.Time { return now })
	return e
}

// limitedCase is one route of a client: its request, the upstream's answer to it, and how its
// wire format says 429.
type limitedCase struct {
	name   string
	send   func(e *env, key string) *http.Response
	answer upstreamtest.Reply
	shape  func(t *testing.T, body string)
}

func openAIShape(code string) func(t *testing.T, body string) {
	return func(t *testing.T, body string) { testkit.RequireErrorBody(t, body, "rate_limit_error", code) }
}

func anthropicShape(t *testing.T, body string) {
	var b struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &b), body)
	require.Equal(t, "error", b.Type, body)
	require.Equal(t, "rate_limit_error", b.Error.Type, body)
}

func geminiShape(t *testing.T, body string) {
	var b struct {
		Error struct {
			Code   int    `json:"code"`
			Status string `json:"status"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &b), body)
	require.Equal(t, 429, b.Error.Code, body)
	require.Equal(t, "RESOURCE_EXHAUSTED", b.Error.Status, body)
}

// limitedCases are every route a client uses: thread turns of each wire API and the
// pass-through, streamed and not, and MCP.
func limitedCases(code string) []limitedCase {
	chat := func(path, extra string) func(e *env, key string) *http.Response {
		return func(e *env, key string) *http.Response {
			return e.post(path, map[string]string{"Authorization": "Bearer " + key}, `{"model":"m","messages":[{"role":"user","content":"hi"}]`+extra+`}`)
		}
	}
	responses := func(path, extra string) func(e *env, key string) *http.Response {
		return func(e *env, key string) *http.Response {
			return e.post(path, map[string]string{"Authorization": "Bearer " + key}, `{"model":"m","input":"hi"`+extra+`}`)
		}
	}
	messages := func(path, extra string) func(e *env, key string) *http.Response {
		return func(e *env, key string) *http.Response {
			return e.post(path, map[string]string{"X-Api-Key": key, "Anthropic-Version": "2023-06-01"},
				`{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":"hi"}]`+extra+`}`)
		}
	}
	gemini := func(path string) func(e *env, key string) *http.Response {
		return func(e *env, key string) *http.Response {
			return e.post(path, map[string]string{"X-Goog-Api-Key": key}, `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`)
		}
	}
	chunks := upstreamtest.Stream(append(upstreamtest.ContentChunks("c", "ok"), upstreamtest.UsageChunk("c", 10, 5))...)
	response := upstreamtest.ResponseSpec{ID: "resp_1", Items: []upstreamtest.Item{upstreamtest.Message("msg_1", "ok")}}
	message := upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_1", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("ok")}})
	answer := upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "g", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiText("ok")}})
	return []limitedCase{
		{"chat turn", chat("/threads/t/v1/chat/completions", ""), reply(upstreamtest.Completion("ok")), openAIShape(code)},
		{"chat turn streamed", chat("/threads/t/v1/chat/completions", `,"stream":true`), chunks, openAIShape(code)},
		{"chat pass-through", chat("/v1/chat/completions", ""), reply(upstreamtest.Completion("ok")), openAIShape(code)},
		{"chat pass-through streamed", chat("/v1/chat/completions", `,"stream":true`), openAIStream(upstreamtest.ContentChunks("c", "ok")...), openAIShape(code)},
		{"responses turn", responses("/threads/t/v1/responses", ""), response.Reply(), openAIShape(code)},
		{"responses turn streamed", responses("/threads/t/v1/responses", `,"stream":true`), response.Stream(), openAIShape(code)},
		{"responses pass-through", responses("/v1/responses", `,"store":false`), response.Reply(), openAIShape(code)},
		{"responses pass-through streamed", responses("/v1/responses", `,"store":false,"stream":true`), response.Stream(), openAIShape(code)},
		{"messages turn", messages("/threads/t/v1/messages", ""), message, anthropicShape},
		{"messages turn streamed", messages("/threads/t/v1/messages", `,"stream":true`), message, anthropicShape},
		{"messages pass-through", messages("/v1/messages", ""), message, anthropicShape},
		{"messages pass-through streamed", messages("/v1/messages", `,"stream":true`), message, anthropicShape},
		{"gemini turn", gemini("/threads/t/v1beta/models/gemini-2.5-flash:generateContent"), answer, geminiShape},
		{"gemini turn streamed", gemini("/threads/t/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"), answer, geminiShape},
		{"gemini pass-through", gemini("/v1beta/models/gemini-2.5-flash:generateContent"), answer, geminiShape},
		{"gemini pass-through streamed", gemini("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"), answer, geminiShape},
		{"embeddings pass-through", func(e *env, key string) *http.Response {
			return e.post("/v1/embeddings", map[string]string{"Authorization": "Bearer " + key}, `{"model":"e","input":"hi"}`)
		}, reply(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"e","usage":{"prompt_tokens":3,"total_tokens":3}}`), openAIShape(code)},
	}
}

// openAIStream answers a streamed chat request as OpenAI does: the chunks as they are, or, when
// the request set stream_options.include_usage, each with "usage":null and then the usage chunk
// (prompt 10, completion 5).
func openAIStream(chunks ...string) upstreamtest.Reply {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		data := append([]string(nil), chunks...)
		if req.StreamOptions.IncludeUsage {
			for i, c := range data {
				data[i] = strings.TrimSuffix(c, "}") + `,"usage":null}`
			}
			data = append(data, upstreamtest.UsageChunk("c", 10, 5))
		}
		upstreamtest.Stream(data...)(w, r)
	}
}

// requireLimited checks a 429 of limit: its wire format, Retry-After within the window, and
// nothing sent upstream.
func requireLimited(t *testing.T, e *env, c limitedCase, resp *http.Response, before int, window time.Duration) {
	t.Helper()
	body := testkit.ReadBody(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s: %s", c.name, body)
	c.shape(t, body)
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err, "%s: Retry-After %q", c.name, resp.Header.Get("Retry-After"))
	require.True(t, secs >= 1 && time.Duration(secs)*time.Second <= window, "%s: Retry-After %d", c.name, secs)
	require.Len(t, e.up.Requests(), before, "%s: nothing went upstream past the limit", c.name)
}

// TestRequestsPerMinuteOnEveryRoute: a client's requests_per_minute holds on every route it
// uses — thread turns and pass-through of chat, Responses, Messages and Gemini, streamed and
// not, embeddings, MCP: past it a 429 in the route's wire format with Retry-After, nothing sent
// upstream and no thread made; another client, and the admin, are not held to it.
func TestRequestsPerMinuteOnEveryRoute(t *testing.T) {
	t.Parallel()
	cases := limitedCases("requests_per_minute_exceeded")
	lim := map[string]ClientLimits{"free": {}, "mcp": {RequestsPerMinute: 2}}
	for i := range cases {
		lim[fmt.Sprintf("c%d", i)] = ClientLimits{RequestsPerMinute: 1}
	}
	e := setupLimits(t, dbtest.NewPool(t, nil), lim)
	for i, c := range cases {
		key := limitsKey(fmt.Sprintf("c%d", i))
		e.up.Script(c.answer)
		resp := c.send(e, key)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", c.name, testkit.ReadBody(t, resp))
		_, _ = io.Copy(io.Discard, resp.Body)
		before := len(e.up.Requests())
		requireLimited(t, e, c, c.send(e, key), before, time.Minute)
	}
	require.Equal(t, 0, e.up.Remaining())
	threads := e.turnsOf("c1~t")
	require.Equal(t, 1, threads, "the refused turn made no turn")

	// MCP: each request of the client's key counts.
	mcpKey := limitsKey("mcp")
	for range 2 {
		status, body := mcpRaw(t, e.srv.URL, mcpKey, testkit.MCPLegacy, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, nil)
		require.Equal(t, http.StatusOK, status, body)
	}
	req, err := http.NewRequest("POST", e.srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+mcpKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	mcpCase := limitedCase{name: "mcp", shape: openAIShape("requests_per_minute_exceeded")}
	requireLimited(t, e, mcpCase, resp, len(e.up.Requests()), time.Minute)
	// The admin's token over MCP is no client's.
	for range 3 {
		status, body := mcpRaw(t, e.srv.URL, adminToken, testkit.MCPLegacy, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, nil)
		require.Equal(t, http.StatusOK, status, body)
	}

	// A client without limits is counted, never refused.
	for range 3 {
		e.up.Script(reply(upstreamtest.Completion("ok")))
		resp := limitedCases("")[0].send(e, limitsKey("free"))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Equal(t, int64(3), e.proxy.ClientUsage("free").RequestsThisMinute)
	require.Contains(t, scrape(t, e), `wsproxy_client_limited_total{limit="requests_per_minute"} `+strconv.Itoa(len(cases)+1))
}

// TestTokensPerDayOnEveryRoute: a client's tokens_per_day counts the tokens the upstream reports
// on every route (thread turns and pass-through of every wire API, streamed and not, a streamed
// chat pass-through that did not ask for its usage among them): once a day's tokens reached it,
// its next request is a 429 in the route's wire format, Retry-After until the day's end, with
// nothing sent upstream; MCP is refused too.
func TestTokensPerDayOnEveryRoute(t *testing.T) {
	t.Parallel()
	cases := limitedCases("tokens_per_day_exceeded")
	lim := map[string]ClientLimits{}
	for i := range cases {
		lim[fmt.Sprintf("c%d", i)] = ClientLimits{TokensPerDay: 3}
	}
	e := setupLimits(t, dbtest.NewPool(t, nil), lim)
	for i, c := range cases {
		client := fmt.Sprintf("c%d", i)
		e.up.Script(c.answer)
		resp := c.send(e, limitsKey(client))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", c.name, testkit.ReadBody(t, resp))
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// The tokens count as the answer ends, after its last byte went out.
		require.Eventually(t, func() bool { return e.proxy.ClientUsage(client).TokensToday >= 3 }, 10*time.Second, 5*time.Millisecond,
			"%s: the answer's tokens counted", c.name)
		before := len(e.up.Requests())
		requireLimited(t, e, c, c.send(e, limitsKey(client)), before, 24*time.Hour)
	}
	status, _ := mcpRaw(t, e.srv.URL, limitsKey("c0"), testkit.MCPLegacy, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, nil)
	require.Equal(t, http.StatusTooManyRequests, status)
	require.Equal(t, int64(15), e.proxy.ClientUsage("c0").TokensToday, "the chat turn's prompt and completion tokens")
	require.Equal(t, int64(21), e.proxy.ClientUsage("c10").TokensToday, "the Messages API's input, cache reads and writes, and output")
	require.Equal(t, int64(17), e.proxy.ClientUsage("c14").TokensToday, "Gemini's prompt, candidates and thoughts")
	require.Equal(t, int64(3), e.proxy.ClientUsage("c16").TokensToday, "the embeddings' total")
}

// TestStreamedChatPassThroughAsksForUsage: a streamed chat pass-through that did not ask for its
// usage is counted — wsproxy asks the upstream for it — and its client reads, byte for byte, the
// stream the upstream sends a request straight to it, without the usage chunk and the
// "usage":null wsproxy's asking added; a client that asked for the usage gets it as it came.
func TestStreamedChatPassThroughAsksForUsage(t *testing.T) {
	t.Parallel()
	e := setupLimits(t, dbtest.NewPool(t, nil), map[string]ClientLimits{"alice": {}})
	answer := openAIStream(upstreamtest.ContentChunks("c", "Hel", "lo")...)
	body := `{"model":"m","stream":true,"stream_options":{},"messages":[{"role":"user","content":"hi"}]}`
	e.up.Script(answer, answer, answer, answer)

	req, err := http.NewRequest("POST", e.up.URL+"/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	straight, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	want := testkit.ReadBody(t, straight)
	require.NotContains(t, want, "usage")

	resp := e.post("/v1/chat/completions", map[string]string{"Authorization": "Bearer " + limitsKey("alice")}, body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, want, testkit.ReadBody(t, resp), "the client's stream is the upstream's without what wsproxy asked")
	sent := e.up.Requests()[1].JSON(t)
	require.Equal(t, map[string]any{"include_usage": true}, sent["stream_options"], "wsproxy asked for the usage")
	require.Eventually(t, func() bool { return e.proxy.ClientUsage("alice").TokensToday == 15 }, 10*time.Second, 5*time.Millisecond)

	// Asked by the client: the usage chunk and the nulls are its.
	asked := strings.Replace(body, `"stream_options":{}`, `"stream_options":{"include_usage":true}`, 1)
	req, err = http.NewRequest("POST", e.up.URL+"/chat/completions", strings.NewReader(asked))
	require.NoError(t, err)
	straight, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	want = testkit.ReadBody(t, straight)
	require.Contains(t, want, `"usage":{"prompt_tokens":10`)
	resp = e.post("/v1/chat/completions", map[string]string{"Authorization": "Bearer " + limitsKey("alice")}, asked)
	require.Equal(t, want, testkit.ReadBody(t, resp))
	require.Eventually(t, func() bool { return e.proxy.ClientUsage("alice").TokensToday == 30 }, 10*time.Second, 5*time.Millisecond)
}

// TestMaxThreads: a turn that would make a client's thread past its max_threads is a 429 with
// nothing sent upstream and no thread made; its existing threads go on.
func TestMaxThreads(t *testing.T) {
	t.Parallel()
	e := setupLimits(t, dbtest.NewPool(t, nil), map[string]ClientLimits{"alice": {MaxThreads: 1}})
	send := limitedCases("")[0].send
	e.up.Script(reply(upstreamtest.Completion("ok")))
	require.Equal(t, http.StatusOK, send(e, limitsKey("alice")).StatusCode)
	before := len(e.up.Requests())
	resp := e.post("/threads/other/v1/chat/completions", map[string]string{"Authorization": "Bearer " + limitsKey("alice")},
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	body := testkit.ReadBody(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	testkit.RequireErrorBody(t, body, "rate_limit_error", "max_threads_exceeded")
	require.Len(t, e.up.Requests(), before)
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM threads WHERE id LIKE 'alice~%'`).Scan(&n))
	require.Equal(t, 1, n)
	e.up.Script(reply(upstreamtest.Completion("ok")))
	require.Equal(t, http.StatusOK, send(e, limitsKey("alice")).StatusCode, "its thread goes on")
	require.Equal(t, 2, e.turnsOf("alice~t"))
}

// TestReplicasShareTheLimit: two servers on one database hold a client to one
// requests_per_minute once they synced (each every LimitsInterval); each one's usage shows the
// other's.
func TestReplicasShareTheLimit(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	lim := map[string]ClientLimits{"alice": {RequestsPerMinute: 2}}
	a, b := setupLimits(t, pool, lim), setupLimits(t, pool, lim)
	models := func(e *env) *http.Response {
		req, err := http.NewRequest("GET", e.srv.URL+"/v1/models", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+limitsKey("alice"))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for _, e := range []*env{a, b} {
		e.up.Fallback = reply(`{"object":"list","data":[]}`)
		require.Equal(t, http.StatusOK, models(e).StatusCode)
	}
	ctx := context.Background()
	require.NoError(t, a.proxy.counter.Sync(ctx))
	require.NoError(t, b.proxy.counter.Sync(ctx))
	require.NoError(t, a.proxy.counter.Sync(ctx))
	for _, e := range []*env{a, b} {
		require.Equal(t, http.StatusTooManyRequests, models(e).StatusCode)
		require.Len(t, e.up.Requests(), 1)
		require.Equal(t, limits.Usage{RequestsThisMinute: 2, RequestsToday: 2}, e.proxy.ClientUsage("alice"))
	}
}

// turnsOf is how many turns a thread has had, 0 when it does not exist.
func (e *env) turnsOf(thread string) int {
	e.t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT coalesce(max(turns), 0) FROM threads WHERE id = $1`, thread).Scan(&n)
	require.NoError(e.t, err)
	return n
}

// TestUsageBodyReadsEveryAPI: what a pass-through's answer reports is read whatever its API and
// form, and a chat stream's rewrite takes out only what wsproxy's asking added, wherever the
// member stands and however it is spaced.
func TestUsageBodyReadsEveryAPI(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, raw          string
		prompt, completion int64
	}{
		{"chat", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":2}}`, 10, 5},
		{"responses", `{"input_tokens":10,"input_tokens_details":{"cached_tokens":2},"output_tokens":5,"total_tokens":15}`, 10, 5},
		{"messages", `{"input_tokens":10,"cache_creation_input_tokens":2,"cache_read_input_tokens":4,"output_tokens":5}`, 16, 5},
		{"gemini", `{ "promptTokenCount": 10, "candidatesTokenCount": 5, "thoughtsTokenCount": 2, "totalTokenCount": 17 }`, 10, 7},
		{"embeddings", `{"prompt_tokens":0,"total_tokens":3}`, 3, 0},
		{"not counts", `{"prompt_tokens":"10","completion_tokens":-1}`, 0, 0},
	} {
		p, c := usageTokens([]byte(tc.raw))
		require.Equal(t, []int64{tc.prompt, tc.completion}, []int64{p, c}, tc.name)
	}

	strip := func(in string) (string, int64) {
		b := &usageBody{}
		out := b.stripEvent([]byte(in))
		return string(out), b.prompt + b.completion
	}
	for in, want := range map[string]string{
		"data: {\"id\":\"c\",\"choices\":[],\"usage\":null}\n\n":   "data: {\"id\":\"c\",\"choices\":[]}\n\n",
		"data: {\"usage\":null,\"id\":\"c\"}\n\n":                  "data: {\"id\":\"c\"}\n\n",
		"data: {\"id\":\"c\" , \"usage\" : null }\n\n":             "data: {\"id\":\"c\" }\n\n",
		"data: {\"id\":\"c\",\"usage\":{\"prompt_tokens\":1}}\n\n": "data: {\"id\":\"c\",\"usage\":{\"prompt_tokens\":1}}\n\n",
		"data: [DONE]\n\n": "data: [DONE]\n\n",
		": keepalive\n\n":  ": keepalive\n\n",
		"data: {\"id\":\"c\",\"choices\":[ ],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n": "",
	} {
		got, _ := strip(in)
		require.Equal(t, want, got, in)
	}
	_, n := strip("data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n")
	require.Equal(t, int64(7), n, "the dropped usage chunk is counted")

	// A JSON answer's usage is its last usage member, also past a string that names one.
	b := &usageBody{}
	b.keepTail([]byte(`{"choices":[{"message":{"content":"say \"usage\": {\"prompt_tokens\": 99}"}}],"usage":{"prompt_tokens":10,"completion_tokens":5}}`))
	b.jsonUsage()
	require.Equal(t, []int64{10, 5}, []int64{b.prompt, b.completion})
	// Gemini's streamed array: its last element's usageMetadata, the counts so far.
	b = &usageBody{}
	b.keepTail([]byte(`[{"usageMetadata":{"promptTokenCount":3}},` + "\n" + `{"candidates":[],"usageMetadata" : {"promptTokenCount":10,"candidatesTokenCount":5}}]`))
	b.jsonUsage()
	require.Equal(t, []int64{10, 5}, []int64{b.prompt, b.completion})
}
