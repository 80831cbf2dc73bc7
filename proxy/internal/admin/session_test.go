package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestPanelSessions: who sees what (docs/spec.md §13). The admin token sees every thread; a client key
// that client's; a signed link one thread, until it expires. Writes with a session need the CSRF
// token and the panel's origin. Failed sign-ins are throttled. The session is a signed cookie,
// valid on another replica, never the token.
func TestPanelSessions(t *testing.T) {
	t.Parallel()
	withKeys := withClientKeys(t, "alice=sk-alice-secret,bob=sk-bob-secret")
	e := setup(t, withKeys)
	for _, th := range []string{"alice~a1", "alice~a2", "bob~b1", "plain"} {
		e.admin("PUT", "/admin/v1/threads/"+th+"/objective", map[string]any{"text": "goal of " + th}, 200, nil)
	}
	threadsOf := func(c *testkit.PanelClient) []string {
		code, body := c.Do("GET", "/admin/v1/threads", "", nil)
		require.Equal(t, 200, code, body)
		var p page[workspace.Thread]
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		var ids []string
		for _, th := range p.Data {
			ids = append(ids, th.ID)
		}
		return ids
	}

	// No session: 401, and the page itself is served with its security headers.
	anon := e.panelClient()
	code, _ := anon.Do("GET", "/admin/v1/threads", "", nil)
	require.Equal(t, 401, code)
	resp, err := http.Get(e.srv.URL + "/ui/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	csp := resp.Header.Get("Content-Security-Policy")
	require.Contains(t, csp, "frame-ancestors 'none'")
	require.Contains(t, csp, "script-src 'self'")
	require.NotContains(t, csp, "unsafe-inline")

	admin := e.panelClient()
	require.Equal(t, 200, admin.SignIn(adminToken))
	require.ElementsMatch(t, []string{"alice~a1", "alice~a2", "bob~b1", "plain"}, threadsOf(admin))
	for _, c := range admin.HTTP.Jar.Cookies(mustURL(t, e.srv.URL)) {
		require.NotContains(t, c.Value, adminToken, "the cookie never holds the token")
	}

	alice := e.panelClient()
	require.Equal(t, 200, alice.SignIn("sk-alice-secret"))
	require.ElementsMatch(t, []string{"alice~a1", "alice~a2"}, threadsOf(alice))
	code, _ = alice.Do("GET", "/admin/v1/threads/bob~b1", "", nil)
	require.Equal(t, 404, code, "another client's thread does not exist for alice")
	code, _ = alice.Write("PUT", "/admin/v1/threads/bob~b1/objective", `{"text":"mine now"}`)
	require.Equal(t, 404, code)
	code, body := alice.Write("POST", "/admin/v1/threads/alice~a1/preferences", `{"title":"Alice's"}`)
	require.Equal(t, 201, code, body)

	// Writes without the CSRF token, from another origin or another site: refused, nothing written.
	for _, h := range []map[string]string{
		{"Origin": e.srv.URL},
		{"X-CSRF-Token": alice.CSRF, "Origin": "https://evil.example"},
		{"X-CSRF-Token": alice.CSRF, "Sec-Fetch-Site": "cross-site"},
		{"X-CSRF-Token": "forged", "Origin": e.srv.URL},
	} {
		code, body := alice.Do("POST", "/admin/v1/threads/alice~a1/preferences", `{"title":"Forged"}`, h)
		require.Equal(t, 403, code, body)
		require.Contains(t, body, "csrf_refused")
	}
	require.Len(t, e.workspace("alice~a1").Preferences, 1)

	// A signed link: one thread, no other, not after it expires.
	var l struct {
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	e.admin("POST", "/admin/v1/threads/plain/links", map[string]any{"ttl_seconds": 2}, 201, &l)
	require.True(t, strings.HasPrefix(l.URL, e.srv.URL+"/ui/link?token="))
	visitor := e.panelClient()
	code, body = visitor.Do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "/ui/#/t/plain")
	code, body = visitor.Do("GET", "/ui/session", "", nil)
	require.Equal(t, 200, code)
	var ses struct{ Scope, CSRF string }
	require.NoError(t, json.Unmarshal([]byte(body), &ses))
	require.Equal(t, "thread:plain", ses.Scope)
	visitor.CSRF = ses.CSRF
	require.Equal(t, []string{"plain"}, threadsOf(visitor))
	code, _ = visitor.Do("GET", "/admin/v1/threads/alice~a1", "", nil)
	require.Equal(t, 404, code)
	code, _ = visitor.Write("POST", "/admin/v1/threads/plain/preferences", `{"title":"From the link"}`)
	require.Equal(t, 201, code)
	code, _ = visitor.Write("POST", "/admin/v1/threads/plain/links", `{"ttl_seconds":2592000}`)
	require.Equal(t, 403, code, "a link's holder cannot outlive the link with a new one")
	time.Sleep(time.Until(l.ExpiresAt) + 100*time.Millisecond)
	code, _ = visitor.Do("GET", "/admin/v1/threads/plain", "", nil)
	require.Equal(t, 401, code, "the session ends with the link")
	late := e.panelClient()
	code, _ = late.Do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 403, code, "an expired link opens nothing")
	code, _ = late.Do("GET", "/ui/link?token="+url.QueryEscape(strings.Replace(strings.TrimPrefix(l.URL, e.srv.URL+"/ui/link?token="), "l.", "s.", 1)), "", nil)
	require.Equal(t, 403, code, "a link is not a session")

	// The session is valid on another replica with the same admin token.
	other := setupWithPool(t, e.pool, withKeys)
	admin.Base = other.srv.URL
	admin.HTTP.Jar.SetCookies(mustURL(t, other.srv.URL), admin.HTTP.Jar.Cookies(mustURL(t, e.srv.URL)))
	require.Len(t, threadsOf(admin), 4)

	// Sign-out ends it; failed sign-ins are throttled.
	code, _ = alice.Write("DELETE", "/ui/session", "")
	require.Equal(t, 204, code)
	code, _ = alice.Do("GET", "/admin/v1/threads", "", nil)
	require.Equal(t, 401, code)
	for range auth.MaxFailures {
		require.Equal(t, 401, anon.SignIn("wrong"))
	}
	require.Equal(t, 429, anon.SignIn("wrong"))
	require.Equal(t, 200, anon.SignIn(adminToken), "the right token is served")

	// UI=off: no panel, and links are refused.
	off := setupWithPool(t, e.pool, func(o *Options) { o.DisablePanel = true })
	resp, err = http.Get(off.srv.URL + "/ui/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 404, resp.StatusCode)
	off.admin("POST", "/admin/v1/threads/plain/links", nil, 409, nil)
}

// TestPanelLinkRevoked: a panel link is revocable (DELETE …/links/{id}): revoked, it opens
// nothing, the sessions it opened end — their calls are 401, their event stream closes — and a
// link's holder can neither list nor revoke links.
func TestPanelLinkRevoked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.admin("PUT", "/admin/v1/threads/shared/objective", map[string]any{"text": "Share it"}, 200, nil)
	var l struct {
		ID   int64  `json:"id"`
		Kind string `json:"kind"`
		URL  string `json:"url"`
	}
	e.admin("POST", "/admin/v1/threads/shared/links", nil, 201, &l)
	require.Equal(t, "panel", l.Kind)
	visitor := e.panelClient()
	code, _ := visitor.Do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 200, code)
	code, _ = visitor.Do("GET", "/admin/v1/threads/shared", "", nil)
	require.Equal(t, 200, code)
	code, _ = visitor.Do("GET", "/admin/v1/threads/shared/links", "", nil)
	require.Equal(t, 403, code, "a link's holder lists no links")
	code, _ = visitor.Do("DELETE", fmt.Sprintf("/admin/v1/threads/shared/links/%d", l.ID), "", map[string]string{"X-CSRF-Token": visitor.CSRF})
	require.Equal(t, 403, code)

	req, err := http.NewRequest("GET", e.srv.URL+"/admin/v1/threads/shared/events/stream", nil)
	require.NoError(t, err)
	stream, err := visitor.HTTP.Do(req)
	require.NoError(t, err)
	defer stream.Body.Close()
	require.Equal(t, 200, stream.StatusCode)

	e.admin("DELETE", fmt.Sprintf("/admin/v1/threads/shared/links/%d", l.ID), nil, 204, nil)
	code, _ = visitor.Do("GET", "/admin/v1/threads/shared", "", nil)
	require.Equal(t, 401, code, "the session ends with its link")
	code, _ = e.panelClient().Do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 403, code, "a revoked link opens nothing")
	// The stream ends at its next wake-up.
	e.admin("PUT", "/admin/v1/threads/shared/objective", map[string]any{"text": "Changed"}, 200, nil)
	_, err = io.ReadAll(stream.Body)
	require.NoError(t, err, "the stream ended")
}

// TestLinksListedWithoutTokens: POST …/links issues a panel link (its URL holds the token) or,
// with {"kind":"mcp"}, an MCP token and /mcp's URL; the thread's listing names both, never a
// token; a link revoked once is not found the second time.
func TestLinksListedWithoutTokens(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.admin("PUT", "/admin/v1/threads/bob~t1/objective", map[string]any{"text": "Bob's"}, 200, nil)
	type issued struct {
		ID    int64  `json:"id"`
		Kind  string `json:"kind"`
		Token string `json:"token"`
		URL   string `json:"url"`
	}
	var mcpLink, panel issued
	e.admin("POST", "/admin/v1/threads/bob~t1/links", map[string]any{"kind": "mcp"}, 201, &mcpLink)
	require.Equal(t, "mcp", mcpLink.Kind)
	require.Equal(t, e.srv.URL+"/mcp", mcpLink.URL)
	require.NotEmpty(t, mcpLink.Token)
	e.admin("POST", "/admin/v1/threads/bob~t1/links", map[string]any{}, 201, &panel)
	require.Equal(t, "panel", panel.Kind)
	panelToken := mustURL(t, panel.URL).Query().Get("token")
	require.NotEmpty(t, panelToken)

	var links page[map[string]any]
	e.admin("GET", "/admin/v1/threads/bob~t1/links", nil, 200, &links)
	require.Len(t, links.Data, 2)
	require.NotContains(t, fmt.Sprint(links.Data), mcpLink.Token, "a listing never shows a token")
	require.NotContains(t, fmt.Sprint(links.Data), panelToken, "a listing never shows a token")
	e.admin("DELETE", fmt.Sprintf("/admin/v1/threads/bob~t1/links/%d", mcpLink.ID), nil, 204, nil)
	e.admin("DELETE", fmt.Sprintf("/admin/v1/threads/bob~t1/links/%d", mcpLink.ID), nil, 404, nil)
}
