package proxy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestClientIsolation: with client keys, each client's threads are its own, the upstream gets the
// upstream key, and no key shows in an error, a log line or a metric.
func TestClientIsolation(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret,bob=sk-bob-secret")
	require.NoError(t, err)
	logs := &lockedBuffer{}
	e := setup(t, func(o *Options) {
		o.ClientKeys = keys
		o.UpstreamAPIKey = "sk-upstream"
		o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})

	as := func(key string) *goopenai.Client {
		cfg := goopenai.DefaultConfig(key)
		cfg.BaseURL = e.srv.URL + "/threads/t1/v1"
		return goopenai.NewClientWithConfig(cfg)
	}
	req := goopenai.ChatCompletionRequest{Model: "m", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "x"}}}

	e.up.Script(reply(cmpl("", call{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":"Alice's secret"}]}`})), reply(cmpl("ok")))
	resp, err := as("sk-alice-secret").CreateChatCompletion(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, "t1", resp.Header().Get("X-Thread-Id"), "the client sees its own thread id")

	// Bob's "t1" is another thread: empty, and his tools cannot reach Alice's.
	e.up.Script(reply(cmpl("", call{ID: "b", Name: "remove_preferences", Arguments: `{"indices":[1]}`})), reply(cmpl("ok")))
	_, err = as("sk-bob-secret").CreateChatCompletion(context.Background(), req)
	require.NoError(t, err)
	bobFirst := messages(e.upstreamRequest(2))
	require.Contains(t, bobFirst[0]["content"], "Preferences: (none yet)")
	bobTool := messages(e.upstreamRequest(3))
	require.Contains(t, bobTool[len(bobTool)-1]["content"], "no matching preferences found")
	require.Equal(t, "Alice's secret", e.workspace("alice~t1").Preferences[0].Title)

	for _, r := range e.up.Requests() {
		require.Equal(t, "Bearer sk-upstream", r.Header.Get("Authorization"))
	}

	// No key, or a wrong one: 401, the key nowhere in the answer; pass-through too.
	for _, key := range []string{"", "sk-wrong-secret"} {
		for _, path := range []string{"/v1/chat/completions", "/v1/models"} {
			h := map[string]string{"X-Thread-Id": "t1"}
			if key != "" {
				h["Authorization"] = "Bearer " + key
			}
			resp := e.post(path, h, `{"messages":[]}`)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
			body := testkit.ReadBody(t, resp)
			testkit.RequireErrorBody(t, body, "invalid_request_error", "invalid_api_key")
			require.NotContains(t, body, "secret")
		}
	}

	// The admin REST shows whose thread each is.
	var threads page[workspace.Thread]
	e.admin("GET", "/admin/v1/threads", nil, 200, &threads)
	require.Len(t, threads.Data, 2)
	clients := map[string]string{}
	for _, th := range threads.Data {
		clients[th.Client] = th.ID
	}
	require.Equal(t, map[string]string{"alice": "alice~t1", "bob": "bob~t1"}, clients)
	var d workspace.Detail
	e.admin("GET", "/admin/v1/threads/alice~t1", nil, 200, &d)
	require.Equal(t, "alice", d.Client)

	require.NotContains(t, scrape(t, e), "secret")
	require.NotContains(t, logs.String(), "secret")
}

// lockedBuffer is a log sink the server's goroutines can share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestClientKeyOnTheAdminREST: a client's key is a bearer of the admin REST for that client's
// threads (docs/spec.md §8): it lists, reads and edits its own, and another client's thread does
// not exist for it.
func TestClientKeyOnTheAdminREST(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-0123456789abcdef,bob=sk-bob-0123456789abcdefgh")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys = keys; o.UpstreamAPIKey = "sk-upstream" })
	e.admin("PUT", "/admin/v1/threads/alice~mine/objective", map[string]any{"text": "Alice's"}, 200, nil)
	e.admin("PUT", "/admin/v1/threads/bob~theirs/objective", map[string]any{"text": "Bob's"}, 200, nil)

	as := func(key, method, path, body string) (int, string) {
		req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	status, body := as("sk-alice-0123456789abcdef", "GET", "/admin/v1/threads", "")
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, `"id":"alice~mine"`)
	require.NotContains(t, body, "bob~theirs")
	status, body = as("sk-alice-0123456789abcdef", "GET", "/admin/v1/threads/alice~mine", "")
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "Alice's")
	status, _ = as("sk-alice-0123456789abcdef", "POST", "/admin/v1/threads/alice~mine/preferences", `{"title":"Short answers"}`)
	require.Equal(t, http.StatusCreated, status)
	for _, m := range []struct{ method, path, body string }{
		{"GET", "/admin/v1/threads/bob~theirs", ""},
		{"PUT", "/admin/v1/threads/bob~theirs/objective", `{"text":"Taken over"}`},
		{"GET", "/admin/v1/threads/bob~theirs/events", ""},
	} {
		status, body = as("sk-alice-0123456789abcdef", m.method, m.path, m.body)
		require.Equal(t, http.StatusNotFound, status, "%s %s: %s", m.method, m.path, body)
	}
	require.Equal(t, "Bob's", e.workspace("bob~theirs").Objective.Text)
	status, _ = as("sk-alice-0123456789abcdef-wrong", "GET", "/admin/v1/threads", "")
	require.Equal(t, http.StatusUnauthorized, status)
}
