package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// do sends a request to the proxy and returns its response, body read.
func (e *env) do(method, path string, header map[string]string, body string) (*http.Response, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	require.NoError(e.t, err)
	for k, v := range header {
		req.Header.Add(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	b := testkit.ReadBody(e.t.(*testing.T), resp)
	return resp, b
}

// TestPathEscapeRefused: a path whose segments decode to dot segments never reaches the
// upstream (which could resolve them outside its base URL, with the operator's key); an escaped
// slash inside a segment reaches it escaped, as the client sent it.
func TestPathEscapeRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.UpstreamAPIKey = "sk-operator" })
	e.up.Fallback = reply(`{"object":"list","data":[]}`)
	for _, path := range []string{
		"/v1/%2e%2e/%2e%2e/secret",
		"/v1/%2E%2E/secret",
		"/threads/t/v1/..%2f..%2fx",
		"/v1/files/.%2e/x",
		"/v1/a/%2e/b",
		"/v1/files/..%5csecret",
		"/threads/t/v1/models/%2e%2e",
	} {
		resp, body := e.do("GET", path, nil, "")
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, path)
		testkit.RequireErrorBody(t, body, "invalid_request_error", "invalid_path")
	}
	require.Empty(t, e.up.Requests(), "nothing reached the upstream")

	for path, want := range map[string]string{
		"/v1/files/a%2fb":               "/v1/files/a%2fb",
		"/threads/t/v1/files/a%2Fb?x=1": "/v1/files/a%2Fb?x=1",
		"/v1/models/gpt-4o":             "/v1/models/gpt-4o",
		"/v1/files/a..b":                "/v1/files/a..b",
	} {
		resp, _ := e.do("GET", path, nil, "")
		require.Equal(t, 200, resp.StatusCode, path)
		got := e.up.Requests()
		require.Equal(t, want, got[len(got)-1].Path, path)
	}
}

// TestClientKeysScopeUpstreamObjects: with client keys, only the routes PASSTHROUGH_ROUTES
// allows reach the upstream (whose objects all belong to the operator's key), and a client
// cannot pick the operator's organization or project.
func TestClientKeysScopeUpstreamObjects(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys, o.UpstreamAPIKey = keys, "sk-operator" })
	e.up.Fallback = reply(`{"object":"list","data":[]}`)
	alice := map[string]string{"Authorization": "Bearer sk-alice-secret", "OpenAI-Organization": "org-operator",
		"OpenAI-Project": "proj-operator", "api-key": "azure-key"}
	for _, rt := range []struct{ method, path string }{
		{"GET", "/v1/files"},
		{"DELETE", "/v1/files/file-bob"},
		{"GET", "/v1/chat/completions/chatcmpl-bob"},
		{"GET", "/v1/responses/resp_bob"},
		{"POST", "/v1/batches"},
		{"GET", "/threads/t1/v1/files/file-bob/content"},
	} {
		resp, body := e.do(rt.method, rt.path, alice, "")
		require.Equal(t, http.StatusForbidden, resp.StatusCode, rt)
		testkit.RequireErrorBody(t, body, "invalid_request_error", "route_not_allowed")
	}
	require.Empty(t, e.up.Requests())

	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/v1/models", ""},
		{"GET", "/threads/t1/v1/models/gpt-4o", ""},
		{"POST", "/v1/embeddings", `{"input":"x"}`},
		{"POST", "/v1/chat/completions", `{"messages":[]}`},
	} {
		resp, _ := e.do(rt.method, rt.path, alice, rt.body)
		require.Equal(t, 200, resp.StatusCode, rt)
	}
	e.up.Script(reply(cmpl("ok")))
	resp, _ := e.do("POST", "/v1/chat/completions", map[string]string{"Authorization": "Bearer sk-alice-secret", "X-Thread-Id": "t1",
		"OpenAI-Organization": "org-operator", "OpenAI-Project": "proj-operator", "api-key": "azure-key"}, `{"messages":[]}`)
	require.Equal(t, 200, resp.StatusCode)
	for _, r := range e.up.Requests() {
		require.Equal(t, "Bearer sk-operator", r.Header.Get("Authorization"))
		for _, h := range []string{"OpenAI-Organization", "OpenAI-Project", "Api-Key"} {
			require.Empty(t, r.Header.Get(h), "%s reached the upstream on %s", h, r.Path)
		}
	}

	// An operator's own list.
	routes, err := ParseAllowedRoutes("GET /v1/files/*, POST /v1/chat/completions")
	require.NoError(t, err)
	e2 := setup(t, func(o *Options) { o.ClientKeys, o.UpstreamAPIKey, o.PassThroughRoutes = keys, "sk-operator", routes })
	e2.up.Fallback = reply(`{}`)
	for path, want := range map[string]int{"/v1/files/f1": 200, "/threads/t/v1/files/f1/content": 200, "/v1/files": 403, "/v1/models": 403} {
		resp, _ := e2.do("GET", path, alice, "")
		require.Equal(t, want, resp.StatusCode, path)
	}
	gemini, err := ParseAllowedRoutes("GET /v1beta/models/*")
	require.NoError(t, err, "the Gemini API's routes may be named")
	require.True(t, gemini.Allows("GET", "/v1beta/models/gemini-3"))
	for _, bad := range []string{"get /v1/x", "GET v1/x", "GET /v2/x", "GET /v1/*/x", "GET", "GET /v1betax/y"} {
		_, err := ParseAllowedRoutes(bad)
		require.Error(t, err, bad)
	}
}

// TestClientHeadersNotForwarded: the client's network headers and the proxy's own (the thread's
// placement and parents among them) never reach the upstream, on thread turns and pass-through
// alike; two thread headers that differ are a
// thread_mismatch, an empty one counts as absent; the admin scheme is case-insensitive.
func TestClientHeadersNotForwarded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Fallback = reply(cmpl("ok"))
	h := map[string]string{"Forwarded": "for=10.0.0.1", "X-Forwarded-For": "10.0.0.1", "X-Forwarded-Host": "internal",
		"X-Real-IP": "10.0.0.1", "X-Workspace-Placement": "system", "X-Workspace-Parents": "hdrs-parent"}
	for _, thread := range []string{"", "hdrs"} {
		hh := map[string]string{"X-Thread-Id": thread}
		for k, v := range h {
			hh[k] = v
		}
		resp, _ := e.do("POST", "/v1/chat/completions", hh, `{"messages":[]}`)
		require.Equal(t, 200, resp.StatusCode)
		got := e.up.Requests()
		for k := range h {
			require.Empty(t, got[len(got)-1].Header.Get(k), "%s reached the upstream (thread %q)", k, thread)
		}
	}

	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"messages":[]}`))
	req.Header.Add("X-Thread-Id", "a")
	req.Header.Add("X-Thread-Id", "b")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "invalid_request_error", "thread_mismatch")

	req, _ = http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"messages":[]}`))
	req.Header.Add("X-Thread-Id", "")
	req.Header.Add("X-Thread-Id", "second")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	testkit.ReadBody(t, resp)
	require.Equal(t, "second", resp.Header.Get("X-Thread-Id"), "an empty first header does not turn the workspace off")

	resp, body := e.do("POST", "/v1/chat/completions", map[string]string{"X-Thread-Id": "t", "X-Workspace-Placement": "middle"}, `{"messages":[]}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	testkit.RequireErrorBody(t, body, "invalid_request_error", "invalid_placement")

	for _, scheme := range []string{"bearer", "BEARER", "Bearer"} {
		resp, _ := e.do("GET", "/admin/v1/threads", map[string]string{"Authorization": scheme + " " + adminToken}, "")
		require.Equal(t, 200, resp.StatusCode, scheme)
	}
}

// TestErrorsInOneShape: a path a route serves for other methods is 405 method_not_allowed in the
// JSON envelope with Allow, on the edge and on the admin REST; a body that is not JSON names the
// byte where it breaks; an unknown thread or item on the admin REST is named.
func TestErrorsInOneShape(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, c := range []struct{ method, path, allow string }{
		{"POST", "/healthz", "GET, HEAD"},
		{"DELETE", "/metrics", "GET, HEAD"},
		{"PUT", "/admin/v1/threads/t/preferences", "POST"},
	} {
		resp, body := e.do(c.method, c.path, map[string]string{"Authorization": "Bearer " + adminToken}, "")
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s: %s", c.method, c.path, body)
		require.Equal(t, c.allow, resp.Header.Get("Allow"), c.path)
		require.Contains(t, testkit.RequireErrorBody(t, body, "invalid_request_error", "method_not_allowed")["message"], c.allow)
	}
	resp, body := e.do("GET", "/nowhere", nil, "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	testkit.RequireErrorBody(t, body, "invalid_request_error", "not_found")

	resp, body = e.do("POST", "/v1/chat/completions", map[string]string{"X-Thread-Id": "t"}, `{"messages": [}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, "the request body is not valid JSON: invalid character '}' looking for beginning of value at byte 15",
		testkit.RequireErrorBody(t, body, "invalid_request_error", "invalid_json")["message"])
	resp, body = e.do("POST", "/admin/v1/threads/t/preferences", map[string]string{"Authorization": "Bearer " + adminToken}, `{"title": "x"`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, testkit.RequireErrorBody(t, body, "invalid_request_error", "invalid_json")["message"], "at byte 13")

	auth := map[string]string{"Authorization": "Bearer " + adminToken}
	resp, body = e.do("GET", "/admin/v1/threads/no-such-thread", auth, "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	require.Equal(t, `no thread "no-such-thread"`, testkit.RequireErrorBody(t, body, "invalid_request_error", "not_found")["message"])
	e.admin("POST", "/admin/v1/threads/known/preferences", map[string]any{"title": "x"}, http.StatusCreated, nil)
	resp, body = e.do("DELETE", "/admin/v1/threads/known/preferences/999", auth, "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	require.Equal(t, `thread "known" has no preference "999"`, testkit.RequireErrorBody(t, body, "invalid_request_error", "not_found")["message"])
}

// TestThreadPathEscapeRefused: every route that builds its upstream path from the client's
// bytes refuses a path with a dot segment as the pass-through does — a Gemini thread turn,
// streamed or not, a count, a side request — before anything reaches the upstream with the
// operator's key (docs/spec.md §10); an escaped slash in a model name goes on escaped, and the
// metrics' model label carries it escaped, never decoded.
func TestThreadPathEscapeRefused(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret-0123456789")
	require.NoError(t, err)
	e := setup(t, withGemini("AIza-operator"), func(o *Options) { o.ClientKeys = keys })
	e.up.Fallback = upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiText("Hi.")}})
	alice := map[string]string{"X-Goog-Api-Key": "sk-alice-secret-0123456789", "Content-Type": "application/json"}
	turn := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`
	side := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"responseMimeType":"application/json"}}`
	for _, c := range []struct{ path, body string }{
		{"/threads/g2/v1beta/models/..%2f..%2f..%2fx:generateContent", turn},
		{"/threads/g2/v1beta/models/..%2f..%2f..%2fx:streamGenerateContent?alt=sse", turn},
		{"/threads/g2/v1beta/models/..%2f..%2f..%2fx:countTokens", turn},
		{"/threads/g2/v1beta/models/..%2f..%2f..%2fx:generateContent", side},
		{"/threads/g2/v1beta/models/..%5C..%5Cx:generateContent", turn},
		{"/threads/g2/v1beta/models/%2E%2E%2F%2E%2E%2Fx:generateContent", turn},
		{"/v1beta/models/..%2f..%2fx:generateContent", turn},
	} {
		resp, body := e.do("POST", c.path, alice, c.body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", c.path, body)
		require.Contains(t, body, `"status":"INVALID_ARGUMENT"`, c.path)
		require.Contains(t, body, "dot segment", c.path)
	}
	require.Empty(t, e.up.Requests(), "nothing reached the upstream")

	resp, body := e.do("POST", "/threads/g2/v1beta/models/tuned%2Fm1:generateContent", alice, turn)
	require.Equal(t, 200, resp.StatusCode, body)
	require.Equal(t, "/v1beta/models/tuned%2Fm1:generateContent", e.up.Requests()[0].Path)
	text := scrape(t, e)
	require.NotContains(t, text, `model="tuned/m1"`, "the model label is never decoded path text")
	require.Contains(t, text, `model="tuned%2Fm1"`)
}
