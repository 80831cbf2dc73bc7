package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/tools"
)

// mintMCPToken makes a thread token of thread (stored form) through the admin REST.
func mintMCPToken(t *testing.T, e *env, thread string, ttlSeconds int) (token string, id int64, expires time.Time) {
	t.Helper()
	body := map[string]any{"kind": "mcp"}
	if ttlSeconds > 0 {
		body["ttl_seconds"] = ttlSeconds
	}
	var out struct {
		ID        int64     `json:"id"`
		Kind      string    `json:"kind"`
		Token     string    `json:"token"`
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	e.admin("POST", "/admin/v1/threads/"+thread+"/links", body, 201, &out)
	require.Equal(t, "mcp", out.Kind)
	require.Equal(t, e.srv.URL+"/mcp", out.URL)
	require.NotEmpty(t, out.Token)
	return out.Token, out.ID, out.ExpiresAt
}

type mcpEvent struct {
	Actor      string  `json:"actor"`
	Via        string  `json:"via"`
	Kind       string  `json:"kind"`
	Turn       *int    `json:"turn"`
	Round      *int    `json:"round"`
	ToolCallID *int64  `json:"tool_call_id"`
	Reason     *string `json:"reason"`
}

// TestMCPLockedAsOnTheProxyPath: a locked preference is refused over MCP with the result the
// model gets for the same call in a proxied turn, nothing changes, and the refusal is a
// locked_skip event via MCP.
func TestMCPLockedAsOnTheProxyPath(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, thread := range []string{"locked-mcp", "locked-proxy"} {
		e.admin("POST", "/admin/v1/threads/"+thread+"/preferences", map[string]any{"title": "Academic tone", "locked": true}, 201, nil)
	}
	update := `{"updates":[{"index":1,"title":"Casual tone"}],"action_and_reasoning":"the user asked"}`
	e.up.Script(reply(cmpl("", call{ID: "c1", Name: "update_preferences", Arguments: update})), reply(cmpl("done")))
	resp := e.post("/threads/locked-proxy/v1/chat/completions", nil, `{"model":"m","messages":[{"role":"user","content":"casual please"}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	var envelope tools.Envelope
	msgs := messages(e.upstreamRequest(1))
	require.NoError(t, json.Unmarshal([]byte(msgs[len(msgs)-1]["content"].(string)), &envelope))

	cs := testkit.MCPConnect(t, e.srv.URL, adminToken, testkit.MCPLatest, nil)
	var args map[string]any
	require.NoError(t, json.Unmarshal([]byte(update), &args))
	args["thread"] = "locked-mcp"
	text, isError := testkit.MCPCall(t, cs, "update_preferences", args)
	require.False(t, isError)
	require.Equal(t, envelope.Result, text, "the proxy path's result")
	require.Contains(t, text, "locked, ask the user to unlock first")
	text, _ = testkit.MCPCall(t, cs, "remove_preferences", map[string]any{"thread": "locked-mcp", "indices": []any{1}, "action_and_reasoning": "asked"})
	require.Contains(t, text, "locked, ask the user to unlock first")

	d := e.workspace("locked-mcp")
	require.Equal(t, "Academic tone", d.Preferences[0].Title)
	var events page[mcpEvent]
	e.admin("GET", "/admin/v1/threads/locked-mcp/events", nil, 200, &events)
	require.Len(t, events.Data, 3)
	require.Equal(t, "admin", events.Data[0].Via, "the user's own change")
	for _, ev := range events.Data[1:] {
		require.Equal(t, "locked_skip", ev.Kind)
		require.Equal(t, "mcp", ev.Via)
	}
	e.admin("GET", "/admin/v1/threads/locked-proxy/events", nil, 200, &events)
	require.Equal(t, "proxy", events.Data[1].Via, "a proxied turn's")
	require.NotNil(t, events.Data[1].Turn)
}

// TestMCPSubscriptionAcrossReplicas: a client subscribed to a workspace on one replica is told
// when a proxied turn on another replica (same database) changes it, once, and reads the
// change; its deletion is told too. Subscriptions need MCP 2026-07-28 (the server keeps no session to send an earlier
// version's notifications on), and a resource outside the token's scope cannot be subscribed to.
func TestMCPSubscriptionAcrossReplicas(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	keys, err := ParseClientKeys("alice=key-alice")
	require.NoError(t, err)
	withKeys := func(o *Options) { o.ClientKeys, o.UpstreamAPIKey = keys, "sk-up" }
	a, b := setupWithPool(t, pool, withKeys), setupWithPool(t, pool, withKeys)
	updated := make(chan string, 100)
	cs := testkit.MCPConnect(t, a.srv.URL, "key-alice", testkit.MCPLatest, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) { updated <- req.Params.URI },
	})
	require.NoError(t, cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "workspace://watched"}))
	require.NoError(t, cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "workspace://other"}))
	// Subscribe returns before the server holds the subscription (its listen stream opens in
	// the background): the subscriptions are in place once a change made through a is told.
	awaitSubscribed(t, a, "alice~other", "workspace://other", updated)

	// The admin's thread "watched" is not alice's: its change is not hers to be told.
	b.admin("POST", "/admin/v1/threads/watched/preferences", map[string]any{"title": "Not alice's"}, 201, nil)
	b.up.Script(reply(cmpl("", call{ID: "c1", Name: "add_preferences", Arguments: `{"items":[{"title":"From b"}],"action_and_reasoning":"stated"}`})), reply(cmpl("ok")))
	resp := b.post("/threads/watched/v1/chat/completions", map[string]string{"Authorization": "Bearer key-alice"},
		`{"model":"m","messages":[{"role":"user","content":"I prefer things from b"}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	awaitUpdate(t, updated, "workspace://watched")
	read, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://watched"})
	require.NoError(t, err)
	require.Contains(t, read.Contents[0].Text, "#1 [soft] From b")
	require.NotContains(t, read.Contents[0].Text, "Not alice's")
	// One change is told once: a later change of another resource is told, and nothing of
	// watched came before it (a turn's start that created the thread is no change of its own).
	b.admin("POST", "/admin/v1/threads/alice~other/preferences", map[string]any{"title": "A marker"}, 201, nil)
	for uri := range updated {
		require.NotEqual(t, "workspace://watched", uri, "a second notification for one change")
		if uri == "workspace://other" {
			break
		}
	}

	// Deleting the thread is a change of its workspace too.
	b.admin("DELETE", "/admin/v1/threads/alice~watched", nil, 204, nil)
	awaitUpdate(t, updated, "workspace://watched")

	legacy := testkit.MCPConnect(t, a.srv.URL, "key-alice", testkit.MCPLegacy, nil)
	err = legacy.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "workspace://watched"})
	require.ErrorContains(t, err, "2026-07-28")

	// subscriptions/listen of another's resource (raw: the SDK's client opens it in the background).
	status, body := mcpRaw(t, a.srv.URL, "key-alice", testkit.MCPLatest, `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{`+
		`"notifications":{"resourceSubscriptions":["workspace://bob~t1"]},`+
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`,
		map[string]string{"Mcp-Method": "subscriptions/listen"})
	require.Contains(t, body, "Resource not found", "status %d", status)
}

// awaitUpdate waits for a notification of uri, skipping others'.
func awaitUpdate(t *testing.T, updated <-chan string, uri string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case got := <-updated:
			if got == uri {
				return
			}
		case <-timeout:
			t.Fatalf("no notification of %s", uri)
		}
	}
}

// awaitSubscribed changes thread (stored form) through e's admin REST until a notification of
// uri comes.
func awaitSubscribed(t *testing.T, e *env, thread, uri string, updated <-chan string) {
	t.Helper()
	for i := 0; ; i++ {
		require.Less(t, i, 100, "no notification of a change of %s", thread)
		e.admin("PUT", "/admin/v1/threads/"+thread+"/objective", map[string]any{"text": fmt.Sprintf("Change %d", i)}, 200, nil)
		select {
		case got := <-updated:
			require.Equal(t, uri, got)
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// TestMCPMetrics: MCP tool calls are counted with via="mcp" beside the proxy path's
// via="proxy".
func TestMCPMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cs := testkit.MCPConnect(t, e.srv.URL, adminToken, testkit.MCPLatest, nil)
	testkit.MCPCall(t, cs, "add_preferences", map[string]any{"thread": "metered", "items": []any{map[string]any{"title": "One"}}, "action_and_reasoning": "stated"})
	testkit.MCPCall(t, cs, "add_preferences", map[string]any{"thread": "metered", "items": []any{}})
	text := scrape(t, e)
	require.Contains(t, text, `wsproxy_tool_calls_total{outcome="ok",tool="add_preferences",via="mcp"} 1`)
	require.Contains(t, text, `wsproxy_tool_calls_total{outcome="error",tool="add_preferences",via="mcp"} 1`)
	require.Contains(t, text, `wsproxy_tool_calls_total{outcome="ok",tool="add_preferences",via="proxy"} 0`)
	require.Contains(t, text, `wsproxy_http_requests_total{code="200",route="/mcp"}`)
}

// mcpRaw posts one JSON-RPC message to /mcp speaking protocol (no handshake: the server keeps no
// session), with the extra headers.
func mcpRaw(t *testing.T, base, token, protocol, message string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(message))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", protocol)
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// mcpRawCall posts one tools/call (protocol 2025-11-25).
func mcpRawCall(t *testing.T, base, token, tool, args string, header map[string]string) (int, string) {
	t.Helper()
	return mcpRaw(t, base, token, testkit.MCPLegacy, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"`+tool+`","arguments":`+args+`}}`, header)
}

// TestMCPTrace: an MCP tool call is a span named as GenAI's execute_tool, below the request's
// server span (which continues the client's traceparent), with its Postgres statements below it;
// no argument or result is recorded.
func TestMCPTrace(t *testing.T) {
	t.Parallel()
	e, rec := tracedEnv(t)
	const parent = "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	status, body := mcpRawCall(t, e.srv.URL, adminToken, "add_preferences",
		`{"thread":"traced","items":[{"title":"Secret title"}],"action_and_reasoning":"stated"}`, map[string]string{"traceparent": parent})
	require.Equal(t, 200, status, body)
	require.Contains(t, body, "proposed; the user will review it (this turn read content the user did not write)", "an MCP write is untrusted")

	id, _ := trace.TraceIDFromHex("5bf92f3577b34da6a3ce929d0e0e4736")
	var spans map[string][]sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		spans = spansOf(rec, id)
		return len(spans["/mcp"]) == 1
	}, 5*time.Second, 10*time.Millisecond)
	server := spans["/mcp"][0]
	require.Len(t, spans["execute_tool add_preferences"], 1, "%v", keysOfSpans(spans))
	tool := spans["execute_tool add_preferences"][0]
	require.Equal(t, server.SpanContext().SpanID(), tool.Parent().SpanID())
	a := attrs(tool)
	require.Equal(t, "execute_tool", a["gen_ai.operation.name"].AsString())
	require.Equal(t, "add_preferences", a["gen_ai.tool.name"].AsString())
	require.Equal(t, "traced", a["gen_ai.conversation.id"].AsString())
	require.Equal(t, "mcp", a["wsproxy.via"].AsString())
	require.Equal(t, "ok", a["wsproxy.tool.outcome"].AsString())
	var below int
	for name, list := range spans {
		for _, s := range list {
			if s.Parent().SpanID() == tool.SpanContext().SpanID() {
				below++
			}
			for _, kv := range s.Attributes() {
				require.NotContains(t, kv.Value.Emit(), "Secret title", "%s records content", name)
			}
		}
	}
	require.Positive(t, below, "the call's Postgres statements")
}

func keysOfSpans(m map[string][]sdktrace.ReadOnlySpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestMCPBatchBoundIsTheRounds: the edge bounds a JSON-RPC batch to /mcp by
// MAX_TOOL_CALLS_PER_ROUND (DefaultMaxToolCallsPerRound unless set): a batch at the bound is
// answered, one more message is refused whole, naming the bound (what a refused batch is, and
// runs: TestMCPBatchBounded in proxy/internal/mcp).
func TestMCPBatchBoundIsTheRounds(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	for bound, e := range map[int]*env{
		DefaultMaxToolCallsPerRound: setupWithPool(t, pool),
		3:                           setupWithPool(t, pool, func(o *Options) { o.MaxToolCallsPerRound = 3 }),
	} {
		batch := func(n int) string {
			calls := make([]string, n)
			for i := range calls {
				calls[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"list_preferences","arguments":{"thread":"t"}}}`, i+1)
			}
			return "[" + strings.Join(calls, ",") + "]"
		}
		status, body := mcpRaw(t, e.srv.URL, adminToken, "2025-03-26", batch(bound), nil)
		require.Equal(t, 200, status, body)
		status, body = mcpRaw(t, e.srv.URL, adminToken, "2025-03-26", batch(bound+1), nil)
		require.Equal(t, http.StatusRequestEntityTooLarge, status, body)
		require.Contains(t, body, fmt.Sprintf("at most %d messages", bound))
	}
}

// TestMCPOff: MCP=off removes /mcp, and no MCP token is issued.
func TestMCPOff(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.DisableMCP = true })
	resp := testkit.MCPPost(t, e.srv.URL, "Bearer "+adminToken, "")
	require.Equal(t, 404, resp.StatusCode, testkit.ReadBody(t, resp))
	e.admin("PUT", "/admin/v1/threads/off/objective", map[string]any{"text": "No MCP"}, 200, nil)
	e.admin("POST", "/admin/v1/threads/off/links", map[string]any{"kind": "mcp"}, 409, nil)
	e.admin("POST", "/admin/v1/threads/off/links", map[string]any{"kind": "other"}, 400, nil)
	e.admin("POST", "/admin/v1/threads/off/links", map[string]any{"kind": "panel"}, 201, nil)
	e.admin("POST", "/admin/v1/threads/nowhere/links", map[string]any{"kind": "panel"}, 404, nil)
}
