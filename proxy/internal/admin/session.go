package admin

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/workspace"
)

// principal is who makes an admin REST call (docs/spec.md §13): the admin, who sees every thread; a
// client (CLIENT_KEYS), who sees its own; or the holder of a thread's signed link, who sees that
// thread alone.
type principal struct {
	admin  bool
	client string
	thread string   // a link's thread, in its stored form
	link   int64    // a thread's: its link's id (the session ends when the link is revoked)
	key    string   // a client's or a thread's: the fingerprint of the keys it is bound to (auth.Guard.Holds)
	via    *session // set when the call came with a panel session: a write then needs its CSRF token
}

// mayThread reports whether the principal may see and edit the thread (stored form).
func (p principal) mayThread(stored string) bool {
	switch {
	case p.admin:
		return true
	case p.thread != "":
		return p.thread == stored
	case p.client != "":
		id, err := workspace.ParseThreadID(stored)
		return err == nil && id.Client == p.client
	}
	return false
}

// scope names the principal in a session: "admin", "client:<name>" or "thread:<id>".
func (p principal) scope() string {
	switch {
	case p.admin:
		return "admin"
	case p.thread != "":
		return "thread:" + p.thread
	}
	return "client:" + p.client
}

func principalOf(scope string) (principal, bool) {
	switch kind, rest, _ := strings.Cut(scope, ":"); {
	case scope == "admin":
		return principal{admin: true}, true
	case kind == "client" && rest != "":
		return principal{client: rest}, true
	case kind == "thread" && rest != "":
		return principal{thread: rest}, true
	}
	return principal{}, false
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalFrom(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// session is a panel session, held by the browser in a signed cookie: valid on every replica
// that shares the ADMIN_TOKEN, never holding a key or the token itself.
type session struct {
	Scope   string `json:"s"`
	Expires int64  `json:"e"` // Unix seconds
	CSRF    string `json:"c"` // the token writes must carry (X-CSRF-Token)
	// Link is the id of the link a thread's session was opened by: the session holds while the
	// link does.
	Link int64 `json:"l,omitempty"`
	// Key is the fingerprint of the client keys a client's session signed in with, or a thread's
	// link was made under: the session holds while they are the client's (auth.Guard.Holds).
	Key string `json:"k,omitempty"`
}

// Panel sessions and links.
const (
	sessionCookie = "wsproxy_session"
	sessionTTL    = 12 * time.Hour
	csrfHeader    = "X-CSRF-Token"
	// DefaultLinkTTL and MaxLinkTTL bound a link's life (POST …/links).
	DefaultLinkTTL = time.Hour
	MaxLinkTTL     = 30 * 24 * time.Hour
)

// holds reports whether a session's principal still holds: the admin's always (its signing key
// is ADMIN_TOKEN's); a client's while the key it signed in with is the client's; a link's while
// its link is neither revoked nor expired, its thread not deleted and the keys of the thread's
// client (if any) it was made under still the client's.
func (s *Server) holds(ctx context.Context, p principal) (bool, error) {
	switch {
	case p.admin:
		return true, nil
	case p.thread == "":
		return s.opts.Guard.Holds(p.client, p.key), nil
	}
	id, err := workspace.ParseThreadID(p.thread)
	if err != nil || !s.opts.Guard.Holds(id.Client, p.key) {
		return false, nil
	}
	return s.opts.Store.Workspace(id).LinkValid(ctx, workspace.LinkPanel, p.link)
}

// sessionOf is the request's valid panel session.
func (s *Server) sessionOf(r *http.Request) (*session, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, false
	}
	var ses session
	if !s.signer.Verify(auth.KindSession, c.Value, &ses) || time.Now().Unix() >= ses.Expires {
		return nil, false
	}
	return &ses, true
}

// startSession sets the session cookie of p, expiring at exp.
func (s *Server) startSession(w http.ResponseWriter, r *http.Request, p principal, exp time.Time) session {
	ses := session{Scope: p.scope(), Expires: exp.Unix(), CSRF: rand.Text(), Link: p.link, Key: p.key}
	s.setSessionCookie(w, r, &http.Cookie{Value: s.signer.Sign(auth.KindSession, ses), Expires: exp})
	return ses
}

// sessionPaths are where the browser sends the session cookie: the panel's own routes and the
// admin REST it calls, never /v1 (whose requests go upstream).
var sessionPaths = []string{"/ui/", "/admin/"}

// setSessionCookie sets the session cookie c (its value and expiry) on every path of
// sessionPaths; Secure when the client reached wsproxy over https (scheme).
func (s *Server) setSessionCookie(w http.ResponseWriter, r *http.Request, c *http.Cookie) {
	secure := s.opts.Guard.Peers.Scheme(r) == "https"
	for _, path := range sessionPaths {
		c := *c
		c.Name, c.Path, c.HttpOnly, c.SameSite, c.Secure = sessionCookie, path, true, http.SameSiteStrictMode, secure
		http.SetCookie(w, &c)
	}
}

// sameOrigin checks a write made with a session cookie: it must come from the panel's own
// origin (fromPanel) and carry the session's CSRF token.
func (s *Server) sameOrigin(r *http.Request, ses *session) error {
	if err := s.fromPanel(r); err != nil {
		return err
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(csrfHeader)), []byte(ses.CSRF)) != 1 {
		return csrfRefused("a write needs the session's " + csrfHeader)
	}
	return nil
}

// fromPanel refuses a write from another site or origin (Sec-Fetch-Site and Origin, when the
// browser sends them; the origin as BaseURL sees it): every write with a session, and the
// sign-in, which has none yet (docs/spec.md §13).
func (s *Server) fromPanel(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return csrfRefused("a write from another site is refused")
	}
	if origin := r.Header.Get("Origin"); origin != "" && origin != s.opts.Guard.Peers.BaseURL(r) {
		return csrfRefused("a write from another origin is refused")
	}
	return nil
}

func csrfRefused(msg string) error {
	return &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "csrf_refused", Message: msg}
}
