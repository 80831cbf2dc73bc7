package mcp

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/eventhub"
	"github.com/wsproxy/wsproxy/workspace"
)

// scope is what a request's token may see (docs/spec.md §15): every thread (the admin token), a
// client's threads (a client key of CLIENT_KEYS), or one thread (a thread token).
type scope struct {
	admin   bool
	client  string             // a client key's client
	thread  workspace.ThreadID // a thread token's thread
	link    int64              // a thread token's link (workspace.Link)
	expires time.Time          // when a thread token expires
	key     string             // a thread token's key fingerprint (auth.Guard.Holds)
}

// bound reports whether the scope is one thread's.
func (sc scope) bound() bool { return sc.thread.Name != "" }

// resolve is the thread name names in the scope: for a thread token its thread (name empty or
// its stored form); for a client key the client's thread of that name (as its turns name it);
// for the admin token the thread of that stored form (client~id for a client's). A name outside
// the scope is an unknown thread: what a token may not see does not exist for it.
func (sc scope) resolve(name string) (workspace.ThreadID, error) {
	switch {
	case sc.bound():
		if name != "" && name != sc.thread.String() {
			return workspace.ThreadID{}, unknownThread(name)
		}
		return sc.thread, nil
	case name == "":
		return workspace.ThreadID{}, errThreadRequired
	case sc.admin:
		id, err := workspace.ParseThreadID(name)
		if err != nil {
			return workspace.ThreadID{}, fmt.Errorf("thread: %w (client~id for a client's thread)", err)
		}
		return id, nil
	case strings.Contains(name, "~"): // another client's namespace
		return workspace.ThreadID{}, unknownThread(name)
	}
	id, err := workspace.NewThreadID(sc.client, name)
	if err != nil {
		return workspace.ThreadID{}, fmt.Errorf("thread: %w", err)
	}
	return id, nil
}

// name is how the scope names a thread: a client its own thread by the id it gave, the admin
// token and a thread token by its stored form.
func (sc scope) name(id workspace.ThreadID) string {
	if sc.client != "" {
		return id.Name
	}
	return id.String()
}

// listPrefix is the stored ids' prefix of the threads the scope may list (not for a thread token).
func (sc scope) listPrefix() string {
	if sc.admin {
		return ""
	}
	return workspace.ThreadID{Client: sc.client}.String() // "client~"
}

func unknownThread(name string) error { return fmt.Errorf("unknown thread %q", name) }

var errThreadRequired = fmt.Errorf("thread is required: the thread whose workspace to read or change")

type scopeKey struct{}

func withScope(ctx context.Context, sc scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, sc)
}

// scopeFrom is the scope of the request ctx belongs to: the SDK derives the contexts of a
// request's handlers from the request's own (each request is a session of its own).
func scopeFrom(ctx context.Context) scope {
	sc, _ := ctx.Value(scopeKey{}).(scope)
	return sc
}

// authenticate is the scope of r's bearer token: the admin token, a client key, or a thread
// token that is signed, unexpired and not revoked. Anything else is a 401 in the shape of
// RFC 6750 (WWW-Authenticate: Bearer), counted against the client's address; a store that cannot
// say whether a thread token was revoked is a 503.
func (s *Server) authenticate(r *http.Request) (scope, error) {
	token, ok := auth.BearerToken(r)
	if !ok {
		return scope{}, unauthorized(`Bearer realm="wsproxy mcp"`)
	}
	var sc scope
	var storeErr error
	err := s.opts.Guard.Attempt(r, func() bool {
		if s.opts.Guard.IsAdmin(token) {
			sc.admin = true
			return true
		}
		if client, ok := s.opts.Guard.Client(token); ok {
			sc.client = client
			return true
		}
		t, ok := s.signer.VerifyThreadToken(auth.KindMCP, token)
		if !ok {
			return false
		}
		id, err := workspace.ParseThreadID(t.Thread)
		if err != nil {
			return false
		}
		sc.thread, sc.link, sc.expires, sc.key = id, t.ID, time.Unix(t.Expires, 0), t.Key
		valid, err := s.tokenHolds(r.Context(), sc)
		if err != nil {
			storeErr = err
			return true // not the token's failure
		}
		return valid
	}, unauthorized(`Bearer realm="wsproxy mcp", error="invalid_token"`))
	if storeErr != nil {
		return scope{}, storeErr
	}
	return sc, err
}

// tokenHolds reports whether a thread token's scope still holds: its link neither revoked nor
// expired, its thread not deleted, and the keys of the thread's client (if any) it was made under
// still the client's (auth.Guard.Holds).
func (s *Server) tokenHolds(ctx context.Context, sc scope) (bool, error) {
	if !s.opts.Guard.Holds(sc.thread.Client, sc.key) {
		return false, nil
	}
	return s.opts.Store.Workspace(sc.thread).LinkValid(ctx, workspace.LinkMCP, sc.link)
}

// endWithToken cancels a thread token's request (a subscriptions/listen stream) once its token
// no longer holds: at its expiry, or when a change of its thread or a heartbeat finds it revoked.
// It returns when ctx ends.
func (s *Server) endWithToken(ctx context.Context, cancel context.CancelFunc, sc scope) {
	defer time.AfterFunc(time.Until(sc.expires), cancel).Stop()
	first := true // authenticate has just checked it
	_ = s.opts.Hub.Watch(ctx, sc.thread.String(), eventhub.Heartbeat, func(bool) error {
		if !first {
			if ok, err := s.tokenHolds(ctx, sc); err == nil && !ok {
				cancel()
			}
		}
		first = false
		return nil
	})
}

func unauthorized(challenge string) error {
	return &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_token",
		Message: "/mcp needs Authorization: Bearer <token>: the admin token, a client key, or a thread token " +
			`(POST /admin/v1/threads/{thread}/links with {"kind":"mcp"}) that has not expired or been revoked`,
		Header: http.Header{"WWW-Authenticate": {challenge}}}
}
