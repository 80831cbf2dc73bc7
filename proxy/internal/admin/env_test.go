package admin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/eventhub"
	"github.com/wsproxy/wsproxy/workspace"
)

const adminToken = "test-admin-token"

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
	hub := eventhub.New(store.Versions, 20*time.Millisecond, slog.New(slog.DiscardHandler))
	opts := Options{Store: store, Guard: &auth.Guard{AdminToken: adminToken}, ReadBody: readAll, Hub: hub}
	for _, c := range configure {
		c(&opts)
	}
	s := New(opts)
	mux := http.NewServeMux()
	s.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		s.Close() // the event streams end, so srv.Close can finish
		hub.Close()
		srv.Close()
	})
	return &env{t: t, srv: srv, server: s, pool: pool, store: store}
}

// withClientKeys is setup's option of CLIENT_KEYS spec.
func withClientKeys(t testing.TB, spec string) func(*Options) {
	keys, err := auth.ParseClientKeys(spec)
	require.NoError(t, err)
	return func(o *Options) { o.Guard.ClientKeys = keys }
}

// readAll is Options.ReadBody without the edge's limits.
func readAll(_ http.ResponseWriter, r *http.Request) ([]byte, func(), error) {
	b, err := io.ReadAll(r.Body)
	return b, func() {}, err
}

// admin calls the admin REST and decodes the JSON answer into out (when not nil).
func (e *env) admin(method, path string, body any, wantStatus int, out any) {
	e.t.Helper()
	status, b := e.call(method, path, body)
	require.Equal(e.t, wantStatus, status, "%s %s: %s", method, path, b)
	if out != nil {
		require.NoError(e.t, json.Unmarshal([]byte(b), out), b)
	}
}

// call calls the admin REST with the admin token: the answer's status and body.
func (e *env) call(method, path string, body any) (int, string) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(e.t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// workspace reads a thread's workspace, named in its stored form (client~thread for a client's).
func (e *env) workspace(thread string) workspace.Detail {
	e.t.Helper()
	id, err := workspace.ParseThreadID(thread)
	require.NoError(e.t, err)
	d, err := e.store.Workspace(id).Get(context.Background())
	require.NoError(e.t, err)
	return d
}

func requireErrorBody(t *testing.T, body, typ, code string) map[string]any {
	t.Helper()
	var eb struct {
		Error map[string]any `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &eb), body)
	require.Equal(t, typ, eb.Error["type"], body)
	require.Equal(t, code, eb.Error["code"], body)
	require.NotEmpty(t, eb.Error["message"])
	require.Contains(t, eb.Error, "param")
	return eb.Error
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

// panelClient is a browser-like client: a cookie jar, and the headers a same-origin page sends.
type panelClient struct {
	t    testing.TB
	base string
	http *http.Client
	csrf string
}

func (e *env) panelClient() *panelClient {
	jar, err := cookiejar.New(nil)
	require.NoError(e.t, err)
	return &panelClient{t: e.t, base: e.srv.URL, http: &http.Client{Jar: jar}}
}

func (c *panelClient) do(method, path, body string, header map[string]string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	require.NoError(c.t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// write sends a write as the panel's page does: same origin, with the CSRF token.
func (c *panelClient) write(method, path, body string) (int, string) {
	return c.do(method, path, body, map[string]string{"X-CSRF-Token": c.csrf, "Origin": c.base, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"})
}

func (c *panelClient) signIn(token string) int {
	code, body := c.do("POST", "/ui/session", `{"token":"`+token+`"}`, map[string]string{"Content-Type": "application/json"})
	if code == 200 {
		var s struct{ CSRF string }
		require.NoError(c.t, json.Unmarshal([]byte(body), &s))
		c.csrf = s.CSRF
	}
	return code
}

// sseReader reads an admin event stream.
type sseReader struct {
	t    testing.TB
	resp *http.Response
	rd   *bufio.Reader
}

// openStream opens thread's event stream, with Last-Event-ID lastID and ?after=after when they
// are not empty.
func (e *env) openStream(thread, lastID, after string) *sseReader {
	e.t.Helper()
	s, err := e.dialStream(thread, lastID, after)
	require.NoError(e.t, err)
	return s
}

// dialStream is openStream for a goroutine other than the test's, which must not call
// t.FailNow: it returns what went wrong.
func (e *env) dialStream(thread, lastID, after string) (*sseReader, error) {
	u := e.srv.URL + "/admin/v1/threads/" + thread + "/events/stream"
	if after != "" {
		u += "?after=" + after
	}
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req) // returns with the headers: they come at once
	if err != nil {
		return nil, err
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		return nil, fmt.Errorf("stream of %s: %s, %s", thread, resp.Status, ct)
	}
	return &sseReader{t: e.t, resp: resp, rd: bufio.NewReader(resp.Body)}, nil
}

// next reads the next event: its id and data. An event that has not come within a minute (at
// once; a minute on a busy machine) fails the test: the stream is closed.
func (s *sseReader) next() (string, workspace.Event) {
	s.t.Helper()
	id, ev, err := s.read()
	require.NoError(s.t, err)
	return id, ev
}

// read is next for a goroutine other than the test's: it returns what went wrong.
func (s *sseReader) read() (string, workspace.Event, error) {
	late := time.AfterFunc(time.Minute, func() { s.resp.Body.Close() })
	defer late.Stop()
	var id string
	for {
		line, err := s.rd.ReadString('\n')
		if err != nil {
			return "", workspace.Event{}, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			var ev workspace.Event
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				return "", ev, err
			}
			if id != itoa(ev.ID) {
				return "", ev, fmt.Errorf("event %d under the id %q", ev.ID, id)
			}
			return id, ev, nil
		}
	}
}
