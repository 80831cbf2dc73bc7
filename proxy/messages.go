package proxy

import (
	"net/http"

	"github.com/wsproxy/wsproxy/proxy/internal/turn"
)

// DefaultAnthropicUpstreamURL is Anthropic's API, the upstream of the Messages API's routes
// when none is configured (docs/spec.md §14).
const DefaultAnthropicUpstreamURL = "https://api.anthropic.com"

// messagesAPI is Anthropic's Messages API (docs/spec.md §14) toward its upstream
// (ANTHROPIC_UPSTREAM_BASE_URL): its errors in Anthropic's shape, its client key also in
// x-api-key (Anthropic's SDKs send their key there, Claude Code's ANTHROPIC_AUTH_TOKEN as a bearer
// token), the client's query on (Claude Code sends ?beta=true), and anthropic-version and
// anthropic-beta among the headers that go on.
var messagesAPI = wireAPI{
	name:       Anthropic,
	defaultURL: DefaultAnthropicUpstreamURL,
	provider:   "anthropic",
	urlSetting: "ANTHROPIC_UPSTREAM_BASE_URL",
	keySetting: "ANTHROPIC_UPSTREAM_API_KEY",
	routes: []apiRoute{
		{"POST /v1/messages", (*Server).messages},
		{"POST /v1/messages/count_tokens", func(s *Server, w http.ResponseWriter, r *http.Request) {
			countTokens(s, w, r, turn.ParseMessagesRequest)
		}},
	},
	// The operator's key goes in x-api-key, in place of the client's x-api-key and Authorization
	// (strip removes both with client keys).
	setKey: func(h http.Header, key string) {
		h.Del("Authorization")
		h.Set("X-Api-Key", key)
	},
	clientKey: func(r *http.Request) string { return r.Header.Get("X-Api-Key") },
	query:     func(r *http.Request, _ bool) string { return r.URL.RawQuery },
	shape:     turn.MessagesError,
}

// messages serves POST /v1/messages and its thread-path form (docs/spec.md §14): a thread turn
// of the Messages API when a thread is named, else a pass-through to the Anthropic upstream.
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	in, req, ok := turnRequest(s, w, r, s.forwardBody, turn.ParseMessagesRequest)
	defer in.release()
	if !ok {
		return
	}
	s.serveTurn(w, r, in, req, s.opts.Store.Workspace(in.thread), s.turnUpstream(r), nil)
}
