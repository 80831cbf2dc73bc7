package admin

import (
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
)

// The workspace panel (docs/spec.md §13): static files embedded in the binary, which read and write
// through the admin REST with a panel session.
//
//go:embed ui
var uiFiles embed.FS

// panelHeaders are the security headers of every panel response: no inline script, no framing,
// no referrer (a link's token stays out of other sites' logs).
func panelHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "+
		"form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

func (s *Server) panelRoutes(mux *http.ServeMux) {
	static, _ := fs.Sub(uiFiles, "ui")
	files := http.StripPrefix("/ui/", http.FileServerFS(static))
	handle := func(pattern string, h http.HandlerFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			panelHeaders(w.Header())
			h(w, r)
		})
	}
	handle("GET /ui/", func(w http.ResponseWriter, r *http.Request) { files.ServeHTTP(w, r) })
	handle("GET /ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusMovedPermanently) })
	// The server's root opens the panel while it is on: 302, not 301, so a browser does not keep
	// it once the panel is off (UI=off, when / is the edge's JSON 404 again). Only / itself: every
	// other path stays the edge's.
	handle("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusFound) })
	handle("GET /ui/session", s.panelSession)
	handle("POST /ui/session", s.panelSignIn)
	handle("DELETE /ui/session", s.panelSignOut)
	handle("GET /ui/link", s.panelLink)
}

// panelSession answers who the session is, and the CSRF token its writes carry.
func (s *Server) panelSession(w http.ResponseWriter, r *http.Request) {
	ses, ok := s.sessionOf(r)
	if !ok {
		apierr.Write(w, r, s.log, &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "no_session", Message: "not signed in"})
		return
	}
	_ = writeJSON(w, http.StatusOK, map[string]any{"scope": ses.Scope, "csrf": ses.CSRF, "expires_at": time.Unix(ses.Expires, 0).UTC()})
}

// panelSignIn signs in with the admin token (every thread) or, with CLIENT_KEYS, a client's key
// (that client's threads). One from another site is refused before its token is looked at (a
// page could otherwise sign a browser in, or spend its address's failures); failures are
// throttled per address.
func (s *Server) panelSignIn(w http.ResponseWriter, r *http.Request) {
	if err := s.fromPanel(r); err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	var in struct {
		Token string `json:"token"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	var p principal
	err := s.opts.Guard.Attempt(r, func() bool {
		if s.opts.Guard.IsAdmin(in.Token) {
			p.admin = true
			return true
		}
		var ok bool
		p.client, ok = s.opts.Guard.Client(in.Token)
		p.key = s.opts.Guard.KeyFingerprint(in.Token)
		return ok
	}, &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_token",
		Message: "that is neither the admin token nor a client key"})
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	ses := s.startSession(w, r, p, time.Now().Add(sessionTTL))
	_ = writeJSON(w, http.StatusOK, map[string]any{"scope": ses.Scope, "csrf": ses.CSRF, "expires_at": time.Unix(ses.Expires, 0).UTC()})
}

// panelSignOut ends the session in this browser.
func (s *Server) panelSignOut(w http.ResponseWriter, r *http.Request) {
	if ses, ok := s.sessionOf(r); ok {
		if err := s.sameOrigin(r, ses); err != nil {
			apierr.Write(w, r, s.log, err)
			return
		}
	}
	s.setSessionCookie(w, r, &http.Cookie{MaxAge: -1})
	// and any session cookie of Path=/, which the browser would send on every path
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}

// linkPage sends the browser on to the thread's panel from a page of the panel's own: a
// redirect would carry the navigation's cross-site origin, and the new SameSite=Strict cookie
// would not go with it.
var linkPage = template.Must(template.New("link").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={{.}}">
<title>wsproxy workspace</title></head>
<body><p><a href="{{.}}">Open the workspace</a></p></body></html>
`))

// panelLink opens a signed link: a session for its thread alone, until the link expires or is
// revoked.
func (s *Server) panelLink(w http.ResponseWriter, r *http.Request) {
	l, ok := s.signer.VerifyThreadToken(auth.KindPanelLink, r.URL.Query().Get("token"))
	p := principal{thread: l.Thread, link: l.ID, key: l.Key}
	if ok {
		holds, err := s.holds(r.Context(), p)
		if err != nil {
			apierr.Write(w, r, s.log, err)
			return
		}
		ok = holds
	}
	if !ok {
		apierr.Write(w, r, s.log, &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "invalid_link",
			Message: "this link is not valid or has expired; ask for a new one"})
		return
	}
	s.startSession(w, r, p, time.Unix(l.Expires, 0))
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = linkPage.Execute(w, "/ui/#/t/"+l.Thread)
}
