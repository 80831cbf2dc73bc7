package proxy

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// Admin REST limits of lists (SPEC §8).
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// adminRoute is one route of the admin REST.
type adminRoute struct {
	method, path string
	handle       func(s *Server, w http.ResponseWriter, r *http.Request) error
}

// adminRouteTable is the admin REST (SPEC §8): the user path, which ignores locks. The OpenAPI
// document describes exactly these routes (a test checks it).
var adminRouteTable = []adminRoute{
	{"GET", "/admin/v1/threads", (*Server).adminListThreads},
	{"GET", "/admin/v1/threads/{thread}", (*Server).adminGetThread},
	{"DELETE", "/admin/v1/threads/{thread}", (*Server).adminDeleteThread},
	{"PUT", "/admin/v1/threads/{thread}/objective", (*Server).adminSetObjective},
	{"POST", "/admin/v1/threads/{thread}/preferences", (*Server).adminAddPreference},
	{"PATCH", "/admin/v1/threads/{thread}/preferences/{id}", (*Server).adminUpdatePreference},
	{"DELETE", "/admin/v1/threads/{thread}/preferences/{id}", (*Server).adminDeletePreference},
	{"GET", "/admin/v1/threads/{thread}/snapshots", (*Server).adminSnapshots},
	{"GET", "/admin/v1/threads/{thread}/tool-calls", (*Server).adminToolCalls},
	{"GET", "/admin/v1/openapi.json", func(_ *Server, w http.ResponseWriter, _ *http.Request) error {
		writeJSONBytes(w, http.StatusOK, openAPIDocument)
		return nil
	}},
}

func (s *Server) adminRoutes(mux *http.ServeMux) {
	handle := func(pattern string, h func(s *Server, w http.ResponseWriter, r *http.Request) error) {
		mux.Handle(pattern, s.adminAuth(func(w http.ResponseWriter, r *http.Request) {
			if err := h(s, w, r); err != nil {
				writeError(w, r, s.log, err)
			}
		}))
	}
	for _, rt := range adminRouteTable {
		handle(rt.method+" "+rt.path, rt.handle)
	}
	handle("/admin/", func(_ *Server, w http.ResponseWriter, r *http.Request) error {
		return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: "no admin route for " + r.Method + " " + r.URL.Path}
	})
}

// adminAuth requires `Authorization: Bearer <ADMIN_TOKEN>`, compared in constant time.
func (s *Server) adminAuth(next http.HandlerFunc) http.Handler {
	want := []byte(s.opts.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ := bearerToken(r)
		if s.opts.AdminToken == "" || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="wsproxy admin"`)
			writeError(w, r, s.log, &Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_admin_token",
				Message: "the admin REST needs Authorization: Bearer <ADMIN_TOKEN>"})
			return
		}
		next(w, r)
	})
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
		return 0, badRequest("invalid_value", "limit", "limit must be a positive integer")
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
		return 0, badRequest("invalid_value", "after", "after must be the cursor of the last item of the previous page")
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
	writeJSONBytes(w, status, b)
	return nil
}

// workspaceOf is the workspace of the path's thread, named in its stored form (client~thread for
// a client's thread).
func (s *Server) workspaceOf(r *http.Request) (*tools.Workspace, error) {
	id, err := tools.ParseThreadID(r.PathValue("thread"))
	if err != nil {
		return nil, badRequest("invalid_thread_id", "thread", "%s, prefixed with client~ for a client's thread", err.Error())
	}
	return s.opts.Store.Workspace(id), nil
}

// preferenceOf is the workspace of the path's thread and the path's preference {id}; an id that
// is not a number names no preference.
func (s *Server) preferenceOf(r *http.Request) (*tools.Workspace, int64, error) {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return nil, 0, err
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return nil, 0, tools.ErrNotFound
	}
	return ws, id, nil
}

// historyOf is the workspace of the path's thread and the page asked of its history:
// ?limit= and the integer cursor ?after=.
func (s *Server) historyOf(r *http.Request) (ws *tools.Workspace, limit int, after int64, err error) {
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
	body, release, err := s.readBody(w, r)
	defer release()
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te):
			return badRequest("invalid_type", te.Field, "%s has the wrong type", te.Field)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return badRequest("unknown_parameter", field, "unknown field %q", field)
		}
		return badRequest("invalid_json", "", "the request body is not a valid JSON object")
	}
	if dec.More() {
		return badRequest("invalid_json", "", "the request body holds more than one JSON value")
	}
	return nil
}

func (s *Server) adminListThreads(w http.ResponseWriter, r *http.Request) error {
	limit, err := limitOf(r)
	if err != nil {
		return err
	}
	after := r.URL.Query().Get("after")
	return list(w, limit, func(n int) ([]tools.Thread, error) { return s.opts.Store.Threads(r.Context(), after, n) })
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
		return badRequest("missing_required_parameter", "text", "text is required")
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
		return badRequest("missing_required_parameter", "title", "title is required")
	}
	p, err := ws.AddPreference(r.Context(), tools.PreferenceInput{Title: *in.Title, Subtitle: in.Subtitle, Kind: in.Kind, Locked: in.Locked})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, p)
}

func (s *Server) adminUpdatePreference(w http.ResponseWriter, r *http.Request) error {
	ws, id, err := s.preferenceOf(r)
	if err != nil {
		return err
	}
	var in struct {
		Title    *string `json:"title"`
		Subtitle *string `json:"subtitle"`
		Kind     *string `json:"kind"`
		Locked   *bool   `json:"locked"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		return err
	}
	p, err := ws.UpdatePreference(r.Context(), id, tools.PreferencePatch{Title: in.Title, Subtitle: in.Subtitle, Kind: in.Kind, Locked: in.Locked})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}

func (s *Server) adminDeletePreference(w http.ResponseWriter, r *http.Request) error {
	ws, id, err := s.preferenceOf(r)
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
			return badRequest("invalid_value", "turn", "turn must be a turn number (from 1)")
		}
		snap, err := ws.SnapshotForTurn(r.Context(), n)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, snap)
	}
	return list(w, limit, func(n int) ([]tools.Snapshot, error) { return ws.Snapshots(r.Context(), int(min(after, 1<<31-1)), n) })
}

func (s *Server) adminToolCalls(w http.ResponseWriter, r *http.Request) error {
	ws, limit, after, err := s.historyOf(r)
	if err != nil {
		return err
	}
	return list(w, limit, func(n int) ([]tools.ToolCallRecord, error) { return ws.ToolCalls(r.Context(), after, n) })
}
