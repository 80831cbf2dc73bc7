package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

// recorder keeps every body the clients' tests read, for the leak check.
type recorder struct {
	mu     sync.Mutex
	bodies []string
}

func (rec *recorder) add(s string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.bodies = append(rec.bodies, s)
}

// refused reports whether the last answer, of status code, refused its credential: 401 or 403,
// or the 429 of the failed-authentication throttle (auth.MaxFailures failures from one address
// within a minute), which a test that polls for a refusal on a busy machine runs into.
func (rec *recorder) refused(code int) bool {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	last := ""
	if n := len(rec.bodies); n > 0 {
		last = rec.bodies[n-1]
	}
	return code == 401 || code == 403 || (code == 429 && strings.Contains(last, `"too_many_failures"`))
}

func (rec *recorder) all() string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return strings.Join(rec.bodies, "\n")
}

// call sends a request to base+path with the headers given and returns its status and body.
func (rec *recorder) call(t *testing.T, method, url, body string, header map[string]string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	rec.add(string(b))
	return resp.StatusCode, string(b), resp.Header
}

// turn is a thread turn of the demo model with key (none: "") on m.
func (rec *recorder) turn(t *testing.T, m *Main, key, thread string) int {
	h := map[string]string{"Content-Type": "application/json", "X-Thread-Id": thread}
	if key != "" {
		h["Authorization"] = "Bearer " + key
	}
	code, _, _ := rec.call(t, "POST", m.URL+"/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"hello"}]}`, h)
	return code
}

func (rec *recorder) mcp(t *testing.T, m *Main, token string) int {
	code, _, _ := rec.call(t, "POST", m.URL+"/mcp",
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`,
		map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream", "Authorization": "Bearer " + token})
	return code
}

// admin calls the admin REST of m with token.
func (rec *recorder) admin(t *testing.T, m *Main, token, method, path, body string, out any) int {
	t.Helper()
	code, b, _ := rec.call(t, method, m.URL+path, body, map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"})
	if out != nil && code < 300 {
		require.NoError(t, json.Unmarshal([]byte(b), out), b)
	}
	return code
}

// eventually waits, with a generous deadline for a busy machine, until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, 10*time.Millisecond, what)
}

// TestClientsAtRuntime (docs/spec.md §20): a client created over the admin REST on one replica
// works on the next request on both, without a restart; only its key's hash is stored; a second
// key works beside the first; revoking the first ends it and its panel session, links and MCP
// tokens on both replicas; a deleted client's threads stay for the admin. And no key, hash or
// prefix past 8 characters is in a log line, /metrics, an error body or an event.
func TestClientsAtRuntime(t *testing.T) {
	t.Parallel()
	const adminToken = "clients-admin-token-0123456789"
	dbURL := dbtest.SchemaURL(t)
	var a, b *Main
	var la, lb *syncBuffer
	var wg sync.WaitGroup
	wg.Go(func() {
		a, la = MustRunMain(t, func(c *Config) { c.DatabaseURL, c.AdminToken = dbURL, adminToken })
	})
	wg.Go(func() {
		b, lb = MustRunMain(t, func(c *Config) { c.DatabaseURL, c.AdminToken = dbURL, adminToken })
	})
	wg.Wait()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica %s's log:\n%s\nreplica %s's log:\n%s", a.URL, la.String(), b.URL, lb.String())
		}
	})
	rec := &recorder{}
	both := []*Main{a, b}
	require.Equal(t, 200, rec.turn(t, a, "", "open"), "no client yet: no key needed")

	var created struct {
		Name   string
		Key    string
		Limits struct {
			RequestsPerMinute *int32 `json:"requests_per_minute"`
		}
		Keys []struct {
			ID     int64
			Prefix string
		}
	}
	require.Equal(t, 201, rec.admin(t, a, adminToken, "POST", "/admin/v1/clients", `{"name":"alice","limits":{"requests_per_minute":100}}`, &created))
	key1 := created.Key
	require.True(t, strings.HasPrefix(key1, "wsp_") && len(key1) >= 4+43, "32 random bytes, base64url, after wsp_")
	require.Len(t, created.Keys, 1)
	require.Equal(t, key1[:8], created.Keys[0].Prefix)
	require.Equal(t, int32(100), *created.Limits.RequestsPerMinute)
	id1 := created.Keys[0].ID
	require.Equal(t, 409, rec.admin(t, b, adminToken, "POST", "/admin/v1/clients", `{"name":"alice"}`, nil))
	require.Equal(t, 400, rec.admin(t, b, adminToken, "POST", "/admin/v1/clients", `{"name":"al ice"}`, nil))

	// Only the hash is stored.
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var hash []byte
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT hash FROM client_keys WHERE client = 'alice'`).Scan(&hash))
	sum := sha256.Sum256([]byte(key1))
	require.Equal(t, sum[:], hash)
	var rows string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(string_agg(j, E'\n'), '') FROM (SELECT row_to_json(k)::text AS j FROM client_keys k UNION ALL SELECT row_to_json(c)::text FROM clients c) x`).Scan(&rows))
	require.NotContains(t, rows, key1)
	require.NotContains(t, rows, key1[:9])

	// The next request on both replicas, without a restart; no key is now refused everywhere.
	for _, m := range both {
		eventually(t, "the new key on "+m.URL, func() bool { return rec.turn(t, m, key1, "t1") == 200 })
		eventually(t, "no key refused on "+m.URL, func() bool { return rec.refused(rec.turn(t, m, "", "open")) })
	}

	// A second key works beside the first.
	var second struct {
		ID     int64
		Prefix string
		Key    string
	}
	require.Equal(t, 201, rec.admin(t, b, adminToken, "POST", "/admin/v1/clients/alice/keys", "", &second))
	key2 := second.Key
	require.NotEqual(t, key1, key2)
	for _, m := range both {
		eventually(t, "the second key on "+m.URL, func() bool { return rec.turn(t, m, key2, "t1") == 200 })
		require.Equal(t, 200, rec.turn(t, m, key1, "t1"), "the first still works")
	}

	// What key1 made: a panel session, a panel link and an MCP token of alice's thread.
	code, body, h := rec.call(t, "POST", a.URL+"/ui/session", `{"token":"`+key1+`"}`, map[string]string{"Content-Type": "application/json"})
	require.Equal(t, 200, code, body)
	cookie := strings.Split(h.Get("Set-Cookie"), ";")[0]
	var link, token struct{ URL, Token string }
	require.Equal(t, 201, rec.admin(t, a, key1, "POST", "/admin/v1/threads/alice~t1/links", `{"kind":"panel"}`, &link))
	require.Equal(t, 201, rec.admin(t, a, key1, "POST", "/admin/v1/threads/alice~t1/links", `{"kind":"mcp"}`, &token))
	linkPath := strings.TrimPrefix(link.URL, a.URL)
	session := func(m *Main) int {
		code, _, _ := rec.call(t, "GET", m.URL+"/admin/v1/threads", "", map[string]string{"Cookie": cookie})
		return code
	}
	linkCode := func(m *Main) int {
		code, _, _ := rec.call(t, "GET", m.URL+linkPath, "", nil)
		return code
	}
	for _, m := range both {
		require.Equal(t, 200, session(m), "alice's session on %s", m.URL)
		require.Less(t, linkCode(m), 400, "alice's link on %s", m.URL)
		require.Equal(t, 200, rec.mcp(t, m, token.Token), "alice's MCP token on %s", m.URL)
	}

	// The client reads itself; the clients are the admin's alone.
	var me struct {
		Name   string
		Limits struct {
			RequestsPerMinute *int32 `json:"requests_per_minute"`
		}
	}
	require.Equal(t, 200, rec.admin(t, b, key2, "GET", "/admin/v1/me", "", &me))
	require.Equal(t, "alice", me.Name)
	require.Equal(t, int32(100), *me.Limits.RequestsPerMinute)
	require.Equal(t, 403, rec.admin(t, b, key2, "GET", "/admin/v1/clients", "", nil))
	require.Equal(t, 403, rec.admin(t, b, key2, "POST", "/admin/v1/clients/alice/keys", "", nil))
	code, _, _ = rec.call(t, "GET", a.URL+"/admin/v1/clients", "", map[string]string{"Cookie": cookie})
	require.Equal(t, 403, code, "alice's panel session")
	var patched struct {
		Limits struct {
			RequestsPerMinute *int32 `json:"requests_per_minute"`
			TokensPerDay      *int64 `json:"tokens_per_day"`
		}
	}
	require.Equal(t, 200, rec.admin(t, a, adminToken, "PATCH", "/admin/v1/clients/alice", `{"limits":{"requests_per_minute":null,"tokens_per_day":5000}}`, &patched))
	require.Nil(t, patched.Limits.RequestsPerMinute)
	require.Equal(t, int64(5000), *patched.Limits.TokensPerDay)
	require.Equal(t, 400, rec.admin(t, a, adminToken, "PATCH", "/admin/v1/clients/alice", `{"limits":{"requests_per_minute":-1}}`, nil))

	// Revoking the first key ends it and what it made, on both replicas.
	require.Equal(t, 204, rec.admin(t, a, adminToken, "DELETE", "/admin/v1/clients/alice/keys/"+itoa(id1), "", nil))
	require.Equal(t, 404, rec.admin(t, a, adminToken, "DELETE", "/admin/v1/clients/alice/keys/"+itoa(id1), "", nil))
	for _, m := range []*Main{b, a} {
		eventually(t, "the first key refused on "+m.URL, func() bool { return rec.refused(rec.turn(t, m, key1, "t1")) })
		eventually(t, "alice's session ended on "+m.URL, func() bool { return rec.refused(session(m)) })
		eventually(t, "alice's link ended on "+m.URL, func() bool { return rec.refused(linkCode(m)) })
		eventually(t, "alice's MCP token ended on "+m.URL, func() bool { return rec.refused(rec.mcp(t, m, token.Token)) })
		require.Equal(t, 200, rec.turn(t, m, key2, "t1"), "the second key still works")
	}
	var list struct {
		Data []struct {
			Name     string
			LastUsed *time.Time `json:"last_used_at"`
			Keys     []struct{ ID int64 }
		}
	}
	require.Equal(t, 200, rec.admin(t, a, adminToken, "GET", "/admin/v1/clients", "", &list))
	require.Len(t, list.Data, 1)
	require.Len(t, list.Data[0].Keys, 1)
	require.Equal(t, second.ID, list.Data[0].Keys[0].ID)
	eventually(t, "the last use noted (each replica notes it every 5 s)", func() bool {
		return rec.admin(t, a, adminToken, "GET", "/admin/v1/clients", "", &list) == 200 && list.Data[0].LastUsed != nil
	})

	// A deleted client's keys end on both replicas; its threads stay, for the admin.
	require.Equal(t, 204, rec.admin(t, b, adminToken, "DELETE", "/admin/v1/clients/alice", "", nil))
	for _, m := range both {
		eventually(t, "the deleted client's key refused on "+m.URL, func() bool { return rec.refused(rec.turn(t, m, key2, "t1")) })
		require.True(t, rec.refused(rec.turn(t, m, "", "open")), "keys stay required once a client was made")
	}
	require.Equal(t, 200, rec.admin(t, a, adminToken, "GET", "/admin/v1/threads/alice~t1", "", nil))
	require.Equal(t, 404, rec.admin(t, a, adminToken, "GET", "/admin/v1/clients/alice", "", nil))
	var events any
	require.Equal(t, 200, rec.admin(t, a, adminToken, "GET", "/admin/v1/threads/alice~t1/events", "", &events))

	// Keys never leak: the logs, /metrics, the error bodies and the events hold none of them.
	for _, m := range both {
		code, _, _ := rec.call(t, "GET", m.URL+"/metrics", "", nil)
		require.Equal(t, 200, code)
	}
	var seen strings.Builder
	for _, m := range both {
		code, body, _ := rec.call(t, "GET", m.URL+"/admin/v1/threads/alice~t1/events", "", map[string]string{"Authorization": "Bearer " + adminToken})
		require.Equal(t, 200, code)
		seen.WriteString(body)
	}
	out := la.String() + lb.String() + rec.all() + seen.String()
	for _, k := range []string{key1, key2} {
		h := sha256.Sum256([]byte(k))
		for _, secret := range []string{k[:9], k[4:], hex.EncodeToString(h[:]), base64.StdEncoding.EncodeToString(h[:]),
			base64.RawURLEncoding.EncodeToString(h[:])} {
			// The 201 answers that made the keys held them, by design: checked apart.
			require.NotContains(t, strings.ReplaceAll(out, `"key":"`+k+`"`, ""), secret, "a key, its hash or more than its prefix leaked")
		}
	}
	require.Contains(t, rec.all(), `"key":"`+key1+`"`, "the key is shown once, in the answer that made it")
}

// TestClientKeysSeed (docs/spec.md §20): CLIENT_KEYS seeds the clients' table at start, an entry
// removed from it is revoked at the next start, and Reseed (SIGHUP) re-reads CLIENT_KEYS=@FILE
// while serving, logging what changed by name only.
func TestClientKeysSeed(t *testing.T) {
	t.Parallel()
	const (
		aliceKey = "seed-alice-key-0123456789"
		bobKey   = "seed-bob-key-0123456789ab"
		carolKey = "seed-carol-key-0123456789"
	)
	dbURL := dbtest.SchemaURL(t)
	file := filepath.Join(t.TempDir(), "keys")
	write := func(spec string) { require.NoError(t, os.WriteFile(file, []byte(spec), 0o600)) }
	rec := &recorder{}
	start := func() (*Main, *syncBuffer) {
		return MustRunMain(t, func(c *Config) {
			c.DatabaseURL, c.ClientKeys, c.UpstreamAPIKey = dbURL, "@"+file, "sk-upstream-0123456789"
		})
	}
	write("alice=" + aliceKey + "\nbob=" + bobKey)
	m, _ := start()
	require.Equal(t, 200, rec.turn(t, m, aliceKey, "t1"))
	require.Equal(t, 200, rec.turn(t, m, bobKey, "t1"))
	var seeded bool
	require.NoError(t, m.pool.QueryRow(context.Background(), `SELECT bool_and(seeded) FROM client_keys`).Scan(&seeded))
	require.True(t, seeded)
	require.NoError(t, m.Close())

	write("alice=" + aliceKey)
	m, logs := start()
	require.Equal(t, 200, rec.turn(t, m, aliceKey, "t1"))
	require.Equal(t, 401, rec.turn(t, m, bobKey, "t1"), "removed from CLIENT_KEYS: revoked at the next start")
	require.Contains(t, lineOf(t, logs.String(), "keys no longer listed are revoked"), "bob")
	require.Equal(t, 200, rec.admin(t, m, m.AdminToken, "GET", "/admin/v1/threads/bob~t1", "", nil), "bob's thread stays")

	// SIGHUP's reseed: carol added, alice revoked, while serving.
	write("carol=" + carolKey)
	m.Reseed(context.Background())
	require.Equal(t, 200, rec.turn(t, m, carolKey, "t1"))
	require.Equal(t, 401, rec.turn(t, m, aliceKey, "t1"))
	line := lineOf(t, logs.String(), "SIGHUP: CLIENT_KEYS re-read")
	require.Contains(t, line, "carol")
	// A file that does not parse changes nothing.
	write("carol")
	m.Reseed(context.Background())
	require.Contains(t, logs.String(), "SIGHUP: CLIENT_KEYS not reloaded")
	require.Equal(t, 200, rec.turn(t, m, carolKey, "t1"))
	for _, k := range []string{aliceKey, bobKey, carolKey} {
		require.NotContains(t, logs.String(), k)
	}
}

// TestSIGHUPReloadsClientKeys: kill -HUP does not end wsproxy (it ended it at once, without a
// drain); it re-reads CLIENT_KEYS=@FILE, and the new key works.
func TestSIGHUPReloadsClientKeys(t *testing.T) {
	t.Parallel()
	bin := wsproxyBinary(t)
	file := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(file, []byte("alice=hup-alice-key-0123456789\n"), 0o600))
	r := startReplica(t, bin, "DATABASE_URL="+dbtest.SchemaURL(t), "UPSTREAM_BASE_URL=demo", "CLIENT_KEYS=@"+file, "LOG_LEVEL=info")
	require.NoError(t, os.WriteFile(file, []byte("alice=hup-alice-key-0123456789\nbob=hup-bob-key-0123456789ab\n"), 0o600))
	require.NoError(t, r.cmd.Process.Signal(syscall.SIGHUP))
	eventually(t, "the reload logged, or the process ended", func() bool {
		select {
		case <-r.done:
			return true
		default:
			return strings.Contains(r.out.String(), "SIGHUP: CLIENT_KEYS re-read")
		}
	})
	select {
	case <-r.done:
		t.Fatalf("SIGHUP ended wsproxy:\n%s", r.out.String())
	default:
	}
	req, _ := http.NewRequest("POST", "http://"+r.addr+"/v1/chat/completions", strings.NewReader(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer hup-bob-key-0123456789ab")
	req.Header.Set("X-Thread-Id", "t1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "bob's key, added by the reload")
	require.NotContains(t, r.out.String(), "hup-bob-key")
}

// TestClientKeysSeedAtOnce: replicas that start at once with the same CLIENT_KEYS seed the table
// one after the other: every one starts, and every key works on each.
func TestClientKeysSeedAtOnce(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.SchemaURL(t)
	var spec strings.Builder
	for i := range 50 {
		spec.WriteString("c" + itoa(int64(i)) + "=at-once-key-0123456789-" + itoa(int64(i)) + "\n")
	}
	file := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(file, []byte(spec.String()), 0o600))
	var replicas [3]*Main
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			replicas[i], _ = MustRunMain(t, func(c *Config) {
				c.DatabaseURL, c.ClientKeys, c.UpstreamAPIKey = dbURL, "@"+file, "sk-upstream-0123456789"
			})
		})
	}
	wg.Wait()
	rec := &recorder{}
	for _, m := range replicas {
		require.Equal(t, 200, rec.turn(t, m, "at-once-key-0123456789-49", "t1"))
	}
	var n int
	require.NoError(t, replicas[0].pool.QueryRow(context.Background(), `SELECT count(*) FROM client_keys WHERE revoked_at IS NULL`).Scan(&n))
	require.Equal(t, 50, n)
}
