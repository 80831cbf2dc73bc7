package proxy

import (
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func scrape(t *testing.T, e *env) string {
	t.Helper()
	resp, err := http.Get(e.srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	return readBody(t, resp)
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
	require.Equal(t, 30.0, testutil.ToFloat64(m.tokens.WithLabelValues("prompt")))
	require.Equal(t, 15.0, testutil.ToFloat64(m.tokens.WithLabelValues("completion")))
	require.Equal(t, 6.0, testutil.ToFloat64(m.cachedTokens), "2 cached tokens in each of the three rounds")
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
		"wsproxy_tool_rounds", "wsproxy_tokens_total", "wsproxy_cached_prompt_tokens_total", "wsproxy_inflight_requests",
		"go_goroutines", "process_cpu_seconds_total",
	} {
		require.Contains(t, text, "# TYPE "+name+" ", name)
	}
	// Two turns: one with a tool round, one answered at once.
	require.Contains(t, text, `wsproxy_tool_rounds_bucket{le="0"} 1`)
	require.Contains(t, text, `wsproxy_tool_rounds_bucket{le="1"} 2`)
	require.NotContains(t, text, "secret-thread-id", "a thread id never becomes a label value")

	if _, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command("promtool", "check", "metrics")
		cmd.Stdin = strings.NewReader(text)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool: %s", out)
	} else {
		t.Log("promtool not installed; the metrics text was not linted")
	}
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
	require.Equal(t, 200, resp.StatusCode, readBody(t, resp))
	var got []string
	for _, line := range strings.Split(scrape(t, e), "\n") {
		if strings.HasPrefix(line, `wsproxy_tool_rounds_bucket{le="0"}`) || strings.HasPrefix(line, "wsproxy_tool_rounds_sum") ||
			strings.HasPrefix(line, "wsproxy_tool_rounds_count") {
			got = append(got, line)
		}
	}
	require.Equal(t, []string{`wsproxy_tool_rounds_bucket{le="0"} 0`, "wsproxy_tool_rounds_sum 1", "wsproxy_tool_rounds_count 1"}, got)
}
