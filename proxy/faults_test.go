package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/demo"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestPostgresGoesAway: while Postgres is unreachable, thread turns and admin calls get 503 at
// once and pass-through keeps working; when it is back the pool recovers, and the turns that
// failed left nothing behind.
func TestPostgresGoesAway(t *testing.T) {
	t.Parallel()
	pool, fault := dbtest.NewFaultPool(t, nil)
	e := setupWithPool(t, pool)
	th := map[string]string{"X-Thread-Id": "away"}
	e.up.Fallback = reply(cmpl("ok"))

	require.Equal(t, 200, e.post("/v1/chat/completions", th, `{"messages":[]}`).StatusCode)
	fault.Cut()
	for range 3 {
		start := time.Now()
		resp := e.post("/v1/chat/completions", th, `{"messages":[]}`)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "server_error", "workspace_unavailable")
		require.Less(t, time.Since(start), 5*time.Second, "fails fast, no hang")
	}
	e.admin("GET", "/admin/v1/threads/away", nil, http.StatusServiceUnavailable, nil)
	e.admin("POST", "/admin/v1/threads/away/preferences", map[string]any{"title": "x"}, http.StatusServiceUnavailable, nil)
	r, err := http.Get(e.srv.URL + "/readyz")
	require.NoError(t, err)
	r.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, r.StatusCode)
	require.Equal(t, 200, e.post("/v1/chat/completions", nil, `{"messages":[]}`).StatusCode, "pass-through needs no database")

	fault.Restore()
	require.Eventually(t, func() bool {
		return e.post("/v1/chat/completions", th, `{"messages":[]}`).StatusCode == 200
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, 2, e.turns("away"), "the refused turns took no turn number")
}

// TestPostgresRestartsMidTurn: Postgres goes away between the model's reply and the proxy's tool
// calls: the turn ends with 503 (or an error event once streaming), and nothing of the calls is
// written.
func TestPostgresRestartsMidTurn(t *testing.T) {
	t.Parallel()
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "NonStreamed", true: "Streamed"}[stream], func(t *testing.T) {
			t.Parallel()
			pool, fault := dbtest.NewFaultPool(t, nil)
			e := setupWithPool(t, pool)
			calls := []call{
				{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":"A"},{"title":"B"}]}`},
				{ID: "b", Name: "set_objective", Arguments: `{"text":"x"}`},
			}
			e.up.Script(func(w http.ResponseWriter, r *http.Request) {
				fault.Cut()
				if stream {
					upstreamtest.Stream(upstreamtest.Join(upstreamtest.ContentChunks("c", "Noting.")[:2], upstreamtest.ToolCallChunks("c", 8, calls...)[1:])...)(w, r)
				} else {
					reply(cmpl("", calls...))(w, r)
				}
			})
			body := `{"messages":[]}`
			if stream {
				body = `{"stream":true,"messages":[]}`
			}
			resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "mid"}, body)
			got := testkit.ReadBody(t, resp)
			if stream {
				require.Equal(t, 200, resp.StatusCode)
				require.Contains(t, got, `"content":"Noting."`)
				require.True(t, strings.HasSuffix(got, "\n\n") && strings.Contains(got, `"code":"workspace_unavailable"`), got)
				require.NotContains(t, got, "[DONE]")
			} else {
				require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, got)
			}
			fault.Restore()
			require.Eventually(t, func() bool { return e.store.Ping(context.Background()) == nil }, 10*time.Second, 50*time.Millisecond)
			d := e.workspace("mid")
			require.Empty(t, d.Preferences)
			require.Nil(t, d.Objective)
			var calls2 page[workspace.ToolCallRecord]
			e.admin("GET", "/admin/v1/threads/mid/tool-calls", nil, 200, &calls2)
			require.Empty(t, calls2.Data)
		})
	}
}

// TestPoolExhausted: with every connection busy, a turn waits up to the store's timeout, then
// gets a clear 503.
func TestPoolExhausted(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, &dbtest.Options{MaxConns: 1})
	e := setupWithPool(t, pool, func(o *Options) {
		o.Store = workspace.NewStore(pool, workspace.Options{Timeout: 300 * time.Millisecond})
	})
	e.up.Fallback = reply(cmpl("ok"))
	held, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	start := time.Now()
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "busy"}, `{"messages":[]}`)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	msg := testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "server_error", "workspace_unavailable")["message"]
	require.Contains(t, msg, "in time")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "it waited for a connection")
	held.Release()
	require.Equal(t, 200, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "busy"}, `{"messages":[]}`).StatusCode)
}

// TestStatementTimeout: a statement stuck behind a lock is cancelled by statement_timeout; the
// turn gets 503 and the thread is untouched.
func TestStatementTimeout(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewFaultPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "200" })
	e := setupWithPool(t, pool)
	e.up.Fallback = reply(cmpl("ok"))
	th := map[string]string{"X-Thread-Id": "stuck"}
	require.Equal(t, 200, e.post("/v1/chat/completions", th, `{"messages":[]}`).StatusCode)

	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	_, err = tx.Exec(context.Background(), `SET LOCAL statement_timeout = 0`)
	require.NoError(t, err)
	_, err = tx.Exec(context.Background(), `SELECT 1 FROM threads WHERE id = 'stuck' FOR UPDATE`)
	require.NoError(t, err)
	resp := e.post("/v1/chat/completions", th, `{"messages":[]}`)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "server_error", "workspace_unavailable")
	require.NoError(t, tx.Rollback(context.Background()))

	require.Equal(t, 200, e.post("/v1/chat/completions", th, `{"messages":[]}`).StatusCode)
	require.Equal(t, 2, e.turns("stuck"), "the refused turn took no turn number")
}

// TestUpstreamResetMidStream: the upstream's connection dies after part of the stream: the
// client gets what came, then an error event.
func TestUpstreamResetMidStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(func(w http.ResponseWriter, r *http.Request) {
		upstreamtest.StreamRaw(upstreamtest.Events(upstreamtest.ContentChunks("c", "part")[:2]...))(w, r)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	body := streamBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "reset"}, `{"stream":true,"messages":[]}`))
	require.Contains(t, body, `"content":"part"`)
	require.Contains(t, body, `"code":"upstream_unreachable"`)
	require.NotContains(t, body, "[DONE]")
}

// TestStreamSlowReader: a client that reads slowly gets the whole stream, intact.
func TestStreamSlowReader(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pieces := make([]string, 3000)
	for i := range pieces {
		pieces[i] = strings.Repeat("x", 99) + "."
	}
	e.up.Script(upstreamtest.Stream(upstreamtest.ContentChunks("c", pieces...)...))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "slow"}, `{"stream":true,"messages":[]}`)
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	tr := checkStream(t, got.String())
	require.Equal(t, strings.Repeat(strings.Repeat("x", 99)+".", 3000), tr.content)
}

// TestPostgresRefusesConnections: a Postgres that refuses connections with an SQLSTATE — the
// database does not allow connections (55000), too many connections for the role (53300) —
// gives 503 on thread turns and on every admin call that needs it, never 500.
func TestPostgresRefusesConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer admin.Close()
	name := "wsp_refuse_" + strings.ToLower(rand.Text()[:8])
	_, err = admin.Exec(ctx, "CREATE ROLE "+name+" LOGIN")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name+" OWNER "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+name)
	})
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.ConnConfig.Database = name, name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, db.Migrate(ctx, pool))
	e := setupWithPool(t, pool)
	e.up.Fallback = reply(cmpl("ok"))
	th := map[string]string{"X-Thread-Id": "refused"}
	require.Equal(t, 200, e.post("/v1/chat/completions", th, `{"messages":[]}`).StatusCode)
	// Every admin route, as the OpenAPI document names them (TestOpenAPIMatchesRoutes keeps it
	// true to the routes).
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	e.admin("GET", "/admin/v1/openapi.json", nil, 200, &doc)
	var routes []struct{ method, path string }
	for path, ops := range doc.Paths {
		for method := range ops {
			if method != "parameters" {
				routes = append(routes, struct{ method, path string }{strings.ToUpper(method), path})
			}
		}
	}
	require.NotEmpty(t, routes)

	for _, refuse := range []struct{ name, on, off string }{
		{"55000", "ALTER DATABASE " + name + " ALLOW_CONNECTIONS false", "ALTER DATABASE " + name + " ALLOW_CONNECTIONS true"},
		{"53300", "ALTER ROLE " + name + " CONNECTION LIMIT 0", "ALTER ROLE " + name + " CONNECTION LIMIT -1"},
	} {
		_, err := admin.Exec(ctx, refuse.on)
		require.NoError(t, err)
		pool.Reset() // the next operation connects anew, and is refused
		resp := e.post("/v1/chat/completions", th, `{"messages":[]}`)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, refuse.name)
		testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "server_error", "workspace_unavailable")
		for _, rt := range routes {
			if !strings.Contains(rt.path, "{thread}") && rt.path != "/admin/v1/threads" {
				continue // the OpenAPI document needs no database
			}
			path := strings.NewReplacer("{thread}", "refused", "{id}", "1").Replace(rt.path)
			var body any
			switch rt.method {
			case "PUT":
				body = map[string]any{"text": "x"}
				if strings.HasSuffix(path, "/parents") {
					body = map[string]any{"parents": []string{"p"}}
				}
			case "POST":
				switch {
				case strings.HasSuffix(path, "/links"):
					body = map[string]any{"ttl_seconds": 60}
				case strings.HasSuffix(path, "/preferences"):
					body = map[string]any{"title": "x"}
				case strings.HasSuffix(path, "/move"):
					body = map[string]any{"to": "p"}
				case strings.HasSuffix(path, "/import"):
					body = map[string]any{"format": "wsproxy.workspace/1"}
				}
			case "PATCH":
				body = map[string]any{"locked": true}
				if strings.HasSuffix(path, "/refused") {
					body = map[string]any{"agent_writes": "propose"}
				}
			}
			e.admin(rt.method, path, body, http.StatusServiceUnavailable, nil)
		}
		_, err = admin.Exec(ctx, refuse.off)
		require.NoError(t, err)
		pool.Reset()
		require.Equal(t, 200, e.post("/v1/chat/completions", th, `{"messages":[]}`).StatusCode, refuse.name)
	}
}

// TestWorkspaceUnavailableBypass: with WORKSPACE_UNAVAILABLE=bypass, a thread turn whose
// workspace cannot be read — Postgres cut, or every connection busy past WORKSPACE_BUDGET — is
// forwarded as the client sent it, marked X-Workspace: unavailable and counted; once Postgres is
// back the thread's turns have their workspace again. Without the setting it is 503
// (TestPostgresGoesAway, TestPoolExhausted).
func TestWorkspaceUnavailableBypass(t *testing.T) {
	t.Parallel()
	const body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	th := map[string]string{"X-Thread-Id": "bypass"}
	bypass := func(o *Options) { o.BypassUnavailable, o.WorkspaceBudget = true, 300*time.Millisecond }

	t.Run("PostgresCut", func(t *testing.T) {
		t.Parallel()
		pool, fault := dbtest.NewFaultPool(t, nil)
		e := setupWithPool(t, pool, bypass)
		e.up.Fallback = reply(cmpl("ok"))
		resp := e.post("/v1/chat/completions", th, body)
		require.Equal(t, 200, resp.StatusCode)
		require.Empty(t, resp.Header.Get("X-Workspace"), "a turn with its workspace is not marked")
		testkit.ReadBody(t, resp)
		require.Contains(t, string(e.up.Requests()[0].Body), "<workspace>")

		fault.Cut()
		resp = e.post("/v1/chat/completions", th, body)
		got := testkit.ReadBody(t, resp)
		require.Equal(t, 200, resp.StatusCode, got)
		require.Equal(t, "unavailable", resp.Header.Get("X-Workspace"))
		require.JSONEq(t, body, string(e.up.Requests()[1].Body), "forwarded as the client sent it: no block, no tools")
		require.Equal(t, 1.0, testutil.ToFloat64(e.opts().Metrics.bypassed))

		fault.Restore()
		require.Eventually(t, func() bool {
			resp := e.post("/v1/chat/completions", th, body)
			testkit.ReadBody(t, resp)
			return resp.StatusCode == 200 && resp.Header.Get("X-Workspace") == ""
		}, 30*time.Second, 50*time.Millisecond)
		require.Contains(t, string(e.up.Requests()[len(e.up.Requests())-1].Body), "<workspace>", "the workspace is back")
		require.Equal(t, 2, e.turns("bypass"), "the bypassed turn took no turn number")
	})

	t.Run("SlowerThanTheBudget", func(t *testing.T) {
		t.Parallel()
		pool := dbtest.NewPool(t, &dbtest.Options{MaxConns: 1})
		e := setupWithPool(t, pool, bypass, func(o *Options) {
			o.Store = workspace.NewStore(pool, workspace.Options{Timeout: time.Minute})
		})
		e.up.Fallback = reply(cmpl("ok"))
		held, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		defer held.Release()
		start := time.Now()
		resp := e.post("/v1/chat/completions", th, body)
		testkit.ReadBody(t, resp)
		waited := time.Since(start)
		t.Logf("answered without the workspace after %s (budget 300ms, store timeout 1m)", waited)
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, "unavailable", resp.Header.Get("X-Workspace"))
		require.GreaterOrEqual(t, waited, 300*time.Millisecond, "it waited for the budget")
		require.Less(t, waited, time.Minute, "not for the store's timeout")
	})
}

// TestDemoUnderBypass: the demo model, answering a turn wsproxy forwarded without its workspace
// (WORKSPACE_UNAVAILABLE=bypass, Postgres cut), does not tell its user that the request named no
// thread: it did.
func TestDemoUnderBypass(t *testing.T) {
	t.Parallel()
	pool, fault := dbtest.NewFaultPool(t, nil)
	e := setupWithPool(t, pool, func(o *Options) { o.BypassUnavailable, o.WorkspaceBudget = true, 300*time.Millisecond })
	e.up.Fallback = demo.Handler().ServeHTTP
	th := map[string]string{"X-Thread-Id": "named"}
	const body = `{"model":"wsproxy-demo","messages":[{"role":"user","content":"What do you know?"}]}`
	resp := e.post("/v1/chat/completions", th, body)
	got := testkit.ReadBody(t, resp)
	require.Equal(t, 200, resp.StatusCode, got)
	require.Contains(t, got, "Your objective: (none yet)", "with its workspace")

	fault.Cut()
	resp = e.post("/v1/chat/completions", th, body)
	got = testkit.ReadBody(t, resp)
	require.Equal(t, 200, resp.StatusCode, got)
	require.Equal(t, "unavailable", resp.Header.Get("X-Workspace"))
	require.NotContains(t, got, "(no thread)")
	require.Contains(t, got, "WORKSPACE_UNAVAILABLE=bypass")
	fault.Restore()
}

// TestFailedTurnsAreNotTurns: a thread turn whose first upstream round fails — the upstream
// unreachable, or refusing the request (a previous_response_id it does not know) — takes no turn
// number and leaves no empty thread; one that failed after a round reached the model counts as
// the turn it was, its calls kept (docs/spec.md §2).
func TestFailedTurnsAreNotTurns(t *testing.T) {
	t.Parallel()
	e := setup(t)
	th := func(name string) map[string]string { return map[string]string{"X-Thread-Id": name} }
	const body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

	// Refused on its first round: nothing counted, no thread made.
	e.up.Script(upstreamtest.JSON(400, `{"error":{"message":"Previous response with id 'resp_x' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`))
	resp := e.post("/v1/chat/completions", th("never"), body)
	require.Equal(t, 400, resp.StatusCode, testkit.ReadBody(t, resp))
	e.admin("GET", "/admin/v1/threads/never", nil, http.StatusNotFound, nil)

	// An existing thread: its count stays where its good turns left it.
	e.up.Script(reply(cmpl("ok")))
	resp = e.post("/v1/chat/completions", th("kept"), body)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	e.up.Script(upstreamtest.JSON(400, `{"error":{"message":"bad","type":"invalid_request_error"}}`))
	resp = e.post("/v1/chat/completions", th("kept"), body)
	require.Equal(t, 400, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Equal(t, 1, e.turns("kept"))

	// Failed after a round reached the model: the turn counts, its call stays.
	e.up.Script(reply(cmpl("", call{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":"Tabs"}],"action_and_reasoning":"asked"}`})),
		upstreamtest.JSON(400, `{"error":{"message":"bad","type":"invalid_request_error"}}`))
	resp = e.post("/v1/chat/completions", th("kept"), body)
	require.Equal(t, 400, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Equal(t, 2, e.turns("kept"), "the turn reached its model")
	require.Equal(t, []string{"Tabs"}, e.titles("kept"))

	// A first round cut off before its client had a byte of it: a plain error, no turn.
	e.up.Script(upstreamtest.StreamRaw([]string{"data: " + upstreamtest.Chunk("c1", "Hel", "") + "\n\n"}))
	resp = e.post("/v1/chat/completions", th("kept"), `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Equal(t, 2, e.turns("kept"))

	// The upstream unreachable: nothing counted, no thread made.
	e.up.Close()
	resp = e.post("/v1/chat/completions", th("unreached"), body)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, testkit.ReadBody(t, resp))
	e.admin("GET", "/admin/v1/threads/unreached", nil, http.StatusNotFound, nil)
	require.Equal(t, 2, e.turns("kept"))
	require.Equal(t, 2.0, testutil.ToFloat64(e.opts().Metrics.turns.WithLabelValues("turn")), "the turns that reached their model")
}
