package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/demo"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

func TestMain(m *testing.M) { dbtest.VerifyNoLeaks(m) }

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// MustRunMain starts the whole program on :0 against a fresh schema of the test database.
func MustRunMain(t *testing.T, configure func(*Config)) (*Main, *syncBuffer) {
	t.Helper()
	m := NewMain()
	m.Config.DatabaseURL = dbtest.SchemaURL(t)
	m.Config.EventsPollInterval = 20 * time.Millisecond
	m.Config.ListenAddr = "127.0.0.1:0"
	m.Config.UpstreamBaseURL = "demo"
	m.Config.LogLevel = "debug"
	logs := &syncBuffer{}
	m.LogOutput = logs
	if configure != nil {
		configure(&m.Config)
	}
	require.NoError(t, m.Run(context.Background()))
	t.Cleanup(func() { _ = m.Close() })
	return m, logs
}

func chat(t *testing.T, client *goopenai.Client, text string) goopenai.ChatCompletionResponse {
	t.Helper()
	resp, err := client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model: demo.ModelName, Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: text}},
	})
	require.NoError(t, err)
	return resp
}

func adminCall(t *testing.T, m *Main, method, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, m.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+m.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		require.NoError(t, json.Unmarshal(b, out), string(b))
	}
	return resp.StatusCode
}

type adminWorkspace struct {
	Objective *struct {
		Text      string `json:"text"`
		UpdatedBy string `json:"updated_by"`
	} `json:"objective"`
	Preferences []struct {
		ID     int64  `json:"id"`
		Index  int    `json:"index"`
		Title  string `json:"title"`
		Kind   string `json:"kind"`
		Locked bool   `json:"locked"`
	} `json:"preferences"`
	Block string `json:"block"`
}

// TestDemoEndToEnd runs the program against the demo model: two turns fill the workspace, the
// user locks an item through the admin REST, and a third turn cannot remove it.
func TestDemoEndToEnd(t *testing.T) {
	t.Parallel()
	m, logs := MustRunMain(t, nil)
	require.Contains(t, logs.String(), "generated one for this run")
	require.Contains(t, logs.String(), m.AdminToken, "the generated token is logged")
	require.Contains(t, logs.String(), "demo model")

	cfg := goopenai.DefaultConfig("any")
	cfg.BaseURL = m.URL + "/threads/essay/v1"
	client := goopenai.NewClientWithConfig(cfg)

	r1 := chat(t, client, "My goal is to write a literature review on soil carbon. It must be formal.")
	require.True(t, strings.HasPrefix(r1.Choices[0].Message.Content, demo.Prefix), r1.Choices[0].Message.Content)
	require.Contains(t, r1.Choices[0].Message.Content, "objective set: Write a literature review on soil carbon")
	require.Contains(t, r1.Choices[0].Message.Content, "recorded 1 preference")
	require.Equal(t, "2", r1.Header().Get("X-Workspace-Rounds"))

	r2 := chat(t, client, "I prefer short paragraphs. I prefer short paragraphs!")
	require.Contains(t, r2.Choices[0].Message.Content, `recorded 1 preference; already recorded: #2 "Short paragraphs"`)

	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/essay", "", &ws))
	require.Equal(t, "Write a literature review on soil carbon", ws.Objective.Text)
	require.Equal(t, "agent", ws.Objective.UpdatedBy)
	require.Len(t, ws.Preferences, 2)
	require.Equal(t, "hard", ws.Preferences[0].Kind)

	// The user locks "Short paragraphs".
	id := ws.Preferences[1].ID
	require.Equal(t, 200, adminCall(t, m, "PATCH", "/admin/v1/threads/essay/preferences/"+itoa(id), `{"locked":true}`, nil))

	// Turn 3 (streamed): the block shows the lock, and the model's remove is refused.
	stream, err := client.CreateChatCompletionStream(context.Background(), goopenai.ChatCompletionRequest{
		Model: demo.ModelName, Stream: true, Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Forget the paragraphs one."}},
	})
	require.NoError(t, err)
	var content strings.Builder
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		content.WriteString(chunk.Choices[0].Delta.Content)
	}
	stream.Close()
	require.Contains(t, content.String(), `locked, ask the user to unlock first: #2 "Short paragraphs"`)
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/essay", "", &ws))
	require.Len(t, ws.Preferences, 2)
	require.True(t, ws.Preferences[1].Locked)
	require.Contains(t, ws.Block, "#2 [soft] Short paragraphs (locked)")

	var snaps struct {
		Data []struct {
			Turn        int   `json:"turn"`
			Preferences []any `json:"preferences"`
		} `json:"data"`
	}
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/essay/snapshots", "", &snaps))
	require.Len(t, snaps.Data, 3)
	require.Empty(t, snaps.Data[0].Preferences)
	require.Len(t, snaps.Data[2].Preferences, 2)

	// Metrics, linted by promtool when it is installed.
	resp, err := http.Get(m.URL + "/metrics")
	require.NoError(t, err)
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(text), `wsproxy_locked_skips_total{tool="remove_preferences"} 1`)
	require.Contains(t, string(text), `wsproxy_tool_calls_total{outcome="ok",tool="set_objective",via="proxy"} 1`)
	// The pool: its connections, its size, and every acquire of a connection.
	require.Regexp(t, `(?m)^wsproxy_db_pool_acquired_connections \d+$`, string(text))
	require.Regexp(t, `(?m)^wsproxy_db_pool_max_connections \d+$`, string(text))
	require.Regexp(t, `(?m)^wsproxy_db_pool_acquire_duration_seconds_count [1-9]\d*$`, string(text))
	if _, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command("promtool", "check", "metrics")
		cmd.Stdin = bytes.NewReader(text)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool: %s", out)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(m.URL + p)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, p)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestShutdownFinishesStreams: Close lets a stream in flight finish, then stops.
func TestShutdownFinishesStreams(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := upstreamtest.New(t, func(w http.ResponseWriter, r *http.Request) {
		chunks := upstreamtest.ContentChunks("chatcmpl-s", "first ", "second")
		upstreamtest.StreamRaw([]string{"data: " + chunks[0] + "\n\ndata: " + chunks[1] + "\n\n"})(w, r)
		<-release
		upstreamtest.WriteRaw(w, upstreamtest.Events(chunks[2:]...)...)
		upstreamtest.WriteRaw(w, "data: [DONE]\n\n")
	})
	m, _ := MustRunMain(t, func(c *Config) {
		c.UpstreamBaseURL = up.URL
		c.AdminToken = "test-admin-token-0123456789"
		c.ShutdownTimeout = 20 * time.Second
	})
	req, err := http.NewRequest("POST", m.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	require.NoError(t, err)
	req.Header.Set("X-Thread-Id", "s")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "first")

	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned with a stream in flight: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	require.Contains(t, string(rest), "second")
	require.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"))
	require.NoError(t, <-closed)
	_, err = http.Get(m.URL + "/healthz")
	require.Error(t, err, "no longer serving")
}

func TestConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://x", "MAX_TOOL_ROUNDS": "3", "UPSTREAM_TIMEOUT": "3s", "LISTEN_ADDR": ":1",
		"MAX_BUFFERED_BYTES": "512 MiB", "MAX_REQUEST_BYTES": "16MiB", "REQUEST_READ_TIMEOUT": "5s", "WORKSPACE_PLACEMENT": "system",
		"PASSTHROUGH_ROUTES": "GET /v1/models", "TRUSTED_PROXIES": "10.0.0.0/8, 192.168.1.1",
		"MAX_TOOL_CALLS_PER_ROUND": "7", "MAX_TOOL_CALLS_PER_TURN": "9", "MAX_TOOL_ITEMS": "11", "MAX_TOOL_ARGUMENT_BYTES": "64KiB", "MCP": "off",
		"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "True"}
	c := DefaultConfig()
	require.NoError(t, c.Load([]string{"-listen-addr", ":2", "-log-format", "json"}, func(k string) string { return env[k] }, io.Discard))
	require.NoError(t, c.Validate())
	require.Equal(t, 3, c.MaxToolRounds)
	require.Equal(t, 3*time.Second, c.UpstreamTimeout)
	require.Equal(t, ":2", c.ListenAddr, "a flag wins over its variable")
	require.Equal(t, "https://api.openai.com/v1", c.UpstreamBaseURL)
	require.Equal(t, int64(512<<20), c.MaxBufferedBytes)
	require.Equal(t, int64(16<<20), c.MaxRequestBytes)
	require.Equal(t, 5*time.Second, c.RequestReadTimeout)
	require.Equal(t, "system", c.WorkspacePlacement)
	require.Equal(t, "GET /v1/models", c.PassThroughRoutes)
	require.Equal(t, "10.0.0.0/8, 192.168.1.1", c.TrustedProxies)
	require.Equal(t, []int{7, 9, 11}, []int{c.MaxToolCallsPerRound, c.MaxToolCallsPerTurn, c.MaxToolItems})
	require.Equal(t, int64(64<<10), c.MaxToolArgumentBytes)
	require.Equal(t, "off", c.MCP)
	require.True(t, c.TraceContent)
	d := DefaultConfig()
	require.False(t, d.TraceContent)
	require.Equal(t, "on", d.MCP)
	require.Equal(t, "tail", d.WorkspacePlacement)
	require.Equal(t, "auto", d.PromptCacheKey)
	require.Equal(t, int64(256<<20), d.MaxBufferedBytes)
	require.Equal(t, 60*time.Second, d.RequestReadTimeout)
	require.Equal(t, []int{100, 400, 1000}, []int{d.MaxToolCallsPerRound, d.MaxToolCallsPerTurn, d.MaxToolItems})
	require.Equal(t, int64(1<<20), d.MaxToolArgumentBytes)

	bad := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "DATABASE_URL"},
		{map[string]string{"DATABASE_URL": "x", "UPSTREAM_BASE_URL": "ftp://x"}, "UPSTREAM_BASE_URL"},
		{map[string]string{"DATABASE_URL": "x", "ANTHROPIC_UPSTREAM_BASE_URL": "ftp://x"}, "ANTHROPIC_UPSTREAM_BASE_URL"},
		{map[string]string{"DATABASE_URL": "x", "MAX_TOOL_ROUNDS": "0"}, "MAX_TOOL_ROUNDS"},
		{map[string]string{"DATABASE_URL": "x", "MAX_TOOL_ROUNDS": "many"}, "MAX_TOOL_ROUNDS"},
		{map[string]string{"DATABASE_URL": "x", "UPSTREAM_TIMEOUT": "10"}, "UPSTREAM_TIMEOUT"},
		{map[string]string{"DATABASE_URL": "x", "MAX_REQUEST_BYTES": "10"}, "MAX_REQUEST_BYTES"},
		{map[string]string{"DATABASE_URL": "x", "LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{map[string]string{"DATABASE_URL": "x", "LOG_FORMAT": "xml"}, "LOG_FORMAT"},
		{map[string]string{"DATABASE_URL": "x", "CLIENT_KEYS": "a=sk-a-0123456789abcdefgh"}, "CLIENT_KEYS needs UPSTREAM_API_KEY"},
		// Keys and tokens too short to be beyond guessing (docs/spec.md §10), the setting named.
		{map[string]string{"DATABASE_URL": "x", "UPSTREAM_API_KEY": "sk-up", "CLIENT_KEYS": "a=sk-a-0123456789abcdefgh,b=sk-b-0123456789abcd"}, "CLIENT_KEYS: entry 2"},
		{map[string]string{"DATABASE_URL": "x", "ADMIN_TOKEN": "adm-0123456789abcde"}, "ADMIN_TOKEN"},
		{map[string]string{"DATABASE_URL": "x", "METRICS_TOKEN": "met-0123456789abcde"}, "METRICS_TOKEN"},
		{map[string]string{"DATABASE_URL": "x", "DATABASE_TIMEOUT": "0s"}, "DATABASE_TIMEOUT"},
		{map[string]string{"DATABASE_URL": "x", "WORKSPACE_PLACEMENT": "middle"}, "WORKSPACE_PLACEMENT"},
		{map[string]string{"DATABASE_URL": "x", "PROMPT_CACHE_KEY": "always"}, "PROMPT_CACHE_KEY"},
		{map[string]string{"DATABASE_URL": "x", "THREAD_PARENTS": "repo-x"}, "THREAD_PARENTS: applies to threads named by THREAD_HEADER"},
		{map[string]string{"DATABASE_URL": "x", "THREAD_HEADER": "X-Session", "THREAD_PARENTS": "repo-x, bad id"}, `THREAD_PARENTS: "bad id"`},
		{map[string]string{"DATABASE_URL": "x", "PASSTHROUGH_ROUTES": "/v1/files"}, "PASSTHROUGH_ROUTES"},
		{map[string]string{"DATABASE_URL": "x", "MAX_BUFFERED_BYTES": "1MiB"}, "MAX_BUFFERED_BYTES"},
		{map[string]string{"DATABASE_URL": "x", "MAX_BUFFERED_BYTES": "lots"}, "MAX_BUFFERED_BYTES"},
		{map[string]string{"DATABASE_URL": "x", "REQUEST_READ_TIMEOUT": "0s"}, "REQUEST_READ_TIMEOUT"},
		{map[string]string{"DATABASE_URL": "x", "TRUSTED_PROXIES": "10.0.0.0/33"}, "TRUSTED_PROXIES"},
		{map[string]string{"DATABASE_URL": "x", "MAX_TOOL_CALLS_PER_ROUND": "0"}, "MAX_TOOL_CALLS_PER_ROUND"},
		{map[string]string{"DATABASE_URL": "x", "MAX_TOOL_CALLS_PER_TURN": "-1"}, "MAX_TOOL_CALLS_PER_TURN"},
		{map[string]string{"DATABASE_URL": "x", "MAX_TOOL_ITEMS": "0"}, "MAX_TOOL_ITEMS"},
		{map[string]string{"DATABASE_URL": "x", "MAX_TOOL_ARGUMENT_BYTES": "4GiB"}, "MAX_TOOL_ARGUMENT_BYTES"},
		{map[string]string{"DATABASE_URL": "x", "TRUSTED_PROXIES": "proxy.local"}, "TRUSTED_PROXIES"},
		{map[string]string{"DATABASE_URL": "x", "ANTHROPIC_UPSTREAM_BASE_URL": "api.anthropic.com"}, "ANTHROPIC_UPSTREAM_BASE_URL"},
		{map[string]string{"DATABASE_URL": "x", "THREAD_HEADER": "X-Session Id"}, "THREAD_HEADER"},
		{map[string]string{"DATABASE_URL": "x", "MCP": "yes"}, "MCP"},
		// Events reach every replica's streams within a second of their commit (docs/spec.md §13).
		{map[string]string{"DATABASE_URL": "x", "EVENTS_POLL_INTERVAL": "2s"}, "EVENTS_POLL_INTERVAL: 2s is above 1s"},
	}
	for _, b := range bad {
		c := DefaultConfig()
		err := c.Load(nil, func(k string) string { return b.env[k] }, io.Discard)
		if err == nil {
			err = c.Validate()
		}
		require.ErrorContains(t, err, b.want, "%v", b.env)
	}

	// Secrets never show in the usage text.
	var usage bytes.Buffer
	c = DefaultConfig()
	_ = c.Load([]string{"-h"}, func(k string) string {
		return map[string]string{"UPSTREAM_API_KEY": "sk-secret", "ADMIN_TOKEN": "adm-secret", "METRICS_TOKEN": "metrics-secret"}[k]
	}, &usage)
	require.NotContains(t, usage.String(), "secret")
	require.Contains(t, usage.String(), "UPSTREAM_API_KEY")
}

// TestPlacementSetting: WORKSPACE_PLACEMENT reaches the proxy (tail by default, said at start).
func TestPlacementSetting(t *testing.T) {
	t.Parallel()
	for _, placement := range []string{"", "system"} {
		up := upstreamtest.New(t)
		up.Fallback = upstreamtest.JSON(200, upstreamtest.Completion("ok"))
		m, logs := MustRunMain(t, func(c *Config) {
			c.UpstreamBaseURL = up.URL
			if placement != "" {
				c.WorkspacePlacement = placement
			}
		})
		want := map[string]string{"": "tail", "system": "system"}[placement]
		require.Contains(t, logs.String(), `msg="workspace placement" placement=`+want)
		cfg := goopenai.DefaultConfig("any")
		cfg.BaseURL = m.URL + "/threads/p/v1"
		_, err := goopenai.NewClientWithConfig(cfg).CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
			Model: "m", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
		})
		require.NoError(t, err)
		var req struct {
			Messages []struct{ Role, Content string } `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(up.Requests()[0].Body, &req))
		if want == "tail" {
			require.Len(t, req.Messages, 1)
			require.True(t, strings.HasPrefix(req.Messages[0].Content, "hi\n\n"), req.Messages[0].Content)
		} else {
			require.Len(t, req.Messages, 2)
			require.Equal(t, "system", req.Messages[0].Role)
			require.Equal(t, "hi", req.Messages[1].Content)
		}
	}
}

// TestStartAndShutdownLines: the start line names the upstream as configured ("demo" for the
// demo model, never its loopback port), the address and the version; a request gets its line of
// the request log; Close logs the shutdown and its end.
func TestStartAndShutdownLines(t *testing.T) {
	t.Parallel()
	m, logs := MustRunMain(t, func(c *Config) { c.LogLevel = "info" })
	start := lineOf(t, logs.String(), "msg=\"wsproxy serving\"")
	require.Contains(t, start, "upstream=demo ")
	require.Contains(t, start, "url="+m.URL)
	require.Contains(t, start, "version=")

	client := goopenai.NewClientWithConfig(func() goopenai.ClientConfig {
		cfg := goopenai.DefaultConfig("any")
		cfg.BaseURL = m.URL + "/threads/logged/v1"
		return cfg
	}())
	chat(t, client, "I prefer small hotels.")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "msg=request") }, 10*time.Second, 5*time.Millisecond)
	line := lineOf(t, logs.String(), "msg=request")
	require.Regexp(t, `route="POST /threads/\{thread\}/v1/chat/completions" status=200 addr=127\.0\.0\.1 thread=logged kind=turn model=wsproxy-demo rounds=2 `+
		`upstream_status=200 prompt_tokens=\d+ cached_tokens=\d+ completion_tokens=\d+ duration_ms=[0-9.]+ request_id=req_[0-9a-f]{24}$`, line)
	require.NotContains(t, logs.String(), "small hotels")

	require.NoError(t, m.Close())
	require.Contains(t, logs.String(), `msg="wsproxy shutting down"`)
	require.Contains(t, lineOf(t, logs.String(), `msg="wsproxy stopped"`), "level=INFO")
}

// TestStartLineConfirmsThreads: the start line confirms how threads are picked and which
// clients hold keys — THREAD_HEADER, THREAD_PARENTS, the number of clients — and says none when
// they are not set.
func TestStartLineConfirmsThreads(t *testing.T) {
	t.Parallel()
	_, logs := MustRunMain(t, func(c *Config) {
		c.LogLevel = "info"
		c.ThreadHeader = "X-Claude-Code-Session-Id, session-id"
		c.ThreadParents = "repo-x, alice"
		c.ClientKeys = "alice=sk-alice-secret-key-0001,bob=sk-bob-secret-key-00001,bob=sk-bob-secret-key-00002"
	})
	start := lineOf(t, logs.String(), "msg=\"wsproxy serving\"")
	require.Contains(t, start, `thread_header="X-Claude-Code-Session-Id, session-id"`)
	require.Contains(t, start, `thread_parents="repo-x, alice"`)
	require.Contains(t, start, `clients=2 client_keys=3`)
	require.NotContains(t, logs.String(), "sk-alice")

	_, logs = MustRunMain(t, func(c *Config) { c.LogLevel = "info" })
	start = lineOf(t, logs.String(), "msg=\"wsproxy serving\"")
	require.Contains(t, start, `thread_header=none thread_parents=none clients=none`)
}

// TestPprofListener: PPROF_ADDR serves the runtime profiles on a listener of its own; the
// proxy's address serves none, and the listener closes with the proxy.
func TestPprofListener(t *testing.T) {
	t.Parallel()
	m, logs := MustRunMain(t, func(c *Config) { c.LogLevel = "info"; c.PprofAddr = "127.0.0.1:0" })
	require.Contains(t, lineOf(t, logs.String(), `msg="profiles served"`), "url="+m.PprofURL)
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	status, body := get(m.PprofURL + "goroutine?debug=1")
	require.Equal(t, 200, status)
	require.Contains(t, body, "goroutine profile:")
	status, _ = get(m.PprofURL + "cmdline")
	require.Equal(t, 404, status, "the command line, which may hold a secret flag, is not served")
	status, _ = get(m.URL + "/debug/pprof/goroutine?debug=1")
	require.Equal(t, 404, status, "the proxy's address serves no profile")
	require.NoError(t, m.Close())
	_, err := http.Get(m.PprofURL)
	require.Error(t, err, "the listener closed with the proxy")
}

// lineOf is the first line of logs that holds s.
func lineOf(t *testing.T, logs, s string) string {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	require.Fail(t, "no log line with "+s, logs)
	return ""
}

// TestDemoWrongMethod: a wrong method on a model route goes through wsproxy to the demo model as
// it came, and the demo answers as the provider it imitates would: 405 with Allow, and the
// provider's JSON error.
func TestDemoWrongMethod(t *testing.T) {
	t.Parallel()
	m, _ := MustRunMain(t, nil)
	for _, tt := range []struct {
		method, path, want string
	}{
		{"GET", "/v1/chat/completions",
			`{"error":{"message":"GET is not allowed on /v1/chat/completions (allowed: POST)","type":"invalid_request_error","param":null,"code":"method_not_allowed"}}`},
		{"DELETE", "/threads/demo/v1/chat/completions",
			`{"error":{"message":"DELETE is not allowed on /v1/chat/completions (allowed: POST)","type":"invalid_request_error","param":null,"code":"method_not_allowed"}}`},
		{"GET", "/v1/responses",
			`{"error":{"message":"GET is not allowed on /v1/responses (allowed: POST)","type":"invalid_request_error","param":null,"code":"method_not_allowed"}}`},
		{"GET", "/v1/messages",
			`{"type":"error","error":{"type":"invalid_request_error","message":"GET is not allowed on /v1/messages (allowed: POST)"}}`},
		{"GET", "/threads/demo/v1beta/models/wsproxy-demo:generateContent",
			`{"error":{"code":405,"message":"GET is not allowed on /v1beta/models/wsproxy-demo:generateContent (allowed: POST)","status":"INVALID_ARGUMENT"}}`},
	} {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, m.URL+tt.path, nil)
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, string(body))
			require.Equal(t, "POST", resp.Header.Get("Allow"))
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			require.JSONEq(t, tt.want, string(body))
		})
	}
}
