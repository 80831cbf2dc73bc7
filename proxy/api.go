package proxy

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
)

// wireAPIs are the wire APIs wsproxy serves, one descriptor each; the routes are registered from
// them. A new API is a dialect in proxy/internal/turn, a descriptor in a file of its own here,
// and a line in this list (CONTRIBUTING.md, "Adding a wire dialect").
var wireAPIs = []*wireAPI{&openAIAPI, &messagesAPI, &geminiAPI}

// API names a wire API: its upstream's key in Options.Upstreams.
type API string

// The wire APIs wsproxy serves.
const (
	// OpenAI is OpenAI's APIs (chat completions, Responses, every other /v1 route), whose
	// upstream is UPSTREAM_BASE_URL's.
	OpenAI API = "openai"
	// Anthropic is Anthropic's Messages API (docs/spec.md §14).
	Anthropic API = "anthropic"
	// Gemini is Google's Gemini API (docs/spec.md §18).
	Gemini API = "gemini"
)

// APIUpstream is what configures one wire API's upstream: the names of its settings and the
// base URL it takes when none is set. cmd/proxy reads each API's settings through it.
type APIUpstream struct {
	API API
	// URLSetting and KeySetting name the settings of the upstream's base URL and of the
	// operator's key there (ANTHROPIC_UPSTREAM_BASE_URL, ANTHROPIC_UPSTREAM_API_KEY).
	URLSetting, KeySetting string
	// DefaultURL is the provider's own API, the base URL when none is configured.
	DefaultURL string
	// Prefix is the part of the API's paths its base URL holds ("/v1" for OpenAI's, "" for the
	// others): a server that serves every API at one root (the demo model) is its base URL
	// with Prefix.
	Prefix string
}

// APIUpstreams are the upstreams of the wire APIs, one per API of wireAPIs in its order
// (OpenAI's first).
func APIUpstreams() []APIUpstream {
	ups := make([]APIUpstream, len(wireAPIs))
	for i, a := range wireAPIs {
		ups[i] = APIUpstream{API: a.name, URLSetting: a.urlSetting, KeySetting: a.keySetting, DefaultURL: a.defaultURL, Prefix: a.prefix}
	}
	return ups
}

// wireAPI is what the edge knows of one wire API: its routes, its upstream (where it is, how
// the operator's key goes there, which of the client's query goes on), where its clients'
// keys may come, the shape of its errors, and its provider's name on the rounds' spans. The
// rest — the request's reading and rewriting, the rounds, what the client gets — is its dialect
// in proxy/internal/turn.
type wireAPI struct {
	// name is the API's name: the key of its upstream in Options.Upstreams.
	name API
	// defaultURL is the upstream's base URL when none is configured: the provider's own API,
	// whose spans name provider.
	defaultURL, provider string
	// urlSetting and keySetting are the settings of the upstream's base URL and of the
	// operator's key there (APIUpstreams; keySetting also names it in errors).
	urlSetting, keySetting string
	// prefix is the part of the client's path the upstream's base URL already holds ("/v1" for
	// OpenAI's, whose base URLs end in /v1; "" for the others): the upstream's path is the
	// base URL's, then the client's path (less /threads/{thread}) after prefix.
	prefix string
	// routes are the API's own routes; each is served also under /threads/{thread}.
	routes []apiRoute
	// passThrough are the path prefixes (each served also under /threads/{thread}) forwarded to
	// the API's upstream as they are (but for the headers headers.go strips).
	passThrough []string
	// setKey puts the operator's key in a request toward the upstream, in place of the client's
	// credentials.
	setKey func(h http.Header, key string)
	// clientKey, when set, finds a client's wsproxy key where the API's clients send theirs,
	// when the request has no bearer token (Anthropic's x-api-key, Google's x-goog-api-key).
	clientKey func(r *http.Request) string
	// query, when set, is the query string that goes upstream with a request of the API's
	// routes (nil: none for a thread turn, the client's for a pass-through). ownKey tells that a
	// credential in the query is not the upstream's (client keys are on, or the operator's key
	// goes upstream): it then stays with wsproxy.
	query func(r *http.Request, ownKey bool) string
	// shape is the API's error body (nil: OpenAI's).
	shape apierr.Shape
}

// apiRoute is one route of a wire API: a method and path (ServeMux's pattern, without
// /threads/{thread}) and its handler.
type apiRoute struct {
	pattern string
	serve   func(s *Server, w http.ResponseWriter, r *http.Request)
}

// register adds every route of the wire APIs to mux, each also under /threads/{thread}, with the
// request marked as the API's (apiOf).
func (s *Server) registerAPIs(mux *http.ServeMux) {
	for _, a := range wireAPIs {
		handle := func(pattern string, serve func(s *Server, w http.ResponseWriter, r *http.Request)) {
			h := func(w http.ResponseWriter, r *http.Request) { serve(s, w, a.mark(r)) }
			method, path, ok := strings.Cut(pattern, " ")
			if !ok {
				method, path = "", pattern
			}
			mux.HandleFunc(pattern, h)
			mux.HandleFunc(strings.TrimSpace(method+" /threads/{thread}"+path), h)
		}
		for _, rt := range a.routes {
			handle(rt.pattern, rt.serve)
		}
		for _, p := range a.passThrough {
			handle(p, (*Server).passThrough)
		}
	}
}

type apiKey struct{}

// mark marks r as a request of a: its errors take a's shape, and apiOf finds a.
func (a *wireAPI) mark(r *http.Request) *http.Request {
	if a.shape != nil {
		r = apierr.WithShape(r, a.shape)
	}
	return r.WithContext(context.WithValue(r.Context(), apiKey{}, a))
}

// apiOf is the wire API of a request of its routes (nil for any other).
func apiOf(r *http.Request) *wireAPI {
	a, _ := r.Context().Value(apiKey{}).(*wireAPI)
	return a
}

// Upstream is where one wire API's requests go (its base URL) and the operator's key there (empty:
// the client's credentials go on).
type Upstream struct {
	URL    *url.URL
	APIKey string
}

// upstream is a's upstream as configured, its default filled in (withDefaults).
func (s *Server) upstream(a *wireAPI) Upstream { return s.opts.Upstreams[a.name] }

// providerOf is the gen_ai.provider.name of a's upstream u: the provider's for its own API, else
// the upstream's host.
func (a *wireAPI) providerOf(u *url.URL) string {
	if strings.TrimSuffix(u.String(), "/") == a.defaultURL {
		return a.provider
	}
	return u.Hostname()
}

// apiPath is the path of a request (escaped) without its /threads/{thread}: the path in its
// API's terms, as PASSTHROUGH_ROUTES names it.
func apiPath(escaped string) string {
	if rest, ok := strings.CutPrefix(escaped, "/threads/"); ok {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return rest[i:]
		}
	}
	return escaped
}

// upstreamRequest is where a request of a goes: its upstream's URL for the request's path (as
// the client escaped it, which inbound checked: pathAllowed), with the query a.query says (a
// thread turn's: none without it; a pass-through's: the client's); it strips h, the request's
// header toward it, of what headers.go strips and sets the operator's key there.
func (s *Server) upstreamRequest(a *wireAPI, r *http.Request, h http.Header, passThrough bool) (*url.URL, Upstream) {
	up := s.upstream(a)
	query := ""
	switch {
	case a.query != nil:
		query = a.query(r, s.opts.ClientKeys.On() || up.APIKey != "")
	case passThrough:
		query = r.URL.RawQuery
	}
	s.strip(h)
	if up.APIKey != "" {
		a.setKey(h, up.APIKey)
	}
	return upstreamURL(up.URL, strings.TrimPrefix(apiPath(r.URL.EscapedPath()), a.prefix), query), up
}

// turnUpstream is the upstream of a thread turn, at the request's path toward its API's
// upstream: the client's headers and, as the API's query says, query go on, less what
// headers.go strips. A keyless upstream (a local one) is legitimate: with client keys and no
// key of the operator's the request carries none, and the upstream's 401 is the operator's.
func (s *Server) turnUpstream(r *http.Request) *clientUpstream {
	a, h := apiOf(r), rewrittenHeader(r.Header)
	u, up := s.upstreamRequest(a, r, h, false)
	h.Set("Content-Type", "application/json") // every round's body is JSON
	c := &clientUpstream{transport: s.transport, url: u.String(), header: h, tracing: s.tracing, back: s.fromUpstream(),
		provider: a.providerOf(up.URL)}
	if s.opts.ClientKeys.On() && up.APIKey == "" {
		c.keyless = a.keySetting
	}
	return c
}

// bearerKey sets the operator's key as a bearer token (OpenAI's APIs).
func bearerKey(h http.Header, key string) { h.Set("Authorization", "Bearer "+key) }
