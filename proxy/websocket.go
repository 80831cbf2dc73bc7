package proxy

import (
	"net/http"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
)

// The Responses API over WebSocket (docs/spec.md §18). Codex CLI tries a WebSocket upgrade on
// /v1/responses first when its provider has supports_websockets (its own OpenAI provider does; a
// custom provider only when configured so), and falls back to HTTP. wsproxy does not serve
// Responses over WebSocket: it refuses the upgrade at once with 426, the one status on which
// Codex switches to HTTP without retrying (codex-rs/core/src/client.rs, stream_responses_websocket:
// `Err(ApiError::Transport(TransportError::Http { status, .. })) if status ==
// StatusCode::UPGRADE_REQUIRED => return Ok(WebsocketStreamOutcome::FallbackToHttp)`; any other
// failure is retried, stream_max_retries times, before it falls back). Codex 0.171 shows it:
// one upgrade a session, then its turn over HTTP (TestCodexWebSocketFallsBackAtOnce). The 426
// offers no protocol to upgrade to (no Upgrade header): the answer is "use plain HTTP".

// refuseWebSocket serves GET /v1/responses (and its thread-path form): the refusal of a
// WebSocket upgrade; any other GET goes on to the pass-through as before.
func (s *Server) refuseWebSocket(w http.ResponseWriter, r *http.Request) {
	if !isWebSocketUpgrade(r) {
		s.passThrough(w, r)
		return
	}
	apierr.Write(w, r, s.log, &apierr.Error{Status: http.StatusUpgradeRequired, Type: "invalid_request_error", Code: "websocket_not_supported",
		Message: "wsproxy serves the Responses API over HTTP only: send POST " + r.URL.Path + " instead of a WebSocket upgrade"})
}

// isWebSocketUpgrade reports whether r asks to upgrade its connection to WebSocket (RFC 6455
// §4.1: Upgrade holds the token websocket, case-insensitively, among others perhaps).
func isWebSocketUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Upgrade") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "websocket") {
				return true
			}
		}
	}
	return false
}
