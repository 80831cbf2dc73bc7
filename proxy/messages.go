package proxy

import (
	"io"
	"net/http"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
)

// DefaultAnthropicUpstreamURL is Anthropic's API, the upstream of the Messages API's routes
// when none is configured (docs/spec.md §14).
const DefaultAnthropicUpstreamURL = "https://api.anthropic.com"

// messagesRoute marks a request of the Messages API's routes: its errors take Anthropic's shape,
// its client key may come in x-api-key, and its upstream is the Anthropic upstream.
func messagesRoute(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { h(w, apierr.WithAnthropicShape(r)) }
}

// isMessagesRoute reports a request messagesRoute marked.
func isMessagesRoute(r *http.Request) bool { return apierr.Anthropic(r.Context()) }

// messages serves POST /v1/messages and its thread-path form (docs/spec.md §14): a thread turn
// of the Messages API when a thread is named, else a pass-through to the Anthropic upstream.
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	in, req, ok := turnRequest(s, w, r, s.forwardBody, turn.ParseMessagesRequest)
	defer in.release()
	if !ok {
		return
	}
	s.serveTurn(w, r, in, req, s.opts.Store.Workspace(in.thread), s.messagesUpstream(r, "/v1/messages"), s.messagesRunner, nil)
}

// countTokens serves POST /v1/messages/count_tokens and its thread-path form (docs/spec.md
// §14): with a thread, the request goes upstream as the turn's first round would (the five
// tools after the client's, the workspace as it stands now where the placement puts it), so the
// client counts what the model will see; no turn is counted and no thread is made. Without one,
// a pass-through.
func (s *Server) countTokens(w http.ResponseWriter, r *http.Request) {
	in, req, ok := turnRequest(s, w, r, s.forwardBody, turn.ParseMessagesRequest)
	defer in.release()
	if !ok {
		return
	}
	block, err := s.opts.Store.Workspace(in.thread).Block(r.Context())
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	body := req.CountBody(s.workspaceText(in.placement, block), in.placement)
	resp, err := s.messagesUpstream(r, "/v1/messages/count_tokens").Post(r.Context(), body)
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	defer resp.Body.Close()
	h := w.Header()
	apierr.CopyHeader(h, responseHeader(resp.Header))
	h.Set(threadHeader, in.thread.Name)
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, resp.Body)
}

// messagesUpstream is the Anthropic upstream of one client request, at path: the client's query
// string (Claude Code sends ?beta=true) and headers (anthropic-version and anthropic-beta among
// them) go on, less what messagesHeader removes. A keyless upstream (a local one) is
// legitimate: with client keys and no ANTHROPIC_UPSTREAM_API_KEY the request carries no key.
func (s *Server) messagesUpstream(r *http.Request, path string) *clientUpstream {
	h := rewrittenHeader(r.Header)
	s.messagesHeader(h)
	u := &clientUpstream{client: s.client, url: upstreamURL(s.opts.AnthropicUpstreamURL, path, r.URL.RawQuery).String(),
		header: h, tracing: s.tracing, back: s.fromUpstream()}
	if s.opts.ClientKeys != nil && s.opts.AnthropicUpstreamAPIKey == "" {
		u.keyless = "ANTHROPIC_UPSTREAM_API_KEY"
	}
	return u
}

// messagesHeader is stripHeaders for the Anthropic upstream: the same headers go, and the
// operator's ANTHROPIC_UPSTREAM_API_KEY, when set, goes in x-api-key in place of the client's
// x-api-key and Authorization.
func (s *Server) messagesHeader(h http.Header) {
	s.strip(h)
	if s.opts.AnthropicUpstreamAPIKey != "" {
		h.Del("Authorization")
		h.Set("X-Api-Key", s.opts.AnthropicUpstreamAPIKey)
	}
}

// rewriteMessagesPassThrough points a pass-through of the Messages API's routes at the
// Anthropic upstream.
func (s *Server) rewriteMessagesPassThrough(out *http.Request, in *http.Request) {
	out.URL = upstreamURL(s.opts.AnthropicUpstreamURL, "/v1"+restOfPath(in.URL.EscapedPath()), in.URL.RawQuery)
	s.messagesHeader(out.Header)
}

// anthropicKeyHeader is where the Messages API's clients send their key.
const anthropicKeyHeader = "X-Api-Key"

// clientKey is the client key a request carries: its bearer token, or on the Messages API's
// routes its x-api-key (Anthropic's SDKs send their key there, Claude Code's
// ANTHROPIC_AUTH_TOKEN as a bearer token).
func clientKey(r *http.Request) (string, bool) {
	if key, ok := auth.BearerToken(r); ok {
		return key, true
	}
	if isMessagesRoute(r) {
		if key := r.Header.Get(anthropicKeyHeader); key != "" {
			return key, true
		}
	}
	return "", false
}
