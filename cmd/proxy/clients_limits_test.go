package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

// usageView is a client's usage as the admin REST shows it.
type usageView struct {
	RequestsThisMinute int64 `json:"requests_this_minute"`
	RequestsToday      int64 `json:"requests_today"`
	TokensToday        int64 `json:"tokens_today"`
}

// limitedClient is a client as the admin REST shows it, with what this test reads of it.
type limitedClient struct {
	Name   string
	Limits struct {
		RequestsPerMinute *int32 `json:"requests_per_minute"`
	}
	Usage *usageView
	Key   string
}

// TestClientLimitsFromTheTable (docs/spec.md §20): a client's limits set over the admin REST on
// one replica hold on both, with no restart: past requests_per_minute a thread turn is a 429 in
// its route's wire format with Retry-After, on the other replica too once the usage synced, and
// nothing is written; lifting the limit on one replica admits again on the other; the client
// reads its limits and usage (GET /admin/v1/me), the admin every client's usage (the listing);
// a limit of 0 is refused.
//
// The windows are UTC minutes: a sequence that a minute's end crossed proves nothing (the counts
// start again), so it is run again with a new client until one minute holds it all.
func TestClientLimitsFromTheTable(t *testing.T) {
	t.Parallel()
	const adminToken = "limits-admin-token-0123456789"
	dbURL := dbtest.SchemaURL(t)
	var a, b *Main
	var wg sync.WaitGroup
	wg.Go(func() { a, _ = MustRunMain(t, func(c *Config) { c.DatabaseURL, c.AdminToken = dbURL, adminToken }) })
	wg.Go(func() { b, _ = MustRunMain(t, func(c *Config) { c.DatabaseURL, c.AdminToken = dbURL, adminToken }) })
	wg.Wait()
	rec := &recorder{}
	minute := func() time.Time { return time.Now().UTC().Truncate(time.Minute) }

	chat := func(m *Main, key string) (int, string, http.Header) {
		return rec.call(t, "POST", m.URL+"/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"hello"}]}`,
			map[string]string{"Content-Type": "application/json", "X-Thread-Id": "t", "Authorization": "Bearer " + key})
	}
	messages := func(m *Main, key string) (int, string, http.Header) {
		return rec.call(t, "POST", m.URL+"/v1/messages", `{"model":"demo","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`,
			map[string]string{"Content-Type": "application/json", "X-Thread-Id": "t", "X-Api-Key": key, "Anthropic-Version": "2023-06-01"})
	}
	client := func(m *Main, name string) limitedClient {
		var c limitedClient
		require.Equal(t, 200, rec.admin(t, m, adminToken, "GET", "/admin/v1/clients/"+name, "", &c))
		return c
	}
	retryAfter := func(h http.Header) int {
		secs, err := strconv.Atoi(h.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q", h.Get("Retry-After"))
		return secs
	}

	// attempt runs the sequence for a new client name; false when a minute's end crossed it.
	attempt := func(name string) bool {
		var created limitedClient
		require.Equal(t, 201, rec.admin(t, a, adminToken, "POST", "/admin/v1/clients", `{"name":"`+name+`","limits":{"requests_per_minute":2}}`, &created))
		require.Equal(t, int32(2), *created.Limits.RequestsPerMinute)
		require.Equal(t, &usageView{}, created.Usage, "a new client's usage: zero, not null")
		key := created.Key
		// B holds the key, and its limits with it, once its key is served there (a request of
		// the admin REST, which counts nothing).
		eventually(t, "the key on B", func() bool { return rec.admin(t, b, key, "GET", "/admin/v1/me", "", nil) == 200 })

		start := minute()
		// held reports whether the minute is still start's; a check that failed within it is a
		// defect.
		held := func() bool { return minute().Equal(start) }
		expect := func(ok bool, format string, args ...any) bool {
			if !ok && held() {
				require.Failf(t, "within one minute", format, args...)
			}
			return ok
		}
		// until waits for cond, or for the minute to end.
		until := func(what string, cond func() bool) bool {
			eventually(t, what, func() bool { return !held() || cond() })
			return held()
		}

		// On A: two turns, then the third of the minute is a 429 in the chat API's shape.
		for i := range 2 {
			code, body, _ := chat(a, key)
			if !expect(code == 200, "turn %d on A: %d %s", i+1, code, body) {
				return false
			}
		}
		code, body, h := chat(a, key)
		if !expect(code == 429, "the third turn on A: %d %s", code, body) {
			return false
		}
		var openAI struct {
			Error struct{ Type, Code, Message string }
		}
		require.NoError(t, json.Unmarshal([]byte(body), &openAI), body)
		require.Equal(t, "rate_limit_error", openAI.Error.Type, body)
		require.Equal(t, "requests_per_minute_exceeded", openAI.Error.Code, body)
		require.NotEmpty(t, openAI.Error.Message)
		secs := retryAfter(h)
		require.True(t, secs >= 1 && secs <= 60, "Retry-After %d: until the minute ends", secs)

		// B learns A's counts at its next sync; then the client reads them with its key there.
		if !until("A's two requests counted on B", func() bool {
			u := client(b, name).Usage
			return u != nil && u.RequestsThisMinute >= 2
		}) {
			return false
		}
		var me limitedClient
		require.Equal(t, 200, rec.admin(t, b, key, "GET", "/admin/v1/me", "", &me))
		require.Equal(t, name, me.Name)
		require.Equal(t, int32(2), *me.Limits.RequestsPerMinute)
		require.NotNil(t, me.Usage, "GET /admin/v1/me shows the usage")
		if !expect(*me.Usage == usageView{RequestsThisMinute: 2, RequestsToday: 2, TokensToday: me.Usage.TokensToday},
			"the client's usage on B: %+v", *me.Usage) {
			return false
		}

		// On B the limit holds too: a 429 in the Messages API's shape.
		code, body, h = messages(b, key)
		if !expect(code == 429, "a turn on B past the limit: %d %s", code, body) {
			return false
		}
		var anthropic struct {
			Type  string
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.Unmarshal([]byte(body), &anthropic), body)
		require.Equal(t, "error", anthropic.Type, body)
		require.Equal(t, "rate_limit_error", anthropic.Error.Type, body)
		require.NotEmpty(t, anthropic.Error.Message)
		secs = retryAfter(h)
		require.True(t, secs >= 1 && secs <= 60, "Retry-After %d: until the minute ends", secs)
		var turns int
		require.NoError(t, a.pool.QueryRow(context.Background(), `SELECT turns FROM threads WHERE id = $1`, name+"~t").Scan(&turns))
		require.Equal(t, 2, turns, "the refused turns wrote nothing")

		// No limit, set on A: A admits at once, B within its next read of the clients.
		var patched limitedClient
		require.Equal(t, 200, rec.admin(t, a, adminToken, "PATCH", "/admin/v1/clients/"+name, `{"limits":{"requests_per_minute":null}}`, &patched))
		require.Nil(t, patched.Limits.RequestsPerMinute)
		code, body, _ = chat(a, key)
		if !expect(code == 200, "a turn on A once the limit is lifted: %d %s", code, body) {
			return false
		}
		if !until("B admits once the limit is lifted", func() bool {
			code, _, _ := messages(b, key)
			return code == 200
		}) {
			return false
		}

		// The listing shows every replica's count: three turns admitted on A, one on B.
		var list struct{ Data []limitedClient }
		if !until("the usage of both replicas in the listing", func() bool {
			require.Equal(t, 200, rec.admin(t, a, adminToken, "GET", "/admin/v1/clients", "", &list))
			for _, c := range list.Data {
				if c.Name == name {
					return c.Usage != nil && c.Usage.RequestsThisMinute == 4 && c.Usage.TokensToday > 0
				}
			}
			return false
		}) {
			return false
		}
		for _, c := range list.Data {
			if c.Name == name {
				require.Equal(t, int64(4), c.Usage.RequestsToday)
			}
		}
		return held()
	}
	done := false
	for i := 1; i <= 3 && !done; i++ {
		done = attempt("lim" + itoa(int64(i)))
	}
	require.True(t, done, "three sequences each crossed a minute's end")

	// A limit of 0 is refused, at creation and by a change.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/admin/v1/clients", `{"name":"zero","limits":{"requests_per_minute":0}}`},
		{"PATCH", "/admin/v1/clients/lim1", `{"limits":{"requests_per_minute":0}}`},
	} {
		code, body, _ := rec.call(t, c.method, a.URL+c.path, c.body,
			map[string]string{"Authorization": "Bearer " + adminToken, "Content-Type": "application/json"})
		require.Equal(t, 400, code, "%s %s: %s", c.method, c.path, body)
		var e struct{ Error struct{ Code, Param string } }
		require.NoError(t, json.Unmarshal([]byte(body), &e), body)
		require.Equal(t, "invalid_value", e.Error.Code, body)
		require.Equal(t, "limits.requests_per_minute", e.Error.Param, body)
	}
	require.Equal(t, 404, rec.admin(t, a, adminToken, "GET", "/admin/v1/clients/zero", "", nil), "the refused client was not made")
}
