package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
)

// copyBuffers recycles the 32 KB buffers ReverseProxy copies response bodies with.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte { return *copyBufferPool.Get().(*[]byte) }

func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

// passThrough forwards any other /v1 request to the upstream unchanged.
func (s *Server) passThrough(w http.ResponseWriter, r *http.Request) {
	in, err := s.inbound(w, r, s.passThroughAllowed)
	defer in.release()
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	s.forward(w, r, in.body)
}

// forward sends the request with body to the upstream and its response back, both unchanged.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, body []byte) {
	if s.counter != nil {
		body = s.tapUsage(r, body) // its answer's tokens count for its client
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body = http.NoBody
	}
	s.reverse.ServeHTTP(w, r)
}

func (s *Server) rewritePassThrough(pr *httputil.ProxyRequest) {
	// The path goes on as the client escaped it (%2F stays %2F); pathAllowed refused any path
	// with dot segments.
	u, up := s.upstreamRequest(apiOf(pr.In), pr.In, pr.Out.Header, true)
	pr.Out.URL = u
	pr.Out.Host = ""
	if pr.Out.Body != nil {
		// ReverseProxy wraps the body it passes on so that the transport's Close cannot reach
		// the client's; net/http then flushes the request's head in a write of its own. forward
		// gave the request its body in memory (an io.NopCloser of a *bytes.Reader), which needs
		// no such guard: passed on as it is, it goes in one write with the head.
		pr.Out.Body = pr.In.Body
	}
	if up.APIKey != "" {
		// An error body is read for the key (fromUpstream): gzip is the one encoding it reads.
		if strings.Contains(strings.ToLower(pr.In.Header.Get("Accept-Encoding")), "gzip") {
			pr.Out.Header.Set("Accept-Encoding", "gzip")
		} else {
			pr.Out.Header.Del("Accept-Encoding")
		}
	}
	s.tracing.inject(pr.In.Context(), pr.Out.Header)
}

// pathAllowed checks the path of every request of the wire APIs, whose upstream path is built
// from the client's bytes (upstreamRequest: a thread turn's, a count's, a side request's, a
// bypassed turn's, a pass-through's), once its client is known (inbound). A path with a segment
// that decodes to "." or ".." (where "/" and "\" inside a segment also separate) is refused: an
// upstream, or a front, that resolves dot segments would serve a path outside its base URL with
// the operator's key (docs/spec.md §10). Anything else goes on as the client escaped it.
func pathAllowed(r *http.Request) error {
	for _, seg := range strings.Split(r.URL.EscapedPath(), "/") {
		decoded, err := url.PathUnescape(seg)
		if err != nil {
			return apierr.BadRequest("invalid_path", "", "the path is not a valid escaped URL path")
		}
		for _, part := range strings.FieldsFunc(decoded, func(r rune) bool { return r == '/' || r == '\\' }) {
			if part == "." || part == ".." {
				return apierr.BadRequest("invalid_path", "", "the path has a dot segment (. or ..); it is not forwarded")
			}
		}
	}
	return nil
}

// passThroughAllowed checks a request that is about to be forwarded as it is, once its client
// is known and its path checked (inbound: a client without a key learns nothing of the routes).
// CONNECT and TRACE are refused (a tunnel; an echo of the request, its credentials among them).
// With client keys, only the routes PASSTHROUGH_ROUTES allows are forwarded.
func (s *Server) passThroughAllowed(r *http.Request) error {
	if r.Method == http.MethodConnect || r.Method == http.MethodTrace {
		return &apierr.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
			Message: r.Method + " is not forwarded"}
	}
	if path := apiPath(r.URL.EscapedPath()); s.opts.ClientKeys.On() && !s.opts.PassThroughRoutes.Allows(r.Method, path) {
		return &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "route_not_allowed",
			Message: r.Method + " " + path + " is not among the routes this proxy forwards for its clients (PASSTHROUGH_ROUTES)"}
	}
	return nil
}
