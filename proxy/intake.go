package proxy

// The intake of a request of the wire APIs, in one pass: its client (its key, where its API's
// clients send it), the thread it names, its body under the budget, and for a thread turn its
// placement and request, parsed by its dialect.

import (
	"net/http"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/workspace"
)

// inbound is what a /v1 request brings: the thread it names (named false for none; thread then
// holds the client alone), its body and, for a thread turn, its placement. release returns the
// body's bytes to the budget.
type inbound struct {
	thread    workspace.ThreadID
	named     bool
	placement turn.Placement
	body      []byte
	release   func()
}

// inbound reads what every /v1 request brings: its client when there are client keys, its path
// (pathAllowed: every route builds its upstream path from it), the thread it names, and its
// body; the caller calls in.release when done with the body, whatever the error. check, when
// set, runs once the client and path are known, before anything else is read.
func (s *Server) inbound(w http.ResponseWriter, r *http.Request, check func(*http.Request) error) (in inbound, err error) {
	in.release = func() {}
	client, err := s.clientOf(r)
	if err != nil {
		return in, err
	}
	// The client goes on the request's log line now, so that a request refused below (a route
	// not allowed, a bad thread id) names it too.
	noteCaller(r.Context(), workspace.ThreadID{Client: client}, false)
	if err := pathAllowed(r); err != nil {
		return in, err
	}
	if check != nil {
		if err := check(r); err != nil {
			return in, err
		}
	}
	if in.thread, in.named, err = threadOf(r, client, s.opts.ThreadHeaders); err != nil {
		return in, err
	}
	noteCaller(r.Context(), in.thread, in.named)
	// Counted, or refused past a limit, before its body is read (docs/spec.md §20).
	if err := s.admit(client); err != nil {
		return in, err
	}
	in.body, in.release, err = s.readBody(w, r)
	return in, err
}

var errClientKey = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
	Message: "a valid wsproxy client key is required: Authorization: Bearer <key>, or where the API's clients send their key (x-api-key on /v1/messages; x-goog-api-key or ?key= on /v1beta)"}

// clientOf authenticates a request of the wire APIs (clientKey) and returns its client (""
// when client keys are off). A wrong key counts as a failed authentication of the client's
// address (throttled).
func (s *Server) clientOf(r *http.Request) (string, error) {
	if !s.opts.ClientKeys.On() {
		return "", nil
	}
	key, ok := clientKey(r)
	if !ok {
		return "", errClientKey
	}
	var name string
	err := s.guard.Attempt(r, func() bool {
		name, ok = s.guard.Client(key)
		return ok
	}, errClientKey)
	return name, err
}

// clientKey is the client key a request carries: its bearer token, else where its API's
// clients send theirs.
func clientKey(r *http.Request) (string, bool) {
	if key, ok := auth.BearerToken(r); ok {
		return key, true
	}
	if a := apiOf(r); a != nil && a.clientKey != nil {
		if key := a.clientKey(r); key != "" {
			return key, true
		}
	}
	return "", false
}

// placementOf is the request's placement: its X-Workspace-Placement header, else the
// configured one.
func (s *Server) placementOf(r *http.Request) (turn.Placement, error) {
	h := r.Header.Get(placementHeader)
	if h == "" {
		return s.opts.Placement, nil
	}
	p, err := turn.ParsePlacement(h)
	if err != nil {
		return "", apierr.BadRequest("invalid_placement", placementHeader, "%s: %s", placementHeader, err.Error())
	}
	return p, nil
}

// threadOf returns the thread a request names: the X-Thread-Id header or the path, else the
// first of the fallback headers (THREAD_HEADER's) it carries, for the request's client ("" without
// client keys). ok is false when it names none (the id then holds the client alone). Empty
// headers count as absent; two that differ, or a header and a path that differ, are a
// thread_mismatch.
func threadOf(r *http.Request, client string, fallbacks []string) (id workspace.ThreadID, ok bool, err error) {
	name, from := r.PathValue("thread"), threadHeader
	for _, h := range r.Header.Values(threadHeader) {
		switch {
		case h == "":
		case name == "":
			name = h
		case h != name:
			return workspace.ThreadID{}, false, apierr.BadRequest("thread_mismatch", threadHeader,
				"the %s headers and the path name different threads", threadHeader)
		}
	}
	for _, h := range fallbacks {
		if name != "" {
			break
		}
		name, from = r.Header.Get(h), h
	}
	if name == "" {
		return workspace.ThreadID{Client: client}, false, nil
	}
	if id, err = workspace.NewThreadID(client, name); err != nil {
		return workspace.ThreadID{}, false, apierr.BadRequest("invalid_thread_id", from, "%s", err.Error())
	}
	return id, true, nil
}

// parentsHeader names a thread's parents on any turn (docs/spec.md §17), nearest first,
// separated by commas.
const parentsHeader = "X-Workspace-Parents"

// parentsOf is what a request names of its thread's parents: X-Workspace-Parents, stored when
// they differ; else, for a thread named by a THREAD_HEADER header, THREAD_PARENTS, stored when the
// thread is new. Names are in the client's namespace, but ~name: a scope the admin shared with the
// client (docs/spec.md §20); an empty header names none. A list longer than
// workspace.MaxParentsBytes, or of more than workspace.MaxAncestors names, is refused before a name is
// parsed (docs/spec.md §17): what it costs is bounded whatever the header holds.
func (s *Server) parentsOf(r *http.Request, client string) (workspace.TurnOptions, error) {
	names, from, ifNew := r.Header.Values(parentsHeader), parentsHeader, false
	if len(names) == 0 && len(s.opts.ThreadParents) > 0 && len(s.opts.ThreadHeaders) > 0 && r.PathValue("thread") == "" &&
		r.Header.Get(threadHeader) == "" {
		names, from, ifNew = s.opts.ThreadParents, "THREAD_PARENTS", true
	}
	size := 0
	for _, v := range names {
		size += len(v)
	}
	if size > workspace.MaxParentsBytes {
		return workspace.TurnOptions{}, apierr.BadRequest("invalid_parents", from, "%s: %s", from, workspace.ErrParentsTooLong.Error())
	}
	var parents []workspace.ThreadID
	for _, v := range names {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name == "" {
				continue
			}
			if len(parents) == workspace.MaxAncestors {
				return workspace.TurnOptions{}, apierr.BadRequest("invalid_parents", from, "%s: %s", from, workspace.ErrTooManyParents.Error())
			}
			id, err := workspace.NewParentID(client, name)
			if err != nil {
				return workspace.TurnOptions{}, apierr.BadRequest("invalid_parents", from, "%s: %q: %s", from, name, err.Error())
			}
			parents = append(parents, id)
		}
	}
	if parents == nil {
		return workspace.TurnOptions{}, nil
	}
	return workspace.TurnOptions{Parents: parents, ParentsIfNew: ifNew}, nil
}

// forwardFunc passes a request that names no thread upstream, for its client ("" without client
// keys).
type forwardFunc func(w http.ResponseWriter, r *http.Request, client string, body []byte)

// forwardBody is the forwardFunc of the routes whose pass-through is the same for every client.
func (s *Server) forwardBody(w http.ResponseWriter, r *http.Request, _ string, body []byte) {
	s.forward(w, r, body)
}

// turnRequest reads a chat, Responses or Messages request and parses it: a thread turn's
// thread, placement, body and request. A request without a thread is passed to forward, and one
// that fails is answered; ok is then false. The caller calls in.release when done.
func turnRequest[R any](s *Server, w http.ResponseWriter, r *http.Request, forward forwardFunc, parse func([]byte) (R, error)) (in inbound, req R, ok bool) {
	in, err := s.inbound(w, r, nil)
	if err == nil && !in.named {
		if err = s.passThroughAllowed(r); err == nil {
			forward(w, r, in.thread.Client, in.body)
			return in, req, false
		}
	}
	if err == nil {
		in.placement, err = s.placementOf(r)
	}
	if err == nil {
		req, err = parse(in.body)
	}
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return in, req, false
	}
	return in, req, true
}
