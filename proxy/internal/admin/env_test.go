package admin

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

const adminToken = testkit.AdminToken

// env is the user path's server on a fresh schema: its routes on a mux of their own behind a
// real HTTP server, its own event hub listening to the schema's notifications (a replica).
type env struct {
	t      testing.TB
	srv    *httptest.Server
	server *Server
	pool   *pgxpool.Pool
	store  *workspace.Store
}

func setup(t testing.TB, configure ...func(*Options)) *env {
	t.Helper()
	return setupWithPool(t, dbtest.NewPool(t, nil), configure...)
}

// setupWithPool is a replica on pool's schema: its own hub and guard (the same admin token).
func setupWithPool(t testing.TB, pool *pgxpool.Pool, configure ...func(*Options)) *env {
	t.Helper()
	store := workspace.NewStore(pool, workspace.Options{})
	hub := testkit.Hub(store)
	opts := Options{Store: store, Guard: &auth.Guard{AdminToken: adminToken}, ReadBody: testkit.ReadAll, Hub: hub}
	for _, c := range configure {
		c(&opts)
	}
	s := New(opts)
	mux := http.NewServeMux()
	s.Register(mux)
	srv := testkit.Serve(t, mux, s.Close, hub.Close) // the event streams end with s.Close, so the server can close
	return &env{t: t, srv: srv, server: s, pool: pool, store: store}
}

// withClientKeys is setup's option of CLIENT_KEYS spec.
func withClientKeys(t testing.TB, spec string) func(*Options) {
	keys := testkit.ClientKeys(t, spec)
	return func(o *Options) { o.Guard.ClientKeys = keys }
}

// admin calls the admin REST and decodes the JSON answer into out (when not nil).
func (e *env) admin(method, path string, body any, wantStatus int, out any) {
	e.t.Helper()
	testkit.Admin(e.t, e.srv.URL, method, path, body, wantStatus, out)
}

// call calls the admin REST with the admin token: the answer's status and body.
func (e *env) call(method, path string, body any) (int, string) {
	e.t.Helper()
	return testkit.Call(e.t, e.srv.URL, method, path, body)
}

// workspace reads a thread's workspace, named in its stored form (client~thread for a client's).
func (e *env) workspace(thread string) workspace.Detail {
	e.t.Helper()
	return testkit.Workspace(e.t, e.store, thread)
}

func id(p workspace.Preference) string { return strconv.FormatInt(p.ID, 10) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

// panelClient is a panel client of the server.
func (e *env) panelClient() *testkit.PanelClient { return testkit.NewPanelClient(e.t, e.srv.URL) }

// openStream opens thread's event stream, with Last-Event-ID lastID and ?after=after when they
// are not empty.
func (e *env) openStream(thread, lastID, after string) *testkit.EventStream {
	e.t.Helper()
	return testkit.OpenStream(e.t, e.srv.URL, thread, lastID, after)
}

// dialStream is openStream for a goroutine other than the test's: it returns what went wrong.
func (e *env) dialStream(thread, lastID, after string) (*testkit.EventStream, error) {
	return testkit.DialStream(e.t, e.srv.URL, thread, lastID, after)
}
