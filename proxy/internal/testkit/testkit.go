// Package testkit holds what the tests of proxy, proxy/internal/admin and proxy/internal/mcp
// share: calls of the admin REST, a thread's workspace read from the store, the error body every
// surface answers with, a browser-like panel client, an admin event stream read event by event,
// and the Go SDK's MCP client. Each package keeps its own env (its server on a fresh schema); what
// the env does over HTTP it does through this kit. Tests only import it: no room's row in
// docs/architecture.md's table allows it (TestRoomsImports).
package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/workspace"
)

// AdminToken is the admin token of every test server.
const AdminToken = "test-admin-token"

// Call sends method path to base with body as JSON (nil: no body) and the admin token: the
// answer's status and body.
func Call(t testing.TB, base, method, path string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Admin calls the admin REST at base and decodes the JSON answer into out (when not nil); an
// answer of another status than wantStatus fails the test.
func Admin(t testing.TB, base, method, path string, body any, wantStatus int, out any) {
	t.Helper()
	status, b := Call(t, base, method, path, body)
	require.Equal(t, wantStatus, status, "%s %s: %s", method, path, b)
	if out != nil {
		require.NoError(t, json.Unmarshal([]byte(b), out), b)
	}
}

// WS is the workspace of thread, named in its stored form (client~thread for a client's).
func WS(t testing.TB, store *workspace.Store, thread string) *workspace.Workspace {
	t.Helper()
	id, err := workspace.ParseThreadID(thread)
	require.NoError(t, err)
	return store.Workspace(id)
}

// Workspace reads the workspace of thread (stored form).
func Workspace(t testing.TB, store *workspace.Store, thread string) workspace.Detail {
	t.Helper()
	d, err := WS(t, store, thread).Get(context.Background())
	require.NoError(t, err)
	return d
}

// Titles are the titles of thread's preferences, in order.
func Titles(t testing.TB, store *workspace.Store, thread string) []string {
	t.Helper()
	var out []string
	for _, p := range Workspace(t, store, thread).Preferences {
		out = append(out, p.Title)
	}
	return out
}

// ReadBody reads resp's body whole.
func ReadBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// ReadAll is a room's Options.ReadBody without the edge's limits.
func ReadAll(_ http.ResponseWriter, r *http.Request) ([]byte, func(), error) {
	b, err := io.ReadAll(r.Body)
	return b, func() {}, err
}

// ClientKeys are the client keys of CLIENT_KEYS spec.
func ClientKeys(t testing.TB, spec string) *auth.ClientKeys {
	keys, err := auth.ParseClientKeys(spec)
	require.NoError(t, err)
	return keys
}

// RequireErrorBody checks that body is an error of type typ and code code in OpenAI's shape,
// with a message and a param, and returns it.
func RequireErrorBody(t *testing.T, body, typ, code string) map[string]any {
	t.Helper()
	var eb struct {
		Error map[string]any `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &eb), body)
	require.Equal(t, typ, eb.Error["type"], body)
	require.Equal(t, code, eb.Error["code"], body)
	require.NotEmpty(t, eb.Error["message"])
	require.Contains(t, eb.Error, "param")
	return eb.Error
}
