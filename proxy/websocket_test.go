package proxy

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// TestWebSocketUpgradeRefused: a WebSocket upgrade on the Responses routes, with or without a
// thread, is answered at once with 426 in OpenAI's error shape (Codex's signal to use HTTP without
// retrying, docs/spec.md §18), and never reaches the upstream; a plain GET of the same path is
// still forwarded.
func TestWebSocketUpgradeRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, path := range []string{"/v1/responses", "/threads/codex-ws/v1/responses"} {
		req, err := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
		require.NoError(t, err)
		// The handshake as Codex 0.171 sends it (proxy/testdata/agents/codex-websocket-upgrade.json).
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "7k8Q/SWBNPnqR6P/2T6e3A==")
		req.Header.Set("OpenAI-Beta", "responses_websockets=2026-02-06")
		req.Header.Set("Authorization", "Bearer sk-client")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body := testkit.ReadBody(t, resp)
		resp.Body.Close()
		require.Equal(t, http.StatusUpgradeRequired, resp.StatusCode, path)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		var got struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Code    string  `json:"code"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &got), body)
		require.Equal(t, "invalid_request_error", got.Error.Type)
		require.Equal(t, "websocket_not_supported", got.Error.Code)
		require.Contains(t, got.Error.Message, "POST "+path)
	}
	require.Empty(t, e.up.Requests(), "an upgrade never reaches the upstream")

	// Several tokens, any case.
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/responses", nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "h2c, WebSocket")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUpgradeRequired, resp.StatusCode)

	e.up.Script(upstreamtest.JSON(http.StatusOK, `{"object":"list","data":[]}`))
	resp, err = http.Get(e.srv.URL + "/v1/responses")
	require.NoError(t, err)
	require.Equal(t, `{"object":"list","data":[]}`, testkit.ReadBody(t, resp))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, e.up.Requests(), 1)
	require.Equal(t, "GET /v1/responses", e.up.Requests()[0].Method+" "+e.up.Requests()[0].Path)
}
