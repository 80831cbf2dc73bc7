package main

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/demo"
)

// codexExec runs `codex exec` (the pinned Codex CLI 0.171) with a custom provider at baseURL and
// the demo model, in a home and folder of its own unless given, and returns what it printed and
// how long it took.
func codexExec(t *testing.T, home, work, baseURL string, websockets bool, args ...string) (string, time.Duration) {
	t.Helper()
	if home == "" {
		home, work = t.TempDir(), t.TempDir()
	}
	all := append([]string{"exec", "--skip-git-repo-check", "-m", demo.ModelName}, codexProvider(baseURL, websockets)...)
	start := time.Now()
	out := runAgent(t, home, work, []string{"WSPROXY_KEY=any"}, "codex", append(all, args...)...)
	return out, time.Since(start)
}

// upgradeCounter is a reverse proxy in front of target that counts the WebSocket upgrades it
// forwards.
func upgradeCounter(t *testing.T, target string) (*httptest.Server, *atomic.Int32) {
	u, err := url.Parse(target)
	require.NoError(t, err)
	var upgrades atomic.Int32
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			upgrades.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &upgrades
}

// TestCodexWebSocketFallsBackAtOnce: Codex CLI with supports_websockets = true through wsproxy
// tries one WebSocket upgrade, gets 426 and runs its turn over HTTP at once: the answer comes as
// it does with WebSockets off (both times printed), the thread records what the user said.
func TestCodexWebSocketFallsBackAtOnce(t *testing.T) {
	t.Parallel()
	m, logs := MustRunMain(t, nil)
	front, upgrades := upgradeCounter(t, m.URL)

	off, tOff := codexExec(t, "", "", front.URL+"/threads/codex-http/v1", false, "My goal is a tidy repository. I prefer tabs.")
	require.Zero(t, upgrades.Load(), "a custom provider without supports_websockets never upgrades")
	on, tOn := codexExec(t, "", "", front.URL+"/threads/codex-ws/v1", true, "My goal is a tidy repository. I prefer tabs.")
	t.Logf("codex exec: supports_websockets off %v, on %v (difference %v)", tOff.Round(time.Millisecond), tOn.Round(time.Millisecond), (tOn - tOff).Round(time.Millisecond))

	require.Equal(t, int32(1), upgrades.Load(), "one upgrade, refused, and no retry of it")
	for _, out := range []string{off, on} {
		require.Contains(t, out, demo.Prefix, "the demo answered:\n%s\nproxy logs:\n%s", out, logs.String())
		require.Contains(t, out, "objective set: A tidy repository")
		require.NotContains(t, out, "Reconnecting")
		require.NotContains(t, out, "Falling back from WebSockets")
	}
	for _, thread := range []string{"codex-http", "codex-ws"} {
		var ws adminWorkspace
		require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+thread, "", &ws))
		require.Equal(t, "A tidy repository", ws.Objective.Text, thread)
		require.Len(t, ws.Preferences, 1, thread)
	}
}

var codexSession = regexp.MustCompile(`session id: ([0-9a-f-]{36})`)

// TestCodexSessionPicksItsThread: with THREAD_HEADER=session-id (the header Codex CLI 0.171 sends
// on every request: its session's id, proxy/testdata/agents/README.md), a Codex session at
// wsproxy's plain base URL gets a thread of its own, named by its session id; resuming the
// session continues that thread (its block seen), a new session starts another.
func TestCodexSessionPicksItsThread(t *testing.T) {
	t.Parallel()
	m, logs := MustRunMain(t, func(c *Config) { c.ThreadHeader = "session-id" })
	home, work := t.TempDir(), t.TempDir()

	out, _ := codexExec(t, home, work, m.URL+"/v1", false, "My goal is a tidy repository. I prefer tabs.")
	require.Contains(t, out, "objective set: A tidy repository", "proxy logs:\n%s", logs.String())
	id := codexSession.FindStringSubmatch(out)
	require.NotNil(t, id, out)
	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+id[1], "", &ws), "the session's id names its thread")
	require.Equal(t, "A tidy repository", ws.Objective.Text)

	out, _ = codexExec(t, home, work, m.URL+"/v1", false, "resume", "--last", "What do you know about my project?")
	require.Equal(t, id[1], codexSession.FindStringSubmatch(out)[1])
	require.Contains(t, out, "Your objective: A tidy repository", "the resumed session sees its block")

	out, _ = codexExec(t, "", "", m.URL+"/v1", false, "What do you know about my project?")
	other := codexSession.FindStringSubmatch(out)[1]
	require.NotEqual(t, id[1], other)
	require.NotContains(t, out, "Your objective: A tidy repository", "a new session is a new thread")
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+other, "", &ws))
}
