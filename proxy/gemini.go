package proxy

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/turn"
)

// DefaultGeminiUpstreamURL is Google's Gemini API, the upstream of the Gemini API's routes when
// none is configured (docs/spec.md §18).
const DefaultGeminiUpstreamURL = "https://generativelanguage.googleapis.com"

// geminiAPI is Google's Gemini API (docs/spec.md §18) toward its upstream
// (GEMINI_UPSTREAM_BASE_URL): generateContent and streamGenerateContent as thread turns,
// countTokens counting what the model will see, every other /v1beta route (embedContent, the
// models, files, caches) a pass-through; its errors in Google's shape, the operator's key in
// x-goog-api-key, a client's key there or in ?key=.
var geminiAPI = wireAPI{
	name:       Gemini,
	defaultURL: DefaultGeminiUpstreamURL,
	provider:   "gcp.gemini",
	urlSetting: "GEMINI_UPSTREAM_BASE_URL",
	keySetting: "GEMINI_UPSTREAM_API_KEY",
	// ServeMux's wildcards are whole segments: {call} is "{model}:{method}".
	routes:      []apiRoute{{"POST /v1beta/models/{call}", (*Server).gemini}},
	passThrough: []string{"/v1beta/"},
	setKey: func(h http.Header, key string) {
		h.Del("Authorization")
		h.Set("X-Goog-Api-Key", key)
	},
	clientKey: func(r *http.Request) string {
		if k := r.Header.Get("X-Goog-Api-Key"); k != "" {
			return k
		}
		return r.URL.Query().Get("key")
	},
	query: geminiQuery,
	shape: turn.GeminiError,
}

// geminiQuery is the query that goes upstream: the client's (alt=sse among it), less its key
// when the credential is not the upstream's (ownKey).
func geminiQuery(r *http.Request, ownKey bool) string {
	if !ownKey || !strings.Contains(r.URL.RawQuery, "key") {
		return r.URL.RawQuery
	}
	q := r.URL.Query()
	if !q.Has("key") {
		return r.URL.RawQuery
	}
	q.Del("key")
	return q.Encode()
}

// geminiCall splits a models/{call} segment into its model and method at its last ':'.
func geminiCall(call string) (model, method string) {
	i := strings.LastIndexByte(call, ':')
	if i < 0 {
		return call, ""
	}
	return call[:i], call[i+1:]
}

// gemini serves POST /v1beta/models/{model}:{method} and its thread-path form (docs/spec.md
// §18): generateContent and streamGenerateContent are thread turns when a thread is named,
// countTokens a count of what the model will see; any other method, and any request without a
// thread, a pass-through to the Gemini upstream.
func (s *Server) gemini(w http.ResponseWriter, r *http.Request) {
	model, method := geminiCall(r.PathValue("call"))
	// The model goes on as a path segment escapes it (it went upstream so): the metrics' model
	// label, the spans and a count's body never carry decoded path text ("/" as %2F).
	model = url.PathEscape(model)
	switch method {
	case "generateContent", "streamGenerateContent":
	case "countTokens":
		countTokens(s, w, r, func(b []byte) (turn.Counted, error) { return turn.ParseGeminiCount(b, model) })
		return
	default:
		s.passThrough(w, r)
		return
	}
	streamed := method == "streamGenerateContent"
	in, req, ok := turnRequest(s, w, r, s.forwardBody, func(b []byte) (*turn.GeminiRequest, error) {
		return turn.ParseGeminiRequest(b, model, streamed)
	})
	defer in.release()
	if !ok {
		return
	}
	if streamed && req.Kind() == turn.KindTurn {
		// The turn reads server-sent events: a client that asked for the JSON-array stream
		// gets them too (Google's SDKs always ask for alt=sse).
		q := r.URL.Query()
		if q.Get("alt") != "sse" {
			q.Set("alt", "sse")
			r.URL.RawQuery = q.Encode()
		}
	}
	s.serveTurn(w, r, in, req, s.opts.Store.Workspace(in.thread), s.turnUpstream(r), nil)
}
