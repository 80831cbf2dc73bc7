package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
)

// The protocol versions the Go SDK's client speaks to /mcp: the SDK's latest (sessionless,
// server/discover, subscriptions/listen) and the last one with an initialize handshake, which
// the TypeScript SDK and Claude Code speak.
const (
	mcpLatest = "2026-07-28"
	mcpLegacy = "2025-11-25"
)

// bearer sends every request with Authorization: Bearer token.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// mcpDial connects the Go SDK's client to base's /mcp with token, speaking protocol.
func mcpDial(base, token, protocol string, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "wsproxy-test", Version: "1"}, opts)
	transport := &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: bearer(token)},
		MaxRetries: -1, DisableStandaloneSSE: true}
	return client.Connect(context.Background(), transport, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
}

func mcpConnect(t testing.TB, base, token, protocol string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs, err := mcpDial(base, token, protocol, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// mcpCall calls a tool and returns its result's text and whether it is a tool error.
func mcpCall(t testing.TB, cs *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err, name)
	require.Len(t, res.Content, 1, name)
	text, ok := res.Content[0].(*mcp.TextContent)
	require.True(t, ok, "%s: %T", name, res.Content[0])
	return text.Text, res.IsError
}

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

// seedTools are the five tools as the proxy injects them: name, description, parameters.
func seedTools(t *testing.T) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, def := range tools.Definitions {
		var d struct {
			Function struct {
				Name        string         `json:"name"`
				Description string         `json:"description"`
				Parameters  map[string]any `json:"parameters"`
			} `json:"function"`
		}
		require.NoError(t, json.Unmarshal(def, &d))
		out[d.Function.Name] = map[string]any{"description": d.Function.Description, "parameters": d.Function.Parameters}
	}
	return out
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

// TestMCPTools: the Go SDK's client, with the admin token, over both protocol versions: the five
// tools with the seeds' descriptions and schemas plus a required thread; each tool called, its
// result the envelope's text; the changes are the agent's, one event each with via "mcp" and the
// call's action_and_reasoning as its reason, outside any turn; the workspace is a resource.
func TestMCPTools(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seeds := seedTools(t)
	for _, protocol := range []string{mcpLatest, mcpLegacy} {
		t.Run(protocol, func(t *testing.T) {
			thread := "tools-" + protocol
			cs := mcpConnect(t, e.srv.URL, adminToken, protocol, nil)
			list, err := cs.ListTools(context.Background(), nil)
			require.NoError(t, err)
			var names []string
			for _, tl := range list.Tools {
				names = append(names, tl.Name)
				seed := seeds[tl.Name]
				require.NotNil(t, seed, tl.Name)
				require.Equal(t, seed["description"], tl.Description)
				var schema map[string]any
				b, _ := json.Marshal(tl.InputSchema)
				require.NoError(t, json.Unmarshal(b, &schema))
				props := schema["properties"].(map[string]any)
				require.Contains(t, props, "thread", tl.Name)
				require.Contains(t, schema["required"], "thread", tl.Name)
				delete(props, "thread")
				delete(props, "as_of") // MCP's own (TestMCPIndicesAsOf)
				schema["required"] = without(schema["required"].([]any), "thread")
				require.Equal(t, seed["parameters"], schema, tl.Name)
			}
			sort.Strings(names)
			want := append([]string(nil), tools.Names...)
			sort.Strings(want)
			require.Equal(t, want, names)

			steps := []struct {
				tool string
				args map[string]any
				want string
			}{
				{"set_objective", map[string]any{"text": "Plan a trip to Lisbon", "action_and_reasoning": "the user named the goal"}, "objective set: Plan a trip to Lisbon"},
				{"add_preferences", map[string]any{"items": []any{map[string]any{"title": "By train", "kind": "hard"}, map[string]any{"title": "Small hotels"}},
					"action_and_reasoning": "the user stated two"}, "recorded 2 preferences"},
				{"list_preferences", map[string]any{"action_and_reasoning": "to see them"}, "#1 [hard] By train\n#2 [soft] Small hotels\nas of change 3"},
				{"update_preferences", map[string]any{"updates": []any{map[string]any{"index": 2, "subtitle": "Family-run"}}, "action_and_reasoning": "the user said more"},
					`updated #2 "Small hotels"`},
				{"remove_preferences", map[string]any{"indices": []any{1}, "action_and_reasoning": "the user dropped it"}, `removed #1 "By train"`},
			}
			for _, s := range steps {
				s.args["thread"] = thread
				text, isError := mcpCall(t, cs, s.tool, s.args)
				require.False(t, isError, "%s: %s", s.tool, text)
				require.Equal(t, s.want, text, s.tool)
			}
			text, isError := mcpCall(t, cs, "add_preferences", map[string]any{"thread": thread, "items": []any{}})
			require.True(t, isError)
			require.Equal(t, "items: must hold at least one preference", text, "the envelope's error")
			text, isError = mcpCall(t, cs, "list_preferences", map[string]any{})
			require.True(t, isError)
			require.Contains(t, text, "thread")

			d := e.workspace(thread)
			require.Equal(t, "Plan a trip to Lisbon", d.Objective.Text)
			require.Equal(t, tools.ByAgent, d.Objective.UpdatedBy)
			require.Len(t, d.Preferences, 1)
			require.Equal(t, "Family-run", d.Preferences[0].Subtitle)

			var events page[mcpEvent]
			e.admin("GET", "/admin/v1/threads/"+thread+"/events", nil, 200, &events)
			var kinds []string
			for _, ev := range events.Data {
				kinds = append(kinds, ev.Kind)
				require.Equal(t, "agent", ev.Actor)
				require.Equal(t, "mcp", ev.Via)
				require.Nil(t, ev.Turn, "outside any turn")
				require.Nil(t, ev.Round)
				require.NotNil(t, ev.ToolCallID)
				require.NotNil(t, ev.Reason)
			}
			require.Equal(t, []string{"objective_set", "preference_added", "preference_added", "preference_updated", "preference_removed"}, kinds)
			require.Equal(t, "the user stated two", *events.Data[1].Reason)

			var calls page[map[string]any]
			e.admin("GET", "/admin/v1/threads/"+thread+"/tool-calls", nil, 200, &calls)
			require.Len(t, calls.Data, 6, "five calls and the refused one")
			require.Nil(t, calls.Data[0]["turn"])
			require.Nil(t, calls.Data[0]["round"])

			uri := "workspace://" + thread
			res, err := cs.ListResources(context.Background(), nil)
			require.NoError(t, err)
			var uris []string
			for _, r := range res.Resources {
				uris = append(uris, r.URI)
				if r.URI == uri {
					require.Equal(t, "text/plain", r.MIMEType)
				}
			}
			require.Contains(t, uris, uri)
			read, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
			require.NoError(t, err)
			require.Len(t, read.Contents, 1)
			require.Equal(t, tools.AsOfChange(d.Block, d.LastEventID), read.Contents[0].Text)
			require.Equal(t, "text/plain", read.Contents[0].MIMEType)
		})
	}
}

func without(list []any, v any) []any {
	var out []any
	for _, x := range list {
		if x != v {
			out = append(out, x)
		}
	}
	return out
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
	require.Equal(t, 200, resp.StatusCode, readBody(t, resp))
	var envelope tools.Envelope
	msgs := messages(e.upstreamRequest(1))
	require.NoError(t, json.Unmarshal([]byte(msgs[len(msgs)-1]["content"].(string)), &envelope))

	cs := mcpConnect(t, e.srv.URL, adminToken, mcpLatest, nil)
	var args map[string]any
	require.NoError(t, json.Unmarshal([]byte(update), &args))
	args["thread"] = "locked-mcp"
	text, isError := mcpCall(t, cs, "update_preferences", args)
	require.False(t, isError)
	require.Equal(t, envelope.Result, text, "the proxy path's result")
	require.Contains(t, text, "locked, ask the user to unlock first")
	text, _ = mcpCall(t, cs, "remove_preferences", map[string]any{"thread": "locked-mcp", "indices": []any{1}, "action_and_reasoning": "asked"})
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

// mcpPost sends a raw initialize request to /mcp with the Authorization header auth ("" none),
// from the address from (X-Forwarded-For, believed from a trusted proxy; "" for none).
func mcpPost(t *testing.T, base, auth, from string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if from != "" {
		req.Header.Set("X-Forwarded-For", from)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestMCPScopes: who sees what (docs/spec.md §15). The admin token sees every thread; a client key
// its client's threads, named as its turns name them; a thread token its one thread, with no
// thread argument. Another's thread is "unknown thread" and no resource. A wrong, expired or
// revoked token — or none — is a 401 with WWW-Authenticate: Bearer before any MCP message.
func TestMCPScopes(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=key-alice,bob=key-bob")
	require.NoError(t, err)
	// Every refusal below comes from an address of its own (through a trusted proxy): failures
	// from one address are throttled.
	trusted, err := ParseTrustedProxies("127.0.0.1")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys, o.UpstreamAPIKey, o.TrustedProxies = keys, "sk-up", trusted })
	e.admin("POST", "/admin/v1/threads/bob~t1/preferences", map[string]any{"title": "Bob's secret"}, 201, nil)
	e.admin("PUT", "/admin/v1/threads/lonely/objective", map[string]any{"text": "No client's"}, 200, nil)

	t.Run("ClientKey", func(t *testing.T) {
		alice := mcpConnect(t, e.srv.URL, "key-alice", mcpLatest, nil)
		text, isError := mcpCall(t, alice, "add_preferences", map[string]any{"thread": "t1", "items": []any{map[string]any{"title": "Alice's"}}, "action_and_reasoning": "stated"})
		require.False(t, isError, text)
		require.Equal(t, "Alice's", e.workspace("alice~t1").Preferences[0].Title, "in alice's namespace")
		require.Equal(t, "Bob's secret", e.workspace("bob~t1").Preferences[0].Title)
		for _, thread := range []string{"bob~t1", "lonely"} {
			if thread == "lonely" {
				// "lonely" names alice~lonely for alice: a thread of hers, new; it is not the
				// admin's "lonely".
				text, isError = mcpCall(t, alice, "list_preferences", map[string]any{"thread": thread})
				require.False(t, isError)
				require.Equal(t, "no preferences recorded yet", untilAsOf(t, text))
				continue
			}
			text, isError = mcpCall(t, alice, "list_preferences", map[string]any{"thread": thread})
			require.True(t, isError)
			require.Equal(t, `unknown thread "bob~t1"`, text)
		}
		res, err := alice.ListResources(context.Background(), nil)
		require.NoError(t, err)
		var uris []string
		for _, r := range res.Resources {
			uris = append(uris, r.URI)
		}
		sort.Strings(uris)
		require.Equal(t, []string{"workspace://lonely", "workspace://t1"}, uris)
		_, err = alice.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://bob~t1"})
		require.Error(t, err)
		require.Contains(t, err.Error(), "not found")
		read, err := alice.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://t1"})
		require.NoError(t, err)
		require.Contains(t, read.Contents[0].Text, "Alice's")
	})

	t.Run("Admin", func(t *testing.T) {
		admin := mcpConnect(t, e.srv.URL, adminToken, mcpLatest, nil)
		text, isError := mcpCall(t, admin, "list_preferences", map[string]any{"thread": "bob~t1"})
		require.False(t, isError)
		require.Equal(t, "#1 [soft] Bob's secret", untilAsOf(t, text))
		read, err := admin.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://lonely"})
		require.NoError(t, err)
		require.Contains(t, read.Contents[0].Text, "Objective: No client's")
		// A thread id's ':' and '@' are escaped in its URI, as the template's expansion escapes them.
		text, isError = mcpCall(t, admin, "set_objective", map[string]any{"thread": "team:lisbon@2026", "text": "Meet in Lisbon"})
		require.False(t, isError, text)
		res, err := admin.ListResources(context.Background(), nil)
		require.NoError(t, err)
		require.Equal(t, "workspace://team%3Alisbon%402026", res.Resources[0].URI)
		require.Equal(t, "team:lisbon@2026", res.Resources[0].Name)
		read, err = admin.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: res.Resources[0].URI})
		require.NoError(t, err)
		require.Contains(t, read.Contents[0].Text, "Objective: Meet in Lisbon")
	})

	t.Run("ThreadToken", func(t *testing.T) {
		token, _, _ := mintMCPToken(t, e, "bob~t1", 0)
		bob := mcpConnect(t, e.srv.URL, token, mcpLegacy, nil)
		list, err := bob.ListTools(context.Background(), nil)
		require.NoError(t, err)
		for _, tl := range list.Tools {
			b, _ := json.Marshal(tl.InputSchema)
			require.NotContains(t, string(b), `"thread"`, "bound to its thread: %s", tl.Name)
		}
		text, isError := mcpCall(t, bob, "add_preferences", map[string]any{"items": []any{map[string]any{"title": "Via a token"}}, "action_and_reasoning": "stated"})
		require.False(t, isError, text)
		require.Len(t, e.workspace("bob~t1").Preferences, 2)
		text, isError = mcpCall(t, bob, "list_preferences", map[string]any{"thread": "alice~t1"})
		require.True(t, isError)
		require.Equal(t, `unknown thread "alice~t1"`, text)
		res, err := bob.ListResources(context.Background(), nil)
		require.NoError(t, err)
		require.Len(t, res.Resources, 1)
		require.Equal(t, "workspace://bob~t1", res.Resources[0].URI)
		_, err = bob.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://alice~t1"})
		require.Error(t, err)
	})

	var addresses atomic.Int64
	refused := func(t *testing.T, auth string) {
		t.Helper()
		resp := mcpPost(t, e.srv.URL, auth, fmt.Sprintf("192.0.2.%d", addresses.Add(1)))
		body := readBody(t, resp)
		require.Equal(t, 401, resp.StatusCode, body)
		require.True(t, strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer"), resp.Header.Get("WWW-Authenticate"))
		require.NotContains(t, body, "jsonrpc", "no MCP message was read")
	}
	t.Run("Refused", func(t *testing.T) {
		resp := mcpPost(t, e.srv.URL, "Bearer "+adminToken, "")
		require.Equal(t, 200, resp.StatusCode, readBody(t, resp))
		refused(t, "")
		refused(t, "Bearer wrong")
		refused(t, "Basic "+adminToken)
		_, err := mcpDial(e.srv.URL, "wrong", mcpLatest, nil)
		require.Error(t, err)

		token, id, _ := mintMCPToken(t, e, "bob~t1", 0)
		resp = mcpPost(t, e.srv.URL, "Bearer "+token, "")
		require.Equal(t, 200, resp.StatusCode, readBody(t, resp))
		var links page[map[string]any]
		e.admin("GET", "/admin/v1/threads/bob~t1/links", nil, 200, &links)
		require.NotEmpty(t, links.Data)
		require.NotContains(t, fmt.Sprint(links.Data), token, "a listing never shows a token")
		e.admin("DELETE", fmt.Sprintf("/admin/v1/threads/bob~t1/links/%d", id), nil, 204, nil)
		refused(t, "Bearer "+token)
		e.admin("DELETE", fmt.Sprintf("/admin/v1/threads/bob~t1/links/%d", id), nil, 404, nil)

		short, _, expires := mintMCPToken(t, e, "bob~t1", 1)
		for !time.Now().After(expires) {
			time.Sleep(100 * time.Millisecond)
		}
		refused(t, "Bearer "+short)

		// A deleted thread's tokens go with it.
		e.admin("PUT", "/admin/v1/threads/doomed/objective", map[string]any{"text": "Soon gone"}, 200, nil)
		doomed, _, _ := mintMCPToken(t, e, "doomed", 0)
		e.admin("DELETE", "/admin/v1/threads/doomed", nil, 204, nil)
		e.admin("PUT", "/admin/v1/threads/doomed/objective", map[string]any{"text": "Another life"}, 200, nil)
		refused(t, "Bearer "+doomed)
		// A client key is not a thread token's signature; a panel link's token is not a thread token.
		var link struct {
			URL string `json:"url"`
		}
		e.admin("POST", "/admin/v1/threads/bob~t1/links", map[string]any{}, 201, &link)
		u, err := url.Parse(link.URL)
		require.NoError(t, err)
		refused(t, "Bearer "+u.Query().Get("token"))
	})
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
	cs := mcpConnect(t, a.srv.URL, "key-alice", mcpLatest, &mcp.ClientOptions{
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
	require.Equal(t, 200, resp.StatusCode, readBody(t, resp))
	awaitUpdate(t, updated, "workspace://watched")
	read, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://watched"})
	require.NoError(t, err)
	require.Contains(t, read.Contents[0].Text, "#1 [soft] From b")
	require.NotContains(t, read.Contents[0].Text, "Not alice's")
	deadline := time.After(500 * time.Millisecond)
	for done := false; !done; {
		select {
		case uri := <-updated:
			require.NotEqual(t, "workspace://watched", uri, "a second notification for one change")
		case <-deadline:
			done = true
		}
	}

	// Deleting the thread is a change of its workspace too.
	b.admin("DELETE", "/admin/v1/threads/alice~watched", nil, 204, nil)
	awaitUpdate(t, updated, "workspace://watched")

	legacy := mcpConnect(t, a.srv.URL, "key-alice", mcpLegacy, nil)
	err = legacy.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "workspace://watched"})
	require.ErrorContains(t, err, "2026-07-28")

	// subscriptions/listen of another's resource (raw: the SDK's client opens it in the background).
	status, body := mcpRaw(t, a.srv.URL, "key-alice", mcpLatest, `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{`+
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

// TestMCPStatelessRoundRobin: two replicas behind a round-robin balancer answer one client's
// session, request by request, over both protocol versions.
func TestMCPStatelessRoundRobin(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	replicas := []*env{setupWithPool(t, pool), setupWithPool(t, pool)}
	var next atomic.Int64
	var served [2]atomic.Int64
	balancer := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			i := next.Add(1) % 2
			served[i].Add(1)
			u, _ := url.Parse(replicas[i].srv.URL)
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: -1,
	})
	t.Cleanup(balancer.Close)
	for _, protocol := range []string{mcpLatest, mcpLegacy} {
		t.Run(protocol, func(t *testing.T) {
			thread := "rr-" + protocol
			cs := mcpConnect(t, balancer.URL, adminToken, protocol, nil)
			for i := range 6 {
				text, isError := mcpCall(t, cs, "add_preferences", map[string]any{"thread": thread,
					"items": []any{map[string]any{"title": fmt.Sprintf("Item %d", i)}}, "action_and_reasoning": "stated"})
				require.False(t, isError, text)
				require.Equal(t, "recorded 1 preference", text)
			}
			text, _ := mcpCall(t, cs, "list_preferences", map[string]any{"thread": thread})
			require.Equal(t, 6, strings.Count(untilAsOf(t, text), "\n")+1, text)
			_, err := cs.ListTools(context.Background(), nil)
			require.NoError(t, err)
		})
	}
	require.Positive(t, served[0].Load())
	require.Positive(t, served[1].Load())
}

// TestMCPMetrics: MCP tool calls are counted with via="mcp" beside the proxy path's
// via="proxy".
func TestMCPMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cs := mcpConnect(t, e.srv.URL, adminToken, mcpLatest, nil)
	mcpCall(t, cs, "add_preferences", map[string]any{"thread": "metered", "items": []any{map[string]any{"title": "One"}}, "action_and_reasoning": "stated"})
	mcpCall(t, cs, "add_preferences", map[string]any{"thread": "metered", "items": []any{}})
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
	return mcpRaw(t, base, token, mcpLegacy, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"`+tool+`","arguments":`+args+`}}`, header)
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
	require.Contains(t, body, "recorded 1 preference")

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

// TestMCPOff: MCP=off removes /mcp, and no MCP token is issued.
func TestMCPOff(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.DisableMCP = true })
	resp := mcpPost(t, e.srv.URL, "Bearer "+adminToken, "")
	require.Equal(t, 404, resp.StatusCode, readBody(t, resp))
	e.admin("PUT", "/admin/v1/threads/off/objective", map[string]any{"text": "No MCP"}, 200, nil)
	e.admin("POST", "/admin/v1/threads/off/links", map[string]any{"kind": "mcp"}, 409, nil)
	e.admin("POST", "/admin/v1/threads/off/links", map[string]any{"kind": "other"}, 400, nil)
	e.admin("POST", "/admin/v1/threads/off/links", map[string]any{"kind": "panel"}, 201, nil)
	e.admin("POST", "/admin/v1/threads/nowhere/links", map[string]any{"kind": "panel"}, 404, nil)
}

// TestMCPResourcesPaged: resources/list pages through every thread of the scope (a hundred a
// page), most recently updated first, each once; a client's pages hold its threads alone.
func TestMCPResourcesPaged(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=key-alice")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys, o.UpstreamAPIKey = keys, "sk-up" })
	ctx := context.Background()
	for i := range 230 {
		id := tools.ThreadID{Name: fmt.Sprintf("page-%03d", i)}
		if i%2 == 1 {
			id.Client = "alice"
		}
		_, err := e.store.Workspace(id).SetObjective(ctx, fmt.Sprintf("Goal %d", i))
		require.NoError(t, err)
	}
	list := func(token string) []string {
		cs := mcpConnect(t, e.srv.URL, token, mcpLatest, nil)
		var uris []string
		pages := 0
		cursor := ""
		for {
			res, err := cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
			require.NoError(t, err)
			pages++
			for _, r := range res.Resources {
				uris = append(uris, r.URI)
			}
			if res.NextCursor == "" {
				break
			}
			cursor = res.NextCursor
		}
		require.Equal(t, (len(uris)+99)/100, pages)
		return uris
	}
	all := list(adminToken)
	require.Len(t, all, 230)
	require.Equal(t, "workspace://alice~page-229", all[0], "the most recently updated first")
	seen := map[string]bool{}
	for _, u := range all {
		require.False(t, seen[u], "listed twice: %s", u)
		seen[u] = true
	}
	mine := list("key-alice")
	require.Len(t, mine, 115)
	require.Equal(t, "workspace://page-229", mine[0])
	for _, u := range mine {
		require.NotContains(t, u, "~")
	}

	cs := mcpConnect(t, e.srv.URL, adminToken, mcpLatest, nil)
	_, err = cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: "not-a-cursor,x"})
	require.ErrorContains(t, err, "cursor")
}

// TestMCPListenEndsWithItsToken: a thread token's subscriptions/listen stream ends once its
// token no longer holds (revoked here): at the thread's next change (or heartbeat) it closes,
// rather than announcing the thread's changes to a holder who may no longer see them.
func TestMCPListenEndsWithItsToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.admin("PUT", "/admin/v1/threads/tok/objective", map[string]any{"text": "Before"}, 200, nil)
	token, id, _ := mintMCPToken(t, e, "tok", 0)
	req, err := http.NewRequest("POST", e.srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{`+
		`"notifications":{"resourceSubscriptions":["workspace://tok"]},`+
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`))
	require.NoError(t, err)
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Mcp-Protocol-Version": mcpLatest, "Mcp-Method": "subscriptions/listen", "Authorization": "Bearer " + token} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		rd := bufio.NewReader(resp.Body)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			lines <- line
		}
	}()
	// The stream holds the subscription once a change is announced on it.
	announced := func(text string) bool {
		e.admin("PUT", "/admin/v1/threads/tok/objective", map[string]any{"text": text}, 200, nil)
		timeout := time.After(5 * time.Second)
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					return false
				}
				if strings.Contains(line, "notifications/resources/updated") {
					return true
				}
			case <-timeout:
				return false
			}
		}
	}
	require.Eventually(t, func() bool { return announced("Changed") }, 30*time.Second, 10*time.Millisecond)

	e.admin("DELETE", fmt.Sprintf("/admin/v1/threads/tok/links/%d", id), nil, 204, nil)
	e.admin("PUT", "/admin/v1/threads/tok/objective", map[string]any{"text": "After the revocation"}, 200, nil)
	timeout := time.After(20 * time.Second)
	for {
		select {
		case _, ok := <-lines:
			if !ok {
				return // the stream ended
			}
		case <-timeout:
			t.Fatal("the stream outlived its token")
		}
	}
}

// mcpBatch is a POST of a JSON-RPC batch of n set_objective calls (texts prefix 1…n, each a
// change) to /mcp with token, in MCP 2025-03-26 (the last version with batches).
func mcpBatch(t *testing.T, e *env, token, prefix string, n int) *http.Request {
	t.Helper()
	calls := make([]json.RawMessage, n)
	for i := range calls {
		calls[i] = json.RawMessage(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"set_objective",`+
			`"arguments":{"text":"%s %d","action_and_reasoning":"One of a batch."}}}`, i+1, prefix, i+1))
	}
	b, err := json.Marshal(calls)
	require.NoError(t, err)
	req, err := http.NewRequest("POST", e.srv.URL+"/mcp", bytes.NewReader(b))
	require.NoError(t, err)
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Mcp-Protocol-Version": "2025-03-26", "Authorization": "Bearer " + token} {
		req.Header.Set(k, v)
	}
	return req
}

// send sends req and returns its status and body.
func send(req *http.Request) (int, []byte, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// TestMCPBatchBounded: a JSON-RPC batch (MCP 2025-03-26) carries at most as many messages as a
// round runs workspace calls (MAX_TOOL_CALLS_PER_ROUND): one more is refused whole — 413 with a
// JSON-RPC error, no call run — and one at the bound runs every call, one at a time: while the
// thread's row is held, at most one of its calls waits on Postgres.
func TestMCPBatchBounded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.admin("PUT", "/admin/v1/threads/batch/objective", map[string]any{"text": "Batches"}, 200, nil)
	token, _, _ := mintMCPToken(t, e, "batch", 0)
	bound := DefaultMaxToolCallsPerRound
	ws := e.store.Workspace(tools.ThreadID{Name: "batch"})
	before, err := ws.LastEventID(context.Background())
	require.NoError(t, err)

	status, body, err := send(mcpBatch(t, e, token, "Over", bound+1))
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestEntityTooLarge, status, "%s", body)
	var refused struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(body, &refused), "%s", body)
	require.Equal(t, "2.0", refused.JSONRPC)
	require.Equal(t, "null", string(refused.ID), "a response to a batch refused whole has id null")
	require.Equal(t, -32600, refused.Error.Code)
	require.Contains(t, refused.Error.Message, strconv.Itoa(bound))
	last, err := ws.LastEventID(context.Background())
	require.NoError(t, err)
	require.Equal(t, before, last, "nothing of a refused batch runs")

	// At the bound, with the thread's row held: its calls wait one at a time.
	side, err := pgxpool.NewWithConfig(context.Background(), e.pool.Config().Copy()) // not the proxy's pool
	require.NoError(t, err)
	defer side.Close()
	tx, err := side.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	var holder int32
	require.NoError(t, tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&holder))
	_, err = tx.Exec(context.Background(), `SELECT 1 FROM threads WHERE id = 'batch' FOR UPDATE`)
	require.NoError(t, err)
	type answer struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan answer, 1)
	req := mcpBatch(t, e, token, "At", bound)
	go func() {
		status, body, err := send(req)
		done <- answer{status, body, err}
	}()
	// The sessions the holder blocks, directly or behind another waiter.
	waiting := func() int {
		var n int
		require.NoError(t, side.QueryRow(context.Background(), `WITH RECURSIVE w(pid) AS (SELECT $1::int
			UNION SELECT a.pid FROM pg_stat_activity a, w WHERE w.pid = ANY(pg_blocking_pids(a.pid)))
			SELECT count(*) - 1 FROM w`, holder).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return waiting() > 0 }, time.Minute, 20*time.Millisecond)
	require.Never(t, func() bool { return waiting() > 1 }, time.Second, 20*time.Millisecond, "one request's calls wait one at a time")
	require.NoError(t, tx.Rollback(context.Background()))

	a := <-done
	require.NoError(t, a.err)
	require.Equal(t, 200, a.status, "%s", a.body)
	var results []struct {
		Result struct{ IsError bool } `json:"result"`
		Error  *json.RawMessage       `json:"error"`
	}
	require.NoError(t, json.Unmarshal(a.body, &results), "%s", a.body)
	require.Len(t, results, bound)
	for _, r := range results {
		require.Nil(t, r.Error)
		require.False(t, r.Result.IsError)
	}
	last, err = ws.LastEventID(context.Background())
	require.NoError(t, err)
	require.Equal(t, before+int64(bound), last, "every call of a batch at the bound runs")
}

// asOf is the change number a list_preferences result or the workspace resource ends with.
func asOf(t *testing.T, text string) int64 {
	t.Helper()
	_, n, ok := strings.Cut(text, "\nas of change ")
	require.True(t, ok, "no version at the end of %q", text)
	v, err := strconv.ParseInt(n, 10, 64)
	require.NoError(t, err, text)
	return v
}

// untilAsOf is a list_preferences result or the workspace resource without its version.
func untilAsOf(t *testing.T, text string) string {
	t.Helper()
	asOf(t, text)
	list, _, _ := strings.Cut(text, "\nas of change ")
	return list
}

// TestMCPIndicesAsOf: over MCP, list_preferences and the workspace resource end with the list's
// version (as of change N, N the thread's latest event); update_preferences and
// remove_preferences with as_of N name the list as it stood after event N: a target the user
// removed or rewrote since is reported, never replaced by another. Without as_of, the list as it
// stands. as_of is in MCP's schemas only: the turn's tool definitions have none.
func TestMCPIndicesAsOf(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const thread = "asof"
	cs := mcpConnect(t, e.srv.URL, adminToken, mcpLatest, nil)
	text, isError := mcpCall(t, cs, "add_preferences", map[string]any{"thread": thread,
		"items": []any{map[string]any{"title": "A"}, map[string]any{"title": "B"}, map[string]any{"title": "C"}, map[string]any{"title": "D"}}})
	require.False(t, isError, text)

	listed, isError := mcpCall(t, cs, "list_preferences", map[string]any{"thread": thread})
	require.False(t, isError, listed)
	n := asOf(t, listed)
	var events page[struct {
		ID int64 `json:"id"`
	}]
	e.admin("GET", "/admin/v1/threads/"+thread+"/events?order=desc&limit=1", nil, 200, &events)
	require.Len(t, events.Data, 1)
	require.Equal(t, events.Data[0].ID, n, "N is the thread's latest event")
	require.Equal(t, "#1 [soft] A\n#2 [soft] B\n#3 [soft] C\n#4 [soft] D\nas of change "+strconv.FormatInt(n, 10), listed)
	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://" + thread})
	require.NoError(t, err)
	require.Equal(t, e.workspace(thread).Block+"\nas of change "+strconv.FormatInt(n, 10), res.Contents[0].Text)

	// Meanwhile the user removes A and rewrites C in the panel.
	prefs := e.workspace(thread).Preferences
	e.admin("DELETE", fmt.Sprintf("/admin/v1/threads/%s/preferences/%d", thread, prefs[0].ID), nil, 204, nil)
	e.admin("PATCH", fmt.Sprintf("/admin/v1/threads/%s/preferences/%d", thread, prefs[2].ID), map[string]any{"title": "C, the user's"}, 200, nil)

	text, isError = mcpCall(t, cs, "update_preferences", map[string]any{"thread": thread, "as_of": n,
		"updates": []any{map[string]any{"index": 2, "title": "B2"}, map[string]any{"index": 3, "title": "C2"}}})
	require.False(t, isError, text)
	require.Equal(t, `updated #2 "B2"; changed since it was shown; call list_preferences: #3 "C"`, text)
	text, isError = mcpCall(t, cs, "remove_preferences", map[string]any{"thread": thread, "as_of": n, "indices": []any{1, 4}})
	require.False(t, isError, text)
	require.Equal(t, `removed #4 "D"; changed since it was shown; call list_preferences: #1 "A"`, text)
	require.Equal(t, []string{"B2", "C, the user's"}, e.titles(thread))

	// Without as_of: the list as it stands.
	text, isError = mcpCall(t, cs, "remove_preferences", map[string]any{"thread": thread, "indices": []any{1}})
	require.False(t, isError, text)
	require.Equal(t, `removed #1 "B2"`, text)
	// A change not made yet is no list's version.
	text, isError = mcpCall(t, cs, "remove_preferences", map[string]any{"thread": thread, "as_of": n + 100, "indices": []any{1}})
	require.True(t, isError, text)
	require.Contains(t, text, "as_of")
	require.Equal(t, []string{"C, the user's"}, e.titles(thread))

	// as_of is MCP's: the turn's tool definitions do not have it.
	list, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	for _, tl := range list.Tools {
		b, _ := json.Marshal(tl.InputSchema)
		require.Equal(t, tl.Name == tools.UpdatePreferences || tl.Name == tools.RemovePreferences, strings.Contains(string(b), `"as_of"`), tl.Name)
	}
	for _, def := range tools.Definitions {
		require.NotContains(t, string(def), "as_of")
	}
}

// TestMCPThreadTokenCallOnADeletedThread: a thread token's call that meets its thread's deletion
// (checked before it, committed while the call waits for the thread's lock) does not create the
// thread again: the call is refused and the thread stays deleted.
func TestMCPThreadTokenCallOnADeletedThread(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const thread = "doomed"
	e.preferencesOf(thread, "A")
	token, _, _ := mintMCPToken(t, e, thread, 0)
	cs := mcpConnect(t, e.srv.URL, token, mcpLatest, nil)

	deleting, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer deleting.Rollback(ctx)
	n, err := db.New().ThreadDelete(ctx, deleting, thread)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	var deleter int
	require.NoError(t, deleting.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&deleter))

	type result struct {
		res *mcp.CallToolResult
		err error
	}
	called := make(chan result, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "add_preferences",
			Arguments: map[string]any{"items": []any{map[string]any{"title": "B"}}}})
		called <- result{res, err}
	}()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", deleter).Scan(&waiting))
		return waiting > 0
	}, time.Minute, 10*time.Millisecond, "the call waits for the thread's deletion")
	require.NoError(t, deleting.Commit(ctx))
	r := <-called
	require.NoError(t, r.err)
	require.True(t, r.res.IsError, "the call on a deleted thread is refused")
	require.Equal(t, []mcp.Content{&mcp.TextContent{Text: "this thread's workspace was deleted; nothing was recorded"}}, r.res.Content)
	e.admin("GET", "/admin/v1/threads/"+thread, nil, 404, nil)
}
