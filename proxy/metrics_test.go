package proxy

import (
	"io"
	"net/http"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
)

func scrape(t *testing.T, e *env) string {
	t.Helper()
	resp, err := http.Get(e.srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	return testkit.ReadBody(t, resp)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var p = map[string]any{"title": "Locked one"}
	e.admin("POST", "/admin/v1/threads/secret-thread-id/preferences", map[string]any{"title": "Locked one", "locked": true}, 201, &p)
	e.up.Script(
		reply(cmpl("", call{ID: "a", Name: "remove_preferences", Arguments: `{"indices":[1]}`},
			call{ID: "b", Name: "add_preferences", Arguments: `{"items":[]}`},
			call{ID: "c", Name: "invented", Arguments: `{}`})),
		reply(cmpl("done")),
		reply(cmpl("plain")),
	)
	e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "secret-thread-id"}, `{"messages":[]}`)
	e.post("/threads/secret-thread-id/v1/chat/completions", nil, `{"messages":[]}`)

	m := e.opts().Metrics
	require.Equal(t, 1.0, testutil.ToFloat64(m.toolCalls.WithLabelValues("remove_preferences", "ok", "proxy")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.toolCalls.WithLabelValues("add_preferences", "error", "proxy")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.toolCalls.WithLabelValues("unknown", "error", "proxy")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.lockedSkips.WithLabelValues("remove_preferences")))
	require.Equal(t, 30.0, testutil.ToFloat64(m.tokens.WithLabelValues("prompt", "")), "the requests named no model")
	require.Equal(t, 15.0, testutil.ToFloat64(m.tokens.WithLabelValues("completion", "")))
	require.Equal(t, 6.0, testutil.ToFloat64(m.cachedTokens.WithLabelValues("")), "2 cached tokens in each of the three rounds")
	require.Equal(t, 3.0, testutil.ToFloat64(m.upstreamRequests.WithLabelValues("200")))
	// A request is counted when its handler returns, which may be just after the client has the
	// whole answer (the turn's usage is added to its thread after it).
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(m.httpRequests.WithLabelValues("POST /v1/chat/completions", "200")) == 1 &&
			testutil.ToFloat64(m.httpRequests.WithLabelValues("POST /threads/{thread}/v1/chat/completions", "200")) == 1
	}, 5*time.Second, 10*time.Millisecond)

	text := scrape(t, e)
	for _, name := range []string{
		"wsproxy_http_requests_total", "wsproxy_http_request_duration_seconds", "wsproxy_upstream_requests_total",
		"wsproxy_upstream_request_duration_seconds", "wsproxy_tool_calls_total", "wsproxy_locked_skips_total",
		"wsproxy_tool_rounds", "wsproxy_tool_rounds_exhausted_total", "wsproxy_usage_lag_seconds", "wsproxy_tokens_total", "wsproxy_cached_prompt_tokens_total", "wsproxy_inflight_requests",
		"go_goroutines", "process_cpu_seconds_total",
	} {
		require.Contains(t, text, "# TYPE "+name+" ", name)
	}
	// Two turns: one with a tool round, one answered at once.
	require.Contains(t, text, `wsproxy_tool_rounds_bucket{le="0"} 1`)
	require.Contains(t, text, `wsproxy_tool_rounds_bucket{le="1"} 2`)
	require.NotContains(t, text, "secret-thread-id", "a thread id never becomes a label value")

	lint(t, text)
}

// TestToolRoundsCountAMixedRound: a turn whose round ran the workspace's calls beside a client's
// call is not a turn the model answered at once: wsproxy_tool_rounds records that round.
func TestToolRoundsCountAMixedRound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(reply(cmpl("",
		call{ID: "p1", Name: "add_preferences", Arguments: `{"items":[{"title":"Celsius"}]}`},
		call{ID: "c1", Name: "get_weather", Arguments: `{"city":"Paris"}`})))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "mixed"},
		`{"messages":[{"role":"user","content":"Weather in Paris, in Celsius."}],"tools":[{"type":"function","function":{"name":"get_weather"}}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	var got []string
	for _, line := range strings.Split(scrape(t, e), "\n") {
		if strings.HasPrefix(line, `wsproxy_tool_rounds_bucket{le="0"}`) || strings.HasPrefix(line, "wsproxy_tool_rounds_sum") ||
			strings.HasPrefix(line, "wsproxy_tool_rounds_count") {
			got = append(got, line)
		}
	}
	require.Equal(t, []string{`wsproxy_tool_rounds_bucket{le="0"} 0`, "wsproxy_tool_rounds_sum 1", "wsproxy_tool_rounds_count 1"}, got)
}

// TestToolRoundsExhaustedCounted: a turn whose tool rounds reach MAX_TOOL_ROUNDS, so that its
// last call goes without the workspace tools, is counted in wsproxy_tool_rounds_exhausted_total;
// a turn that ends within the bound is not.
func TestToolRoundsExhaustedCounted(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.MaxToolRounds = 1 })
	e.up.Script(
		reply(cmpl("", call{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":"Celsius"}]}`})),
		reply(cmpl("done")),
		reply(cmpl("at once")),
	)
	for _, thread := range []string{"bounded", "within"} {
		resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": thread}, `{"messages":[{"role":"user","content":"go"}]}`)
		require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	}
	require.Equal(t, 1.0, testutil.ToFloat64(e.opts().Metrics.roundsExhausted))
	require.True(t, strings.Contains(scrape(t, e), "\nwsproxy_tool_rounds_exhausted_total 1\n"), "the scrape shows it")
}

// TestPostgresUp: wsproxy_postgres_up is 1 while Postgres answers through the pool, 0 at a
// scrape that finds it cut off, and 1 again once it is back.
func TestPostgresUp(t *testing.T) {
	t.Parallel()
	pool, fault := dbtest.NewFaultPool(t, nil)
	reg := prometheus.NewRegistry()
	NewMetrics(reg, MetricsOptions{}).WatchPool(pool)
	up := func() float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "wsproxy_postgres_up" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no wsproxy_postgres_up")
		return 0
	}
	require.Equal(t, 1.0, up())
	fault.Cut()
	require.Equal(t, 0.0, up())
	fault.Restore()
	require.Eventually(t, func() bool { return up() == 1 }, 10*time.Second, 10*time.Millisecond)
}

// TestEventStreamMetrics: wsproxy_event_streams counts the event streams open; one its client
// closes is no failure, one the server ends because Postgres went away counts in
// wsproxy_event_streams_failed_total.
func TestEventStreamMetrics(t *testing.T) {
	t.Parallel()
	pool, fault := dbtest.NewFaultPool(t, nil)
	e := setupWithPool(t, pool, func(o *Options) { o.StreamKeepalive = 20 * time.Millisecond }) // reads at each heartbeat
	e.admin("POST", "/admin/v1/threads/watched/preferences", map[string]any{"title": "Small hotels"}, 201, nil)
	m := e.opts().Metrics
	open := func() *http.Response {
		req, err := http.NewRequest("GET", e.srv.URL+"/admin/v1/threads/watched/events/stream", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	streams := func(n float64) func() bool {
		return func() bool { return testutil.ToFloat64(m.eventStreams) == n }
	}

	resp := open()
	require.Eventually(t, streams(1), 10*time.Second, 5*time.Millisecond)
	resp.Body.Close()
	require.Eventually(t, streams(0), 10*time.Second, 5*time.Millisecond)
	require.Zero(t, testutil.ToFloat64(m.streamsFailed), "a stream its client closed did not fail")

	resp = open()
	require.Eventually(t, streams(1), 10*time.Second, 5*time.Millisecond)
	fault.Cut()
	_, err := io.Copy(io.Discard, resp.Body) // the server ends the stream
	require.NoError(t, err)
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.streamsFailed) == 1 }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, streams(0), 10*time.Second, 5*time.Millisecond)
}

// lint runs promtool check metrics on a scrape's text (when promtool is installed).
func lint(t *testing.T, text string) {
	t.Helper()
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Log("promtool not installed; the metrics text was not linted")
		return
	}
	cmd := exec.Command("promtool", "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool: %s", out)
}

// TestMetricsLabels: the counters whose labels are known in advance are there at zero before
// the first request, with the build's info and the Postgres pool's gauges; the token counters
// carry the request's model (the first MaxModels distinct ones, the rest as "other") and, with
// client keys, the client.
func TestMetricsLabels(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice,bob=sk-bob")
	require.NoError(t, err)
	require.Equal(t, []string{"alice", "bob"}, keys.Names())
	pool := dbtest.NewPool(t, nil)
	e := setupWithPool(t, pool, func(o *Options) {
		o.ClientKeys, o.UpstreamAPIKey = keys, "sk-up"
		o.Metrics = watched(NewMetrics(prometheus.NewRegistry(), MetricsOptions{Clients: keys.Names(), Version: "v9.9.9", MaxModels: 2}), pool)
	})
	text := scrape(t, e)
	lint(t, text)
	for _, line := range []string{
		`wsproxy_build_info{goversion="` + runtime.Version() + `",version="v9.9.9"} 1`,
		`wsproxy_locked_skips_total{tool="remove_preferences"} 0`,
		`wsproxy_locked_skips_total{tool="update_preferences"} 0`,
		`wsproxy_tool_calls_total{outcome="ok",tool="add_preferences",via="proxy"} 0`,
		`wsproxy_upstream_retries_total 0`,
		`wsproxy_db_pool_max_connections ` + strconv.Itoa(int(e.pool.Config().MaxConns)),
	} {
		require.True(t, strings.Contains(text, "\n"+line+"\n"), line)
	}
	for _, name := range []string{"wsproxy_db_pool_acquired_connections", "wsproxy_db_pool_idle_connections", "wsproxy_db_pool_connections"} {
		require.True(t, strings.Contains(text, "# TYPE "+name+" gauge\n"), name)
	}
	require.True(t, strings.Contains(text, "# TYPE wsproxy_db_pool_acquire_waits_total counter\n"))

	turn := func(key, model string) {
		t.Helper()
		e.up.Script(reply(cmpl("ok")))
		resp := e.post("/v1/chat/completions", map[string]string{"Authorization": "Bearer " + key, "X-Thread-Id": "t"},
			`{"model":"`+model+`","messages":[{"role":"user","content":"x"}]}`)
		require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	}
	turn("sk-alice", "m1")
	turn("sk-bob", "m2")
	turn("sk-alice", "m3") // a third model: other
	turn("sk-alice", "m1")
	text = scrape(t, e)
	lint(t, text)
	var tokens []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "wsproxy_tokens_total{") || strings.HasPrefix(line, "wsproxy_cached_prompt_tokens_total{") {
			tokens = append(tokens, line)
		}
	}
	// cmpl's usage: 10 prompt tokens (2 of them cached), 5 completion tokens a round.
	require.Equal(t, []string{
		`wsproxy_cached_prompt_tokens_total{client="alice",model="m1"} 4`,
		`wsproxy_cached_prompt_tokens_total{client="alice",model="other"} 2`,
		`wsproxy_cached_prompt_tokens_total{client="bob",model="m2"} 2`,
		`wsproxy_tokens_total{client="alice",kind="completion",model="m1"} 10`,
		`wsproxy_tokens_total{client="alice",kind="completion",model="other"} 5`,
		`wsproxy_tokens_total{client="alice",kind="prompt",model="m1"} 20`,
		`wsproxy_tokens_total{client="alice",kind="prompt",model="other"} 10`,
		`wsproxy_tokens_total{client="bob",kind="completion",model="m2"} 5`,
		`wsproxy_tokens_total{client="bob",kind="prompt",model="m2"} 10`,
	}, tokens)
}
