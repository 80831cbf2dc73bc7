package proxy

import (
	"fmt"
	"net/http"
	"strings"
)

// DefaultPassThroughRoutes are the routes forwarded as they are for clients with keys: the
// models, embeddings, moderations, and chat, Responses, Messages and Gemini requests (and token
// counts, Gemini's embeddings) without a thread. Every route
// that reads or changes objects the upstream keeps under the operator's key (files, batches,
// stored completions and responses, vector stores, fine-tunes) is not among them, since the
// proxy cannot tell one client's objects from another's.
const DefaultPassThroughRoutes = "GET /v1/models,GET /v1/models/*,POST /v1/embeddings,POST /v1/chat/completions,POST /v1/responses,POST /v1/moderations,POST /v1/messages,POST /v1/messages/count_tokens," +
	"GET /v1beta/models,GET /v1beta/models/*,POST /v1beta/models/*"

// AllowedRoutes is a list of `METHOD /path` patterns (PASSTHROUGH_ROUTES): the method exactly, the
// path exactly or, ending in `*`, any path with that prefix. A path is matched in its API's form
// (/v1/…, /v1beta/…) whether the client used it or its /threads/{thread}/… form.
type AllowedRoutes struct {
	patterns []routePattern
}

type routePattern struct {
	method, path string
	prefix       bool
}

// ParseAllowedRoutes reads a comma-separated list of patterns.
func ParseAllowedRoutes(spec string) (*AllowedRoutes, error) {
	r := &AllowedRoutes{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		method, path, ok := strings.Cut(item, " ")
		path = strings.TrimSpace(path)
		if !ok || method == "" || method != strings.ToUpper(method) || !passThroughPath(path) {
			return nil, fmt.Errorf("%q: want METHOD /v1/path or /v1beta/path (a trailing * matches any rest)", item)
		}
		p := routePattern{method: method, path: path}
		if rest, ok := strings.CutSuffix(path, "*"); ok {
			p.path, p.prefix = rest, true
		}
		if strings.Contains(p.path, "*") {
			return nil, fmt.Errorf("%q: * may only end a path", item)
		}
		r.patterns = append(r.patterns, p)
	}
	return r, nil
}

// Allows reports whether a request of method to path (its /v1 form, escaped) may be forwarded.
// HEAD follows GET.
func (r *AllowedRoutes) Allows(method, path string) bool {
	if method == http.MethodHead {
		method = http.MethodGet
	}
	for _, p := range r.patterns {
		if p.method != method {
			continue
		}
		if p.path == path || (p.prefix && strings.HasPrefix(path, p.path)) {
			return true
		}
	}
	return false
}

// passThroughPath reports whether path lies under a wire API's pass-through prefix (/v1/,
// /v1beta/).
func passThroughPath(path string) bool {
	for _, a := range wireAPIs {
		for _, prefix := range a.passThrough {
			if strings.HasPrefix(path, prefix) {
				return true
			}
		}
	}
	return false
}
