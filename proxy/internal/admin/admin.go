package admin

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
	"github.com/wsproxy/wsproxy/workspace"
)

// Admin REST limits of lists (docs/spec.md §8).
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// adminRoute is one route of the admin REST.
type adminRoute struct {
	method, path string
	handle       func(s *Server, w http.ResponseWriter, r *http.Request) error
}

// adminRouteTable is the admin REST (docs/spec.md §8): the user path, which ignores locks. The OpenAPI
// document describes exactly these routes (a test checks it).
var adminRouteTable = []adminRoute{
	{"GET", "/admin/v1/threads", (*Server).adminListThreads},
	{"GET", "/admin/v1/threads/{thread}", (*Server).adminGetThread},
	{"PUT", "/admin/v1/threads/{thread}", (*Server).adminCreateThread},
	{"PATCH", "/admin/v1/threads/{thread}", (*Server).adminPatchThread},
	{"PUT", "/admin/v1/threads/{thread}/parents", (*Server).adminSetParents},
	{"GET", "/admin/v1/threads/{thread}/children", (*Server).adminChildren},
	{"DELETE", "/admin/v1/threads/{thread}", (*Server).adminDeleteThread},
	{"GET", "/admin/v1/threads/{thread}/export", (*Server).adminExport},
	{"POST", "/admin/v1/threads/{thread}/import", (*Server).adminImport},
	{"PUT", "/admin/v1/threads/{thread}/objective", (*Server).adminSetObjective},
	{"POST", "/admin/v1/threads/{thread}/preferences", (*Server).adminAddPreference},
	{"PATCH", "/admin/v1/threads/{thread}/preferences/{id}", (*Server).adminUpdatePreference},
	{"DELETE", "/admin/v1/threads/{thread}/preferences/{id}", (*Server).adminDeletePreference},
	{"POST", "/admin/v1/threads/{thread}/preferences/{id}/move", (*Server).adminMovePreference},
	{"GET", "/admin/v1/threads/{thread}/snapshots", (*Server).adminSnapshots},
	{"GET", "/admin/v1/threads/{thread}/tool-calls", (*Server).adminToolCalls},
	{"GET", "/admin/v1/threads/{thread}/events", (*Server).adminEvents},
	{"GET", "/admin/v1/threads/{thread}/events/stream", (*Server).adminEventStream},
	{"POST", "/admin/v1/threads/{thread}/events/{id}/revert", (*Server).adminRevert},
	{"POST", "/admin/v1/threads/{thread}/events/{id}/apply", (*Server).adminApply},
	{"POST", "/admin/v1/threads/{thread}/events/{id}/dismiss", (*Server).adminDismiss},
	{"GET", "/admin/v1/threads/{thread}/proposals", (*Server).adminProposals},
	{"POST", "/admin/v1/threads/{thread}/links", (*Server).adminLink},
	{"GET", "/admin/v1/threads/{thread}/links", (*Server).adminLinks},
	{"DELETE", "/admin/v1/threads/{thread}/links/{id}", (*Server).adminRevokeLink},
	{"POST", "/admin/v1/clients", (*Server).adminCreateClient},
	{"GET", "/admin/v1/clients", (*Server).adminListClients},
	{"GET", "/admin/v1/clients/{name}", (*Server).adminGetClient},
	{"PATCH", "/admin/v1/clients/{name}", (*Server).adminPatchClient},
	{"DELETE", "/admin/v1/clients/{name}", (*Server).adminDeleteClient},
	{"POST", "/admin/v1/clients/{name}/keys", (*Server).adminAddClientKey},
	{"DELETE", "/admin/v1/clients/{name}/keys/{id}", (*Server).adminRevokeClientKey},
	{"GET", "/admin/v1/me", (*Server).adminMe},
	{"GET", openAPIPath, func(_ *Server, w http.ResponseWriter, _ *http.Request) error {
		apierr.WriteJSON(w, http.StatusOK, openAPIDocument)
		return nil
	}},
}

// openAPIPath serves the OpenAPI document of the admin REST, the one route without a token.
const openAPIPath = "/admin/v1/openapi.json"

func (s *Server) adminRoutes(mux *http.ServeMux) {
	handle := func(pattern string, h func(s *Server, w http.ResponseWriter, r *http.Request) error) {
		mux.Handle(pattern, s.adminAuth(func(w http.ResponseWriter, r *http.Request) {
			if err := h(s, w, r); err != nil {
				if errors.Is(err, workspace.ErrNotFound) {
					err = s.notFound(r)
				}
				apierr.Write(w, r, s.log, err)
			}
		}))
	}
	for _, rt := range adminRouteTable {
		if rt.path == openAPIPath {
			// The document holds no data: served without a token, as client generators fetch it.
			mux.HandleFunc(rt.method+" "+rt.path, func(w http.ResponseWriter, r *http.Request) {
				if err := rt.handle(s, w, r); err != nil {
					apierr.Write(w, r, s.log, err)
				}
			})
			continue
		}
		handle(rt.method+" "+rt.path, rt.handle)
	}
	handle("/admin/", func(_ *Server, w http.ResponseWriter, r *http.Request) error {
		return apierr.NoRoute(mux, r, "no admin route for "+r.Method+" "+r.URL.Path)
	})
}

// adminAuth requires `Authorization: Bearer <ADMIN_TOKEN>` (compared in constant time), or a
// panel session (docs/spec.md §13), whose writes must come from the panel's origin with its CSRF token.
// The handler finds who called in its context (principalFrom).
func (s *Server) adminAuth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.adminPrincipal(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="wsproxy admin"`)
			apierr.Write(w, r, s.log, err)
			return
		}
		if p.via != nil && r.Method != http.MethodGet && r.Method != http.MethodHead {
			if err := s.sameOrigin(r, p.via); err != nil {
				apierr.Write(w, r, s.log, err)
				return
			}
		}
		next(w, r.WithContext(withPrincipal(r.Context(), p)))
	})
}

var errAdminToken = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_admin_token",
	Message: "the admin REST needs Authorization: Bearer <ADMIN_TOKEN> (or a panel session)"}

// adminPrincipal is who calls: the admin by its token, a client by its key (docs/spec.md §8: its
// own threads only), or a panel session's holder while the session holds (s.holds). A wrong
// token counts as a failed authentication of the client's address (throttled).
func (s *Server) adminPrincipal(r *http.Request) (principal, error) {
	if got, ok := auth.BearerToken(r); ok {
		var p principal
		err := s.opts.Guard.Attempt(r, func() bool {
			if s.opts.Guard.IsAdmin(got) {
				p = principal{admin: true}
				return true
			}
			client, ok := s.opts.Guard.Client(got) // a client key: that client's threads only
			p = principal{client: client, key: s.opts.Guard.KeyFingerprint(got)}
			return ok
		}, errAdminToken)
		if err != nil {
			return principal{}, err
		}
		return p, nil
	}
	ses, ok := s.sessionOf(r)
	if !ok {
		return principal{}, errAdminToken
	}
	p, ok := principalOf(ses.Scope)
	if !ok {
		return principal{}, errAdminToken
	}
	p.via, p.link, p.key = ses, ses.Link, ses.Key
	if holds, err := s.holds(r.Context(), p); err != nil || !holds {
		if err == nil {
			err = errAdminToken
		}
		return principal{}, err
	}
	return p, nil
}

// page is a list response.
type page[T any] struct {
	Data    []T  `json:"data"`
	HasMore bool `json:"has_more"`
}

// limitOf reads ?limit= (default 50, capped at 500).
func limitOf(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return defaultPageSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, apierr.BadRequest("invalid_value", "limit", "limit must be a positive integer")
	}
	return min(n, maxPageSize), nil
}

// afterInt reads an integer ?after= cursor (0 when absent).
func afterInt(r *http.Request) (int64, error) {
	v := r.URL.Query().Get("after")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, apierr.BadRequest("invalid_value", "after", "after must be the cursor of the last item of the previous page")
	}
	return n, nil
}

// list fetches limit+1 items to tell whether there are more.
func list[T any](w http.ResponseWriter, limit int, fetch func(n int) ([]T, error)) error {
	items, err := fetch(limit + 1)
	if err != nil {
		return err
	}
	p := page[T]{Data: items, HasMore: len(items) > limit}
	if p.HasMore {
		p.Data = items[:limit]
	}
	return writeJSON(w, http.StatusOK, p)
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := rawjson.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	apierr.WriteJSON(w, status, b)
	return nil
}

// workspaceOf is the workspace of the path's thread, named in its stored form (client~thread for
// a client's thread).
//
// A client that names a workspace outside every client's namespace (repo-x, or ~repo-x as its
// threads name it) gets 403 when it is shared with it, whatever the route: a shared scope is
// read-only to it, and its history and the threads that inherit it are the admin's
// (docs/spec.md §20); 404 when it is not.
func (s *Server) workspaceOf(r *http.Request) (*workspace.Workspace, error) {
	name := r.PathValue("thread")
	if rest, ok := strings.CutPrefix(name, workspace.SharedPrefix); ok {
		name = rest
	}
	id, err := workspace.ParseThreadID(name)
	if err != nil {
		return nil, apierr.BadRequest("invalid_thread_id", "thread", "%s, prefixed with client~ for a client's thread", err.Error())
	}
	if err := s.sharedScopeRefused(r, id); err != nil {
		return nil, err
	}
	if !principalFrom(r.Context()).mayThread(id.String()) {
		return nil, workspace.ErrNotFound // another's thread is not shown to exist
	}
	return s.opts.Store.Workspace(id), nil
}

// sharedScopeRefused is errSharedReadOnly when a client names id, a workspace outside every
// client's namespace shared with it, and ErrNotFound when such a workspace is not shared with it;
// nil for any other thread or caller.
func (s *Server) sharedScopeRefused(r *http.Request, id workspace.ThreadID) error {
	p := principalFrom(r.Context())
	if p.client == "" || id.Client != "" {
		return nil
	}
	shared, err := s.opts.Store.Workspace(id).SharedWithClient(r.Context(), p.client)
	switch {
	case err != nil:
		return err
	case shared:
		return errSharedReadOnly
	}
	return workspace.ErrNotFound
}

// notFound is the 404 of a route whose thread, or whose item of the thread, does not exist (or
// is another client's): it names which, by the path's thread and the route's kind of item.
func (s *Server) notFound(r *http.Request) error {
	thread := r.PathValue("thread")
	if thread == "" {
		return workspace.ErrNotFound
	}
	e := &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Param: "thread",
		Message: fmt.Sprintf("no thread %q", thread)}
	// A client's key names its threads with their client: say so to one that named a bare id.
	if p := principalFrom(r.Context()); p.client != "" && p.thread == "" && !strings.Contains(thread, "~") {
		e.Message += fmt.Sprintf(": a client's threads are named with their client, as in %q", p.client+"~"+thread)
	}
	ws, err := s.workspaceOf(r)
	if err != nil {
		return e
	}
	if _, err := ws.Summary(r.Context()); err != nil {
		if errors.Is(err, workspace.ErrNotFound) {
			return e
		}
		return err
	}
	item := r.PathValue("id")
	if item == "" {
		return workspace.ErrNotFound
	}
	kind := "item"
	for _, k := range []string{"preferences", "events", "links"} {
		if strings.Contains(r.Pattern, "/"+k+"/{id}") {
			kind = strings.TrimSuffix(k, "s")
		}
	}
	e.Param, e.Message = "id", fmt.Sprintf("thread %q has no %s %q", thread, kind, item)
	return e
}

// itemOf is the workspace of the path's thread and the path's {id} (a preference's, a link's);
// an id that is not a number names nothing.
func (s *Server) itemOf(r *http.Request) (*workspace.Workspace, int64, error) {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return nil, 0, err
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return nil, 0, workspace.ErrNotFound
	}
	return ws, id, nil
}

// historyOf is the workspace of the path's thread and the page asked of its history:
// ?limit= and the integer cursor ?after=.
func (s *Server) historyOf(r *http.Request) (ws *workspace.Workspace, limit int, after int64, err error) {
	if ws, err = s.workspaceOf(r); err != nil {
		return nil, 0, 0, err
	}
	if limit, err = limitOf(r); err != nil {
		return nil, 0, 0, err
	}
	after, err = afterInt(r)
	return ws, limit, after, err
}

// decodeBody decodes a JSON request body strictly: unknown fields are refused.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	return s.decodeBounded(w, r, v, 0, nil)
}

// decodeBounded is decodeBody for a body of at most limit bytes (0: the edge's limits alone): a
// longer one is tooLong before it is read (its Content-Length) or decoded. An error of a value's
// own UnmarshalJSON that is a *workspace.ParentsError is returned as it is.
func (s *Server) decodeBounded(w http.ResponseWriter, r *http.Request, v any, limit int64, tooLong error) error {
	if limit > 0 && r.ContentLength > limit {
		return tooLong
	}
	body, release, err := s.readBody(w, r)
	defer release()
	if err != nil {
		return err
	}
	if limit > 0 && int64(len(body)) > limit {
		return tooLong
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		var pe *workspace.ParentsError
		switch {
		case errors.As(err, &pe):
			return pe
		case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF):
			return apierr.InvalidJSON(body)
		case errors.As(err, &te):
			return apierr.BadRequest("invalid_type", te.Field, "%s has the wrong type", te.Field)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return apierr.BadRequest("unknown_parameter", field, "unknown field %q", field)
		}
		return apierr.BadRequest("invalid_json", "", "the request body is not a valid JSON object")
	}
	if dec.More() {
		return apierr.BadRequest("invalid_json", "", "the request body holds more than one JSON value")
	}
	return nil
}

func (s *Server) adminListThreads(w http.ResponseWriter, r *http.Request) error {
	limit, err := limitOf(r)
	if err != nil {
		return err
	}
	after, q := r.URL.Query().Get("after"), r.URL.Query().Get("q")
	// The id prefix: q, within the principal's namespace; a link's holder lists its thread alone
	// (one page: a cursor can only follow it).
	p := principalFrom(r.Context())
	if p.thread != "" {
		threads := []workspace.Thread{}
		if strings.HasPrefix(p.thread, q) && after == "" {
			id, err := workspace.ParseThreadID(p.thread)
			if err != nil {
				return err
			}
			th, err := s.opts.Store.Workspace(id).Summary(r.Context())
			switch {
			case err == nil:
				threads = append(threads, th)
			case !errors.Is(err, workspace.ErrNotFound):
				return err
			}
		}
		return writeJSON(w, http.StatusOK, page[workspace.Thread]{Data: threads})
	}
	prefix := q
	if !p.admin {
		prefix = workspace.ThreadID{Client: p.client, Name: q}.String()
	}
	// ?parent=: the threads that name it among their parents (in the caller's namespace);
	// ?search=: those whose name, title, objective or first words hold it.
	filter := workspace.ThreadFilter{Search: r.URL.Query().Get("search")}
	if v := r.URL.Query().Get("parent"); v != "" {
		id, err := workspace.ParseThreadID(v)
		if err != nil || id.Client != "" {
			return apierr.BadRequest("invalid_value", "parent", "parent must be a thread's name")
		}
		filter.Parent = workspace.ThreadID{Client: p.client, Name: id.Name}.String()
	}
	return list(w, limit, func(n int) ([]workspace.Thread, error) {
		return s.opts.Store.Threads(r.Context(), after, prefix, filter, n)
	})
}

func (s *Server) adminGetThread(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	d, err := ws.Get(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, d)
}

func (s *Server) adminDeleteThread(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	if err := ws.Delete(r.Context()); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) adminSetObjective(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	var in struct {
		Text *string `json:"text"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		return err
	}
	if in.Text == nil {
		return apierr.BadRequest("missing_required_parameter", "text", "text is required")
	}
	o, err := ws.SetObjective(r.Context(), *in.Text)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, o)
}

func (s *Server) adminAddPreference(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	var in struct {
		Title    *string `json:"title"`
		Subtitle string  `json:"subtitle"`
		Kind     string  `json:"kind"`
		Locked   bool    `json:"locked"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		return err
	}
	if in.Title == nil {
		return apierr.BadRequest("missing_required_parameter", "title", "title is required")
	}
	p, err := ws.AddPreference(r.Context(), workspace.PreferenceInput{Title: *in.Title, Subtitle: in.Subtitle, Kind: in.Kind, Locked: in.Locked})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, p)
}

func (s *Server) adminUpdatePreference(w http.ResponseWriter, r *http.Request) error {
	ws, id, err := s.itemOf(r)
	if err != nil {
		return err
	}
	var in struct {
		Title    *string `json:"title"`
		Subtitle *string `json:"subtitle"`
		Kind     *string `json:"kind"`
		Locked   *bool   `json:"locked"`
		// Source "confirmed" confirms the item as it reads (docs/spec.md §19); no other value
		// is the user's to set.
		Source *string `json:"source"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		return err
	}
	if in.Source != nil && *in.Source != workspace.SourceConfirmed {
		return apierr.BadRequest("invalid_value", "source", `source may only be set to "confirmed": an edit of a field makes an item the user's`)
	}
	p, err := ws.UpdatePreference(r.Context(), id, workspace.PreferencePatch{Title: in.Title, Subtitle: in.Subtitle, Kind: in.Kind, Locked: in.Locked,
		Confirm: in.Source != nil})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}

func (s *Server) adminDeletePreference(w http.ResponseWriter, r *http.Request) error {
	ws, id, err := s.itemOf(r)
	if err != nil {
		return err
	}
	if err := ws.DeletePreference(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) adminSnapshots(w http.ResponseWriter, r *http.Request) error {
	ws, limit, after, err := s.historyOf(r)
	if err != nil {
		return err
	}
	if v := r.URL.Query().Get("turn"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return apierr.BadRequest("invalid_value", "turn", "turn must be a turn number (from 1)")
		}
		snap, err := ws.SnapshotForTurn(r.Context(), n)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, snap)
	}
	return list(w, limit, func(n int) ([]workspace.Snapshot, error) {
		return ws.Snapshots(r.Context(), int(min(after, 1<<31-1)), n)
	})
}

func (s *Server) adminToolCalls(w http.ResponseWriter, r *http.Request) error {
	ws, limit, after, err := s.historyOf(r)
	if err != nil {
		return err
	}
	return list(w, limit, func(n int) ([]workspace.ToolCallRecord, error) { return ws.ToolCalls(r.Context(), after, n) })
}

func (s *Server) adminEvents(w http.ResponseWriter, r *http.Request) error {
	ws, limit, after, err := s.historyOf(r)
	if err != nil {
		return err
	}
	q := workspace.EventQuery{After: after}
	switch r.URL.Query().Get("order") {
	case "", "asc":
	case "desc":
		q.Descending = true
	default:
		return apierr.BadRequest("invalid_value", "order", `order must be "asc" or "desc"`)
	}
	if v := r.URL.Query().Get("target"); v != "" {
		t, err := workspace.ParseTarget(v)
		if err != nil {
			return err
		}
		q.Target = &t
	}
	return list(w, limit, func(n int) ([]workspace.Event, error) {
		q.Limit = n
		return ws.Events(r.Context(), q)
	})
}

// adminRevert reverts one change (docs/spec.md §13); with ?through=latest, or ?through=<the id
// of its target's latest change>, back through every later change of its target first, in one
// step: the answer is then the list of the revert events, in id order.
func (s *Server) adminRevert(w http.ResponseWriter, r *http.Request) error {
	v, ok := r.URL.Query()["through"]
	if !ok {
		return s.eventAction(w, r, (*workspace.Workspace).RevertEvent)
	}
	var through int64
	if v[0] != "latest" {
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil || n < 1 {
			return apierr.BadRequest("invalid_value", "through", `through must be "latest" or the id of the latest change of the event's target`)
		}
		through = n
	}
	ws, id, err := s.itemOf(r)
	if err != nil {
		return err
	}
	evs, err := ws.RevertThrough(r.Context(), id, through)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, page[workspace.Event]{Data: evs})
}

// adminApply applies a locked_skip's proposal as a user change (docs/spec.md §13).
func (s *Server) adminApply(w http.ResponseWriter, r *http.Request) error {
	return s.eventAction(w, r, (*workspace.Workspace).ApplyProposal)
}

// eventAction runs act, a user change made of the event the path names, and answers with the
// change's event.
func (s *Server) eventAction(w http.ResponseWriter, r *http.Request, act func(*workspace.Workspace, context.Context, int64) (workspace.Event, error)) error {
	ws, id, err := s.itemOf(r)
	if err != nil {
		return err
	}
	ev, err := act(ws, r.Context(), id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ev)
}

// errLinkHolder: a link's holder could otherwise outlive its link with a longer one, or end
// others' links.
var errLinkHolder = &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "link_not_allowed",
	Message: "a link opens its thread; it cannot make or revoke links"}

// issuedLink is a thread token as POST …/links answers it: the panel's URL, or the MCP token
// and the URL it is for.
type issuedLink struct {
	ID        int64     `json:"id"`
	Kind      string    `json:"kind"`
	URL       string    `json:"url"`
	Token     string    `json:"token,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
}

// adminLink issues a thread token (docs/spec.md §13, §15), signed, expiring and revocable
// (DELETE …/links/{id}): kind "panel" (the default), a URL that opens the thread's panel
// without a key — what an app gives its end user; or "mcp", a bearer token of /mcp bound to the
// thread.
func (s *Server) adminLink(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	p := principalFrom(r.Context())
	if p.thread != "" {
		return errLinkHolder
	}
	var in struct {
		TTLSeconds *int64 `json:"ttl_seconds"`
		Kind       string `json:"kind"`
	}
	if r.ContentLength != 0 {
		if err := s.decodeBody(w, r, &in); err != nil {
			return err
		}
	}
	ttl := DefaultLinkTTL
	if in.TTLSeconds != nil {
		if *in.TTLSeconds < 1 || *in.TTLSeconds > int64(MaxLinkTTL/time.Second) {
			return apierr.BadRequest("invalid_value", "ttl_seconds", "ttl_seconds must be from 1 to %d", int64(MaxLinkTTL/time.Second))
		}
		ttl = time.Duration(*in.TTLSeconds) * time.Second
	}
	switch in.Kind {
	case "", workspace.LinkPanel:
		in.Kind = workspace.LinkPanel
		if s.opts.DisablePanel {
			return &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "ui_off", Message: "the panel is off (UI=off): a link would open nothing"}
		}
	case workspace.LinkMCP:
		if s.opts.DisableMCP {
			return &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "mcp_off", Message: "MCP is off (MCP=off): a token would open nothing"}
		}
	default:
		return apierr.BadRequest("invalid_value", "kind", `kind must be "panel" or "mcp"`)
	}
	exp := time.Now().Add(ttl).Truncate(time.Second)
	l, err := ws.IssueLink(r.Context(), in.Kind, exp) // ErrNotFound: the thread does not exist
	if err != nil {
		return err
	}
	// Bound to the keys it is made under: a client's own key, or — made by the admin — all the
	// keys of the thread's client (any change of them ends it).
	key := p.key
	if p.admin {
		key = s.opts.Guard.ClientFingerprint(ws.ThreadID().Client)
	}
	t := auth.ThreadToken{Thread: ws.ThreadID().String(), ID: l.ID, Expires: exp.Unix(), Key: key}
	out := issuedLink{ID: l.ID, Kind: l.Kind, ExpiresAt: exp.UTC()}
	base := s.opts.Guard.Peers.BaseURL(r)
	if in.Kind == workspace.LinkMCP {
		out.URL, out.Token = base+"/mcp", s.signer.Sign(auth.KindMCP, t)
	} else {
		out.URL = base + "/ui/link?token=" + s.signer.Sign(auth.KindPanelLink, t)
	}
	return writeJSON(w, http.StatusCreated, out)
}

// adminLinks lists the thread's tokens that have not expired (never the tokens themselves).
func (s *Server) adminLinks(w http.ResponseWriter, r *http.Request) error {
	ws, limit, after, err := s.historyOf(r)
	if err != nil {
		return err
	}
	if principalFrom(r.Context()).thread != "" {
		return errLinkHolder
	}
	return list(w, limit, func(n int) ([]workspace.Link, error) { return ws.Links(r.Context(), after, n) })
}

// adminRevokeLink revokes one of the thread's tokens: a panel link (and the sessions it opened)
// or an MCP token is refused from now on, on every replica.
func (s *Server) adminRevokeLink(w http.ResponseWriter, r *http.Request) error {
	ws, id, err := s.itemOf(r)
	if err != nil {
		return err
	}
	if principalFrom(r.Context()).thread != "" {
		return errLinkHolder
	}
	if err := ws.RevokeLink(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// errSessionEnded ends an event stream whose session no longer holds.
var errSessionEnded = errors.New("the session ended")

// adminEventStream streams the thread's new events as they commit (docs/spec.md §13): headers at
// once, then `id:` and `data:` per event; a client that comes back with Last-Event-ID, or opens
// with ?after=, first gets every event after it. A change of one of the thread's ancestors (§17)
// is an event `scope` without an id (Last-Event-ID stays the thread's own), data
// {"scope": the ancestor's name, "event": its last event id}. Postgres's notifications wake the stream (any
// replica's commits); the heartbeat also reads, so a lost notification delays an event by one
// heartbeat at most. A stream opened with a panel session ends when the session expires; a
// link's, also when its link is revoked (seen at the next wake-up or heartbeat).
func (s *Server) adminEventStream(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	last, err := streamStart(r, ws)
	if err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	es := &eventStream{ws: ws, w: w, rc: rc, last: last}
	// The ancestors as of now, before the headers: every later change of one is told.
	if _, err := es.sendScopes(r.Context()); err != nil {
		return err
	}
	sse.SetHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil
	}
	s.opts.Metrics.EventStreams(1)
	defer s.opts.Metrics.EventStreams(-1)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.closing, cancel)()
	p := principalFrom(ctx)
	if !p.admin {
		first := true // adminAuth has just checked it
		es.holds = func(ctx context.Context) (bool, error) {
			if first {
				first = false
				return true, nil
			}
			return s.holds(ctx, p)
		}
	}
	if p.via != nil { // a session's stream ends when the session does
		var expire context.CancelFunc
		ctx, expire = context.WithDeadline(ctx, time.Unix(p.via.Expires, 0))
		defer expire()
	}
	err = s.opts.Hub.WatchAlso(ctx, ws.ThreadID().String(), s.opts.Heartbeat, func(tick bool) ([]string, error) {
		if tick {
			if _, err := w.Write([]byte(": heartbeat\n\n")); err != nil {
				return nil, err
			}
			if err := rc.Flush(); err != nil {
				return nil, err
			}
		}
		if err := es.send(ctx); err != nil {
			return nil, err
		}
		return es.sendScopes(ctx)
	})
	if err != nil && ctx.Err() == nil && !errors.Is(err, errSessionEnded) {
		s.opts.Metrics.EventStreamFailed()
		s.log.LogAttrs(ctx, slog.LevelWarn, "event stream ended", slog.String("thread", ws.ThreadID().String()), slog.Any("err", err))
	}
	return nil
}

// streamStart is the event an event stream starts after: Last-Event-ID (an EventSource that
// reconnects sends it, and keeps its URL), else ?after= (a view opens its stream after the last
// event it read), else the thread's latest. ErrNotFound for a thread that does not exist.
func streamStart(r *http.Request, ws *workspace.Workspace) (int64, error) {
	last, err := ws.LastEventID(r.Context())
	if err != nil {
		return 0, err
	}
	for _, from := range [...]struct{ name, value string }{{"Last-Event-ID", r.Header.Get("Last-Event-ID")}, {"after", r.URL.Query().Get("after")}} {
		if from.value == "" {
			continue
		}
		n, err := strconv.ParseInt(from.value, 10, 64)
		if err != nil || n < 0 {
			return 0, apierr.BadRequest("invalid_value", from.name, "%s must be an event id", from.name)
		}
		return n, nil
	}
	return last, nil
}

// eventStream is an open event stream: the events after last go out on w; holds (nil for the
// admin) says whether its session still holds.
type eventStream struct {
	ws    *workspace.Workspace
	w     http.ResponseWriter
	rc    *http.ResponseController
	last  int64
	holds func(context.Context) (bool, error)
	// scopes is the last event id of each of the thread's ancestors (stored form) as last read;
	// nil before the first read.
	scopes map[string]int64
}

// sendScopes reads the thread's ancestors, writes an event `scope` for each one read before
// whose last event id moved since, and returns them (stored form): the stream's watch follows
// them as the thread's parents, or theirs, change.
func (es *eventStream) sendScopes(ctx context.Context) ([]string, error) {
	ancestors, err := es.ws.Ancestors(ctx)
	if err != nil {
		return nil, err
	}
	var buf []byte
	now := make(map[string]int64, len(ancestors))
	also := make([]string, len(ancestors))
	for i, a := range ancestors {
		k := a.Thread.String()
		now[k], also[i] = a.LastEventID, k
		if before, ok := es.scopes[k]; ok && a.LastEventID > before {
			b, err := json.Marshal(struct {
				Scope string `json:"scope"`
				Event int64  `json:"event"`
			}{a.Thread.NameFor(es.ws.ThreadID().Client), a.LastEventID})
			if err != nil {
				return nil, err
			}
			buf = sse.AppendNamedEvent(buf, "scope", b)
		}
	}
	es.scopes = now
	if len(buf) > 0 {
		if _, err := es.w.Write(buf); err != nil {
			return nil, err
		}
		if err := es.rc.Flush(); err != nil {
			return nil, err
		}
	}
	return also, nil
}

// send writes the thread's events after es.last, a page at a time, flushing each page.
func (es *eventStream) send(ctx context.Context) error {
	if es.holds != nil {
		if ok, err := es.holds(ctx); err != nil || !ok {
			return cmp.Or(err, errSessionEnded)
		}
	}
	for {
		evs, err := es.ws.Events(ctx, workspace.EventQuery{After: es.last, Limit: maxPageSize})
		if err != nil {
			return err
		}
		var buf []byte
		for _, e := range evs {
			b, err := rawjson.Marshal(e)
			if err != nil {
				return err
			}
			buf = append(buf, "id: "+strconv.FormatInt(e.ID, 10)+"\n"...)
			buf = sse.AppendEvent(buf, b)
			es.last = e.ID
		}
		if len(buf) > 0 {
			if _, err := es.w.Write(buf); err != nil {
				return err
			}
			if err := es.rc.Flush(); err != nil {
				return err
			}
		}
		if len(evs) < maxPageSize {
			return nil
		}
	}
}
