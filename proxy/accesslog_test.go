package proxy

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// requestLines are the request log's lines in logs (JSON), in order.
func requestLines(t *testing.T, logs *lockedBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if line == "" || json.Unmarshal([]byte(line), &m) != nil || m["msg"] != "request" {
			continue
		}
		out = append(out, m)
	}
	return out
}

// waitRequestLines waits for n lines of the request log: a request's line is written as its
// handler returns, which may be just after the client has the answer.
func waitRequestLines(t *testing.T, logs *lockedBuffer, n int) []map[string]any {
	t.Helper()
	require.Eventually(t, func() bool { return len(requestLines(t, logs)) >= n }, 10*time.Second, 5*time.Millisecond, "logs: %s", logs)
	return requestLines(t, logs)
}

// fields is a request line less its time, duration and request id, which vary.
func fields(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	require.IsType(t, 0.0, m["duration_ms"], "duration_ms: %v", m)
	require.NotNil(t, m["time"])
	require.Regexp(t, `^req_[0-9a-f]{24}$`, m["request_id"])
	out := map[string]any{}
	for k, v := range m {
		if k != "time" && k != "duration_ms" && k != "request_id" {
			out[k] = v
		}
	}
	return out
}

// TestRequestLog: one line per request at Info, with its method, route (the route pattern, never
// the path), status, request id, the client's address, thread, kind, model, rounds, client, the
// turn's tokens, the upstream's status and the duration; never a prompt, a body, a model's
// reasoning or a key. Probes and scrapes log at Debug.
func TestRequestLog(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret")
	require.NoError(t, err)
	logs := &lockedBuffer{}
	e := setup(t, func(o *Options) {
		o.ClientKeys = keys
		o.UpstreamAPIKey = "sk-upstream-secret"
		o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	alice := map[string]string{"Authorization": "Bearer sk-alice-secret"}

	e.up.Script(reply(cmpl("", call{ID: "a", Name: "add_preferences",
		Arguments: `{"items":[{"title":"Secret title"}],"action_and_reasoning":"Secret reasoning."}`})), reply(cmpl("Secret answer")))
	h := map[string]string{"Authorization": alice["Authorization"], "X-Thread-Id": "trip-7"}
	resp := e.post("/v1/chat/completions", h, `{"model":"m","messages":[{"role":"user","content":"Secret prompt"}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	lines := waitRequestLines(t, logs, 1)
	require.Equal(t, map[string]any{"level": "INFO", "msg": "request", "addr": "127.0.0.1", "method": "POST", "route": "POST /v1/chat/completions",
		"status": 200.0, "thread": "alice~trip-7", "client": "alice", "kind": "turn", "model": "m", "rounds": 2.0, "upstream_status": 200.0,
		"prompt_tokens": 20.0, "cached_tokens": 4.0, "completion_tokens": 10.0}, fields(t, lines[0]), "the two rounds' tokens, summed")

	// A pass-through names its route, never its path (here a model id), and the upstream's status.
	e.up.Script(reply(`{"data":[]}`))
	req, err := http.NewRequest("GET", e.srv.URL+"/threads/trip-7/v1/models/secret-model-id", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", alice["Authorization"])
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	lines = waitRequestLines(t, logs, 2)
	require.Equal(t, map[string]any{"level": "INFO", "msg": "request", "addr": "127.0.0.1", "method": "GET", "route": "/threads/{thread}/v1/",
		"status": 200.0, "thread": "alice~trip-7", "client": "alice", "upstream_status": 200.0}, fields(t, lines[1]))

	// A wrong key: no client, no upstream.
	resp = e.post("/v1/chat/completions", map[string]string{"Authorization": "Bearer sk-wrong-secret"}, `{"messages":[]}`)
	require.Equal(t, 401, resp.StatusCode)
	lines = waitRequestLines(t, logs, 3)
	require.Equal(t, map[string]any{"level": "INFO", "msg": "request", "addr": "127.0.0.1", "method": "POST", "route": "POST /v1/chat/completions",
		"status": 401.0}, fields(t, lines[2]))

	// A route PASSTHROUGH_ROUTES does not allow, with a valid key: refused, and the line names
	// the client.
	req, err = http.NewRequest("DELETE", e.srv.URL+"/v1/files/file-1", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", alice["Authorization"])
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, 403, resp.StatusCode)
	require.Contains(t, testkit.ReadBody(t, resp), "route_not_allowed")
	resp.Body.Close()
	lines = waitRequestLines(t, logs, 4)
	require.Equal(t, map[string]any{"level": "INFO", "msg": "request", "addr": "127.0.0.1", "method": "DELETE", "route": "/v1/",
		"status": 403.0, "client": "alice"}, fields(t, lines[3]))

	// The admin REST: the thread its path names.
	e.admin("GET", "/admin/v1/threads/alice~trip-7", nil, 200, nil)
	lines = waitRequestLines(t, logs, 5)
	require.Equal(t, map[string]any{"level": "INFO", "msg": "request", "addr": "127.0.0.1", "method": "GET", "route": "GET /admin/v1/threads/{thread}",
		"status": 200.0, "thread": "alice~trip-7"}, fields(t, lines[4]))

	// Probes and scrapes: Debug.
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(e.srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
	}
	// A path no route serves: the mux's catch-all.
	resp, err = http.Get(e.srv.URL + "/nowhere")
	require.NoError(t, err)
	resp.Body.Close()
	lines = waitRequestLines(t, logs, 6)
	require.Len(t, lines, 6)
	require.Equal(t, "/", lines[5]["route"])
	require.Equal(t, 404.0, lines[5]["status"])

	for _, secret := range []string{"Secret", "secret", "sk-"} {
		require.NotContains(t, logs.String(), secret)
	}
}

// TestRequestLogUpstreamUnreachable: an upstream that cannot be reached is named by its host, in
// the client's error and in the log; the request's line says no upstream status came ("error").
func TestRequestLogUpstreamUnreachable(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	e := setup(t, func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	host := e.opts().UpstreamURL.Host
	e.up.Close()
	for i, h := range []map[string]string{{"X-Thread-Id": "t"}, nil} {
		resp := e.post("/v1/chat/completions", h, `{"messages":[]}`)
		require.Equal(t, http.StatusBadGateway, resp.StatusCode)
		var body struct {
			Error struct{ Message, Code string }
		}
		require.NoError(t, json.Unmarshal([]byte(testkit.ReadBody(t, resp)), &body))
		require.Equal(t, "upstream_unreachable", body.Error.Code)
		require.Equal(t, "the upstream at "+host+" could not be reached (request "+resp.Header.Get("X-Request-Id")+")", body.Error.Message)
		lines := waitRequestLines(t, logs, i+1)
		require.Equal(t, "error", lines[i]["upstream_status"])
		require.Equal(t, 502.0, lines[i]["status"])
	}
	require.Contains(t, logs.String(), `"err":"upstream unreachable: upstream `+host+`: dial tcp`)
}

// TestRequestLogAtWarn: LOG_LEVEL=warn silences the request log.
func TestRequestLogAtWarn(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	e := setup(t, func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	e.up.Script(reply(cmpl("ok")))
	require.Equal(t, 200, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "t"}, `{"messages":[]}`).StatusCode)
	resp, err := http.Get(e.srv.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Empty(t, logs.String())
}

// TestRequestID: every answer carries X-Request-Id — the client's when it sent a valid one, else
// a new one — and so does every log line of the request and the message of a 5xx; the upstream's
// own X-Request-Id comes back as X-Upstream-Request-Id (docs/observability.md).
func TestRequestID(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	e := setup(t, func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	upstreamID := func(next upstreamtest.Reply) upstreamtest.Reply {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Id", "req_upstream_1")
			next(w, r)
		}
	}
	th := map[string]string{"X-Thread-Id": "ids", "X-Request-Id": "client-chosen-7"}
	e.up.Script(upstreamID(reply(cmpl("hi"))))
	resp := e.post("/v1/chat/completions", th, `{"messages":[]}`)
	testkit.ReadBody(t, resp)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, []string{"client-chosen-7"}, resp.Header.Values("X-Request-Id"), "the client's id, once")
	require.Equal(t, "req_upstream_1", resp.Header.Get("X-Upstream-Request-Id"))
	require.Equal(t, "client-chosen-7", e.up.Requests()[0].Header.Get("X-Request-Id"), "the client's header goes on as it came")

	// A pass-through too; an id that is not 1 to 128 visible characters is replaced.
	bad := []string{"", "has space", strings.Repeat("x", 129)}
	for range bad {
		e.up.Script(upstreamID(reply(`{"data":[]}`)))
	}
	for _, bad := range bad {
		req, err := http.NewRequest("GET", e.srv.URL+"/v1/models", nil)
		require.NoError(t, err)
		req.Header.Set("X-Request-Id", bad)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Regexp(t, `^req_[0-9a-f]{24}$`, resp.Header.Get("X-Request-Id"), "%q", bad)
	}

	// A 5xx names the request in its message, and the warning about it carries the id and the
	// route, never the path.
	e.up.Script(func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) })
	resp = e.post("/threads/secret-thread/v1/chat/completions", map[string]string{"X-Request-Id": "client-5xx"}, `{"messages":[]}`)
	body := testkit.ReadBody(t, resp)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
	require.Equal(t, "client-5xx", resp.Header.Get("X-Request-Id"))
	require.Contains(t, testkit.RequireErrorBody(t, body, "server_error", "upstream_unreachable")["message"], "(request client-5xx)")
	var warned map[string]any
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "request failed" {
				warned = m
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, "client-5xx", warned["request_id"])
	require.Equal(t, "POST /threads/{thread}/v1/chat/completions", warned["route"])
	require.NotContains(t, logs.String(), "secret-thread/v1")
	lines := waitRequestLines(t, logs, 5)
	require.Equal(t, "client-5xx", lines[4]["request_id"])
}
