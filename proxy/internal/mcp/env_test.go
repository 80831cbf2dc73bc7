package mcp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

const adminToken = testkit.AdminToken

// maxBatch is the servers' MaxBatch: the edge's default (MAX_TOOL_CALLS_PER_ROUND).
const maxBatch = 100

// env is the MCP server on a fresh schema: /mcp on a mux of its own behind a real HTTP server,
// with its own event hub listening to the schema's notifications (a replica). What the user
// changes, it changes through the store (the user path of tools).
type env struct {
	t      testing.TB
	srv    *httptest.Server
	server *Server
	pool   *pgxpool.Pool
	store  *workspace.Store
	guard  *auth.Guard
}

func setup(t testing.TB, configure ...func(*Options)) *env {
	t.Helper()
	return setupWithPool(t, dbtest.NewPool(t, nil), configure...)
}

// setupWithPool is a replica on pool's schema: its own hub and guard (the same admin token).
func setupWithPool(t testing.TB, pool *pgxpool.Pool, configure ...func(*Options)) *env {
	t.Helper()
	// Every MCP write is untrusted (docs/spec.md §19), a proposal by default: these tests are
	// about MCP itself, so its writes apply (proxy's TestUntrustedWritesOverMCP tests the default).
	store := workspace.NewStore(pool, workspace.Options{UntrustedWrites: workspace.UntrustedApply})
	hub := testkit.Hub(store)
	opts := Options{Store: store, Guard: &auth.Guard{AdminToken: adminToken}, Hub: hub, ReadBody: testkit.ReadAll, MaxBatch: maxBatch}
	for _, c := range configure {
		c(&opts)
	}
	s := New(opts)
	mux := http.NewServeMux()
	mux.Handle("/mcp", s)
	srv := testkit.Serve(t, mux, s.Close, hub.Close) // the subscriptions' streams end with s.Close, so the server can close
	return &env{t: t, srv: srv, server: s, pool: pool, store: store, guard: opts.Guard}
}

// withClientKeys is setup's option of CLIENT_KEYS spec.
func withClientKeys(t testing.TB, spec string) func(*Options) {
	keys := testkit.ClientKeys(t, spec)
	return func(o *Options) { o.Guard.ClientKeys = keys }
}

// ws is the workspace of thread (stored form).
func (e *env) ws(thread string) *workspace.Workspace {
	e.t.Helper()
	return testkit.WS(e.t, e.store, thread)
}

// workspace reads a thread's workspace.
func (e *env) workspace(thread string) workspace.Detail {
	e.t.Helper()
	return testkit.Workspace(e.t, e.store, thread)
}

func (e *env) titles(thread string) []string {
	e.t.Helper()
	return testkit.Titles(e.t, e.store, thread)
}

// setObjective and addPreference are the user's changes (the admin REST's).
func (e *env) setObjective(thread, text string) {
	e.t.Helper()
	_, err := e.ws(thread).SetObjective(context.Background(), text)
	require.NoError(e.t, err)
}

func (e *env) addPreference(thread, title string) workspace.Preference {
	e.t.Helper()
	p, err := e.ws(thread).AddPreference(context.Background(), workspace.PreferenceInput{Title: title})
	require.NoError(e.t, err)
	return p
}

// events are the thread's events, oldest first.
func (e *env) events(thread string) []workspace.Event {
	e.t.Helper()
	evs, err := e.ws(thread).Events(context.Background(), workspace.EventQuery{Limit: 500})
	require.NoError(e.t, err)
	return evs
}

// mintToken makes a thread token of kind (auth.KindMCP or auth.KindPanelLink) of thread (stored
// form), as the admin REST's POST …/links does for the admin: a link of the thread, expiring
// after ttl (an hour when zero), bound to the keys of the thread's client, signed with the
// guard's signer.
func mintToken(t *testing.T, e *env, thread, kind string, ttl time.Duration) (token string, id int64, expires time.Time) {
	t.Helper()
	if ttl == 0 {
		ttl = time.Hour
	}
	ws := e.ws(thread)
	link := workspace.LinkMCP
	if kind == auth.KindPanelLink {
		link = workspace.LinkPanel
	}
	expires = time.Now().Add(ttl).Truncate(time.Second)
	l, err := ws.IssueLink(context.Background(), link, expires)
	require.NoError(t, err)
	tok := auth.ThreadToken{Thread: ws.ThreadID().String(), ID: l.ID, Expires: expires.Unix(), Key: e.guard.ClientFingerprint(ws.ThreadID().Client)}
	return e.guard.Signer().Sign(kind, tok), l.ID, expires
}

// mintMCPToken makes an MCP thread token of thread (stored form), ttlSeconds long (an hour when
// zero).
func mintMCPToken(t *testing.T, e *env, thread string, ttlSeconds int) (token string, id int64, expires time.Time) {
	t.Helper()
	return mintToken(t, e, thread, auth.KindMCP, time.Duration(ttlSeconds)*time.Second)
}
