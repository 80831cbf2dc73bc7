package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/tools"
)

// TestAdminHistory: the events of agent and user changes through the admin REST, filtered and
// ordered, and reverts with their errors.
func TestAdminHistory(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var p tools.Preference
	e.admin("POST", "/admin/v1/threads/h/preferences", map[string]any{"title": "Trains"}, 201, &p)
	e.admin("PATCH", "/admin/v1/threads/h/preferences/"+itoa(p.ID), map[string]any{"locked": true}, 200, nil)
	// A turn whose agent tries to remove it, and sets the objective.
	e.up.Script(reply(cmpl("", call{ID: "a", Name: "remove_preferences", Arguments: `{"indices":[1],"action_and_reasoning":"The user changed their mind about trains."}`},
		call{ID: "b", Name: "set_objective", Arguments: `{"text":"Lisbon","action_and_reasoning":"A goal."}`})), reply(cmpl("ok")))
	require.Equal(t, 200, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "h"}, `{"messages":[{"role":"user","content":"x"}]}`).StatusCode)

	var evs page[tools.Event]
	e.admin("GET", "/admin/v1/threads/h/events", nil, 200, &evs)
	var kinds []string
	for _, ev := range evs.Data {
		kinds = append(kinds, ev.Kind)
	}
	require.Equal(t, []string{"preference_added", "preference_locked", "locked_skip", "objective_set"}, kinds)
	skip := evs.Data[2]
	require.Equal(t, "The user changed their mind about trains.", *skip.Reason)
	require.Equal(t, "agent", skip.Actor)
	require.Equal(t, 1, *skip.Turn)
	e.admin("GET", "/admin/v1/threads/h/events?order=desc&limit=1", nil, 200, &evs)
	require.Equal(t, int64(4), evs.Data[0].ID)
	require.True(t, evs.HasMore)
	e.admin("GET", "/admin/v1/threads/h/events?target=preference:"+itoa(p.ID), nil, 200, &evs)
	require.Len(t, evs.Data, 3)
	e.admin("GET", "/admin/v1/threads/h/events?target=nope", nil, 400, nil)
	e.admin("GET", "/admin/v1/threads/h/events?order=up", nil, 400, nil)
	e.admin("GET", "/admin/v1/threads/nope/events", nil, 404, nil)

	// Revert the objective; a locked_skip is a 400; the addition is a 409 naming the lock.
	var rev tools.Event
	e.admin("POST", "/admin/v1/threads/h/events/4/revert", nil, 200, &rev)
	require.Equal(t, "revert", rev.Kind)
	require.Equal(t, int64(4), *rev.Reverts)
	require.Nil(t, e.workspace("h").Objective)
	e.admin("POST", "/admin/v1/threads/h/events/3/revert", nil, 400, nil)
	var conflict struct{ Error apierr.Error }
	e.admin("POST", "/admin/v1/threads/h/events/1/revert", nil, 409, &conflict)
	require.Contains(t, conflict.Error.Message, "event 2")
	e.admin("POST", "/admin/v1/threads/h/events/99/revert", nil, 404, nil)

	// Threads by id prefix.
	e.admin("POST", "/admin/v1/threads/other/preferences", map[string]any{"title": "x"}, 201, nil)
	var threads page[tools.Thread]
	e.admin("GET", "/admin/v1/threads?q=h", nil, 200, &threads)
	require.Len(t, threads.Data, 1)
	require.Equal(t, "h", threads.Data[0].ID)
}

// TestAdminApplyProposal: the agent's refused update of a locked preference keeps its proposal;
// POST …/events/{id}/apply makes it a user change with the lock kept (200 with the new event),
// then 409 as the item changed since; 400 for an event of another kind, 404 for an unknown one.
func TestAdminApplyProposal(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var p tools.Preference
	e.admin("POST", "/admin/v1/threads/ap/preferences", map[string]any{"title": "Formal tone", "kind": "hard", "locked": true}, 201, &p)
	e.up.Script(reply(cmpl("", call{ID: "a", Name: "update_preferences",
		Arguments: `{"updates":[{"index":1,"title":"Casual tone"}],"action_and_reasoning":"The user writes casually."}`})), reply(cmpl("ok")))
	require.Equal(t, 200, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "ap"}, `{"messages":[{"role":"user","content":"x"}]}`).StatusCode)

	var evs page[tools.Event]
	e.admin("GET", "/admin/v1/threads/ap/events", nil, 200, &evs)
	require.Len(t, evs.Data, 2)
	skip := evs.Data[1]
	require.Equal(t, "locked_skip", skip.Kind)
	require.JSONEq(t, `{"title":"Casual tone","subtitle":"","kind":"hard"}`, string(skip.Proposed))

	var applied tools.Event
	e.admin("POST", "/admin/v1/threads/ap/events/"+itoa(skip.ID)+"/apply", nil, 200, &applied)
	require.Equal(t, "preference_updated", applied.Kind)
	require.Equal(t, "user", applied.Actor)
	require.JSONEq(t, `{"title":"Casual tone","subtitle":"","kind":"hard","locked":true}`, string(applied.After))
	require.Equal(t, "Casual tone", e.workspace("ap").Preferences[0].Title)
	require.True(t, e.workspace("ap").Preferences[0].Locked)

	var conflict struct{ Error apierr.Error }
	e.admin("POST", "/admin/v1/threads/ap/events/"+itoa(skip.ID)+"/apply", nil, 409, &conflict)
	require.Contains(t, conflict.Error.Message, "event "+itoa(applied.ID))
	e.admin("POST", "/admin/v1/threads/ap/events/1/apply", nil, 400, nil)
	e.admin("POST", "/admin/v1/threads/ap/events/99/apply", nil, 404, nil)
}

// twoReplicas is two proxies on one database whose event streams only Postgres's
// notifications wake (no heartbeat).
func twoReplicas(t *testing.T) (*env, *env) {
	noHeartbeat := func(o *Options) { o.EventHeartbeat = time.Hour }
	e := setup(t, noHeartbeat)
	return e, setupWithPool(t, e.pool, noHeartbeat)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// sseReader reads an admin event stream.
type sseReader struct {
	t    testing.TB
	resp *http.Response
	rd   *bufio.Reader
}

// openStream opens thread's event stream at base, with Last-Event-ID lastID and ?after=after
// when they are not empty.
func (e *env) openStream(base, thread, lastID, after string) *sseReader {
	e.t.Helper()
	u := base + "/admin/v1/threads/" + thread + "/events/stream"
	if after != "" {
		u += "?after=" + after
	}
	req, err := http.NewRequest("GET", u, nil)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req) // returns with the headers: they come at once
	require.NoError(e.t, err)
	require.Equal(e.t, 200, resp.StatusCode)
	require.Equal(e.t, "text/event-stream", resp.Header.Get("Content-Type"))
	e.t.Cleanup(func() { resp.Body.Close() })
	return &sseReader{t: e.t, resp: resp, rd: bufio.NewReader(resp.Body)}
}

// next reads the next event: its id and data.
func (s *sseReader) next() (string, tools.Event) {
	s.t.Helper()
	var id string
	for {
		line, err := s.rd.ReadString('\n')
		require.NoError(s.t, err)
		line = strings.TrimSuffix(line, "\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			var ev tools.Event
			require.NoError(s.t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev))
			require.Equal(s.t, id, itoa(ev.ID))
			return id, ev
		}
	}
}

// TestEventStream: a stream gets each new event as it commits — from this replica or another on
// the same Postgres — resumes after Last-Event-ID without a gap or a repeat, and ends when the
// proxy shuts down.
func TestEventStream(t *testing.T) {
	t.Parallel()
	e, other := twoReplicas(t)
	e.admin("PUT", "/admin/v1/threads/live/objective", map[string]any{"text": "Before the stream"}, 200, nil)

	s := e.openStream(e.srv.URL, "live", "", "")
	e.admin("POST", "/admin/v1/threads/live/preferences", map[string]any{"title": "One"}, 201, nil)
	id, ev := s.next()
	require.Equal(t, "2", id, "only what commits after the stream opened")
	require.Equal(t, "preference_added", ev.Kind)
	// A change through the other replica reaches this one's stream (LISTEN/NOTIFY).
	other.admin("POST", "/admin/v1/threads/live/preferences", map[string]any{"title": "Two"}, 201, nil)
	id, _ = s.next()
	require.Equal(t, "3", id)
	s.resp.Body.Close()

	// Changes while away; a reconnect with Last-Event-ID gets them, in order, once.
	e.admin("POST", "/admin/v1/threads/live/preferences", map[string]any{"title": "Three"}, 201, nil)
	e.admin("PUT", "/admin/v1/threads/live/objective", map[string]any{"text": "After"}, 200, nil)
	s = other.openStream(other.srv.URL, "live", "3", "")
	for _, want := range []string{"4", "5"} {
		id, _ := s.next()
		require.Equal(t, want, id)
	}
	e.admin("DELETE", "/admin/v1/threads/live/preferences/1", nil, 204, nil)
	id, ev = s.next()
	require.Equal(t, "6", id)
	require.Equal(t, "preference_removed", ev.Kind)

	// An idle stream gets a comment line at each heartbeat.
	beating := setupWithPool(t, e.pool, func(o *Options) { o.EventHeartbeat = 20 * time.Millisecond })
	idle := beating.openStream(beating.srv.URL, "live", "", "")
	for {
		line, err := idle.rd.ReadString('\n')
		require.NoError(t, err)
		if line == ": heartbeat\n" {
			break
		}
	}

	// Shutting down ends the stream.
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, s.resp.Body); done <- err }()
	go func() { _ = other.proxy.Shutdown(context.Background()) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end when the proxy closed")
	}
}

// TestEventStreamAfter: a stream opened with ?after= the last event a read saw first gets every
// later event — one committed between the read and the stream's open included — without a
// repeat; Last-Event-ID (a reconnecting EventSource keeps its URL) wins over it; an after that is
// not an event id is a 400.
func TestEventStreamAfter(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.EventHeartbeat = time.Hour }) // only the commits wake the stream
	e.admin("PUT", "/admin/v1/threads/gap/objective", map[string]any{"text": "Read by the page"}, 200, nil)
	var page struct{ Data []tools.Event }
	e.admin("GET", "/admin/v1/threads/gap/events", nil, 200, &page)
	require.NotEmpty(t, page.Data)
	read := page.Data[len(page.Data)-1].ID

	// Committed after the read, before the stream opens.
	e.admin("POST", "/admin/v1/threads/gap/preferences", map[string]any{"title": "Between"}, 201, nil)
	s := e.openStream(e.srv.URL, "gap", "", itoa(read))
	e.admin("POST", "/admin/v1/threads/gap/preferences", map[string]any{"title": "After"}, 201, nil)
	id, ev := s.next()
	require.Equal(t, itoa(read+1), id, "the change committed between the read and the stream's open")
	require.Equal(t, "preference_added", ev.Kind)
	require.Contains(t, string(ev.After), `"Between"`)
	id, ev = s.next()
	require.Equal(t, itoa(read+2), id)
	require.Contains(t, string(ev.After), `"After"`)

	// A reconnect carries both: it resumes after Last-Event-ID.
	s = e.openStream(e.srv.URL, "gap", itoa(read+1), itoa(read))
	id, _ = s.next()
	require.Equal(t, itoa(read+2), id, "after Last-Event-ID, not after ?after=")

	for _, bad := range []string{"x", "-1", "1.5"} {
		var out struct{ Error apierr.Error }
		e.admin("GET", "/admin/v1/threads/gap/events/stream?after="+bad, nil, 400, &out)
		require.Equal(t, "after", out.Error.Param, bad)
	}
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

// TestPanelSessions: who sees what (docs/spec.md §13). The admin token sees every thread; a client key
// that client's; a signed link one thread, until it expires. Writes with a session need the CSRF
// token and the panel's origin. Failed sign-ins are throttled. The session is a signed cookie,
// valid on another replica, never the token.
func TestPanelSessions(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret,bob=sk-bob-secret")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys = keys; o.UpstreamAPIKey = "sk-up" })
	for _, th := range []string{"alice~a1", "alice~a2", "bob~b1", "plain"} {
		e.admin("PUT", "/admin/v1/threads/"+th+"/objective", map[string]any{"text": "goal of " + th}, 200, nil)
	}
	threadsOf := func(c *panelClient) []string {
		code, body := c.do("GET", "/admin/v1/threads", "", nil)
		require.Equal(t, 200, code, body)
		var p page[tools.Thread]
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		var ids []string
		for _, th := range p.Data {
			ids = append(ids, th.ID)
		}
		return ids
	}

	// No session: 401, and the page itself is served with its security headers.
	anon := e.panelClient()
	code, _ := anon.do("GET", "/admin/v1/threads", "", nil)
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
	require.Equal(t, 200, admin.signIn(adminToken))
	require.ElementsMatch(t, []string{"alice~a1", "alice~a2", "bob~b1", "plain"}, threadsOf(admin))
	for _, c := range admin.http.Jar.Cookies(mustURL(t, e.srv.URL)) {
		require.NotContains(t, c.Value, adminToken, "the cookie never holds the token")
	}

	alice := e.panelClient()
	require.Equal(t, 200, alice.signIn("sk-alice-secret"))
	require.ElementsMatch(t, []string{"alice~a1", "alice~a2"}, threadsOf(alice))
	code, _ = alice.do("GET", "/admin/v1/threads/bob~b1", "", nil)
	require.Equal(t, 404, code, "another client's thread does not exist for alice")
	code, _ = alice.write("PUT", "/admin/v1/threads/bob~b1/objective", `{"text":"mine now"}`)
	require.Equal(t, 404, code)
	code, body := alice.write("POST", "/admin/v1/threads/alice~a1/preferences", `{"title":"Alice's"}`)
	require.Equal(t, 201, code, body)

	// Writes without the CSRF token, from another origin or another site: refused, nothing written.
	for _, h := range []map[string]string{
		{"Origin": e.srv.URL},
		{"X-CSRF-Token": alice.csrf, "Origin": "https://evil.example"},
		{"X-CSRF-Token": alice.csrf, "Sec-Fetch-Site": "cross-site"},
		{"X-CSRF-Token": "forged", "Origin": e.srv.URL},
	} {
		code, body := alice.do("POST", "/admin/v1/threads/alice~a1/preferences", `{"title":"Forged"}`, h)
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
	code, body = visitor.do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "/ui/#/t/plain")
	code, body = visitor.do("GET", "/ui/session", "", nil)
	require.Equal(t, 200, code)
	var ses struct{ Scope, CSRF string }
	require.NoError(t, json.Unmarshal([]byte(body), &ses))
	require.Equal(t, "thread:plain", ses.Scope)
	visitor.csrf = ses.CSRF
	require.Equal(t, []string{"plain"}, threadsOf(visitor))
	code, _ = visitor.do("GET", "/admin/v1/threads/alice~a1", "", nil)
	require.Equal(t, 404, code)
	code, _ = visitor.write("POST", "/admin/v1/threads/plain/preferences", `{"title":"From the link"}`)
	require.Equal(t, 201, code)
	code, _ = visitor.write("POST", "/admin/v1/threads/plain/links", `{"ttl_seconds":2592000}`)
	require.Equal(t, 403, code, "a link's holder cannot outlive the link with a new one")
	time.Sleep(time.Until(l.ExpiresAt) + 100*time.Millisecond)
	code, _ = visitor.do("GET", "/admin/v1/threads/plain", "", nil)
	require.Equal(t, 401, code, "the session ends with the link")
	late := e.panelClient()
	code, _ = late.do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 403, code, "an expired link opens nothing")
	code, _ = late.do("GET", "/ui/link?token="+url.QueryEscape(strings.Replace(strings.TrimPrefix(l.URL, e.srv.URL+"/ui/link?token="), "l.", "s.", 1)), "", nil)
	require.Equal(t, 403, code, "a link is not a session")

	// The session is valid on another replica with the same admin token.
	other := setupWithPool(t, e.pool, func(o *Options) { o.ClientKeys = keys; o.UpstreamAPIKey = "sk-up" })
	admin.base = other.srv.URL
	admin.http.Jar.SetCookies(mustURL(t, other.srv.URL), admin.http.Jar.Cookies(mustURL(t, e.srv.URL)))
	require.Len(t, threadsOf(admin), 4)

	// Sign-out ends it; failed sign-ins are throttled.
	code, _ = alice.write("DELETE", "/ui/session", "")
	require.Equal(t, 204, code)
	code, _ = alice.do("GET", "/admin/v1/threads", "", nil)
	require.Equal(t, 401, code)
	for range auth.MaxFailures {
		require.Equal(t, 401, anon.signIn("wrong"))
	}
	require.Equal(t, 429, anon.signIn("wrong"))
	require.Equal(t, 200, anon.signIn(adminToken), "the right token is served")

	// UI=off: no panel, and links are refused.
	off := setupWithPool(t, e.pool, func(o *Options) { o.DisablePanel = true })
	resp, err = http.Get(off.srv.URL + "/ui/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 404, resp.StatusCode)
	off.admin("POST", "/admin/v1/threads/plain/links", nil, 409, nil)
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
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
	code, _ := visitor.do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 200, code)
	code, _ = visitor.do("GET", "/admin/v1/threads/shared", "", nil)
	require.Equal(t, 200, code)
	code, _ = visitor.do("GET", "/admin/v1/threads/shared/links", "", nil)
	require.Equal(t, 403, code, "a link's holder lists no links")
	code, _ = visitor.do("DELETE", fmt.Sprintf("/admin/v1/threads/shared/links/%d", l.ID), "", map[string]string{"X-CSRF-Token": visitor.csrf})
	require.Equal(t, 403, code)

	req, err := http.NewRequest("GET", e.srv.URL+"/admin/v1/threads/shared/events/stream", nil)
	require.NoError(t, err)
	stream, err := visitor.http.Do(req)
	require.NoError(t, err)
	defer stream.Body.Close()
	require.Equal(t, 200, stream.StatusCode)

	e.admin("DELETE", fmt.Sprintf("/admin/v1/threads/shared/links/%d", l.ID), nil, 204, nil)
	code, _ = visitor.do("GET", "/admin/v1/threads/shared", "", nil)
	require.Equal(t, 401, code, "the session ends with its link")
	code, _ = e.panelClient().do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 403, code, "a revoked link opens nothing")
	// The stream ends at its next wake-up.
	e.admin("PUT", "/admin/v1/threads/shared/objective", map[string]any{"text": "Changed"}, 200, nil)
	_, err = io.ReadAll(stream.Body)
	require.NoError(t, err, "the stream ended")
}
