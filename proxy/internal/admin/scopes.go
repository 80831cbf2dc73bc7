package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// Scopes and review mode on the admin REST (docs/spec.md §17).

// errLinkScope: a link opens its one thread; naming other threads (parents, a move's destination)
// or listing them (children) would reach beyond it.
var errLinkScope = &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "link_not_allowed",
	Message: "a link opens its thread; it cannot name or list other threads"}

// errSharedReadOnly: a client names a shared scope where it would change or read more of it than
// its threads inherit (docs/spec.md §20).
var errSharedReadOnly = &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "shared_scope_read_only",
	Message: "a shared scope is read-only to clients: its items reach the threads that name it among their parents (~name), " +
		"and only the admin changes it or reads its history"}

// errShareAdminOnly: only the admin token shares a workspace (docs/spec.md §20).
var errShareAdminOnly = &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "admin_only",
	Param: "shared_with", Message: "only the admin token shares a workspace with clients"}

// threadNamed is the thread a request names beside its path's (a parent, a move's destination):
// a name in the path thread's client namespace, or a stored id of that namespace; for a client's
// thread, ~name is a workspace outside every client's namespace (a shared scope, docs/spec.md
// §20: whether it is shared with the client, the store checks); another client's thread does
// not exist for it (ErrNotFound).
func threadNamed(of workspace.ThreadID, name, field string) (workspace.ThreadID, error) {
	if strings.HasPrefix(name, workspace.SharedPrefix) {
		id, err := workspace.NewParentID(of.Client, name)
		if err != nil {
			return workspace.ThreadID{}, apierr.BadRequest("invalid_thread_id", field, "%s: %s", field, err.Error())
		}
		return id, nil
	}
	id, err := workspace.ParseThreadID(name)
	if err != nil {
		return workspace.ThreadID{}, apierr.BadRequest("invalid_thread_id", field, "%s: %s", field, err.Error())
	}
	if id.Client == "" {
		id.Client = of.Client
	}
	if id.Client != of.Client {
		return workspace.ThreadID{}, workspace.ErrNotFound
	}
	return id, nil
}

// adminSetParents stores the thread's parents, nearest first: PUT …/parents {"parents": [...]}.
func (s *Server) adminSetParents(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	if principalFrom(r.Context()).thread != "" {
		return errLinkScope
	}
	var in struct {
		Parents *parentNames `json:"parents"`
	}
	if err := s.decodeBounded(w, r, &in, workspace.MaxParentsBytes, workspace.ErrParentsTooLong); err != nil {
		return err
	}
	if in.Parents == nil {
		return apierr.BadRequest("missing_required_parameter", "parents", "parents is required (an empty list for none)")
	}
	parents := make([]workspace.ThreadID, len(*in.Parents))
	for i, name := range *in.Parents {
		if parents[i], err = threadNamed(ws.ThreadID(), name, "parents"); err != nil {
			return err
		}
	}
	if err := ws.SetParents(r.Context(), parents); err != nil {
		return err
	}
	d, err := ws.Get(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, d)
}

// parentNames is a list of parents as the admin REST reads it: refused, before a name is
// decoded, past workspace.MaxAncestors names (docs/spec.md §17; its body is bounded by
// workspace.MaxParentsBytes).
type parentNames []string

func (p *parentNames) UnmarshalJSON(b []byte) error {
	n := 0
	if err := rawjson.Each(b, func(int, int, int) error {
		if n++; n > workspace.MaxAncestors {
			return workspace.ErrTooManyParents
		}
		return nil
	}); errors.Is(err, workspace.ErrTooManyParents) {
		return err
	}
	return json.Unmarshal(b, (*[]string)(p))
}

// adminChildren lists the threads that name the thread among their parents.
func (s *Server) adminChildren(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	if principalFrom(r.Context()).thread != "" {
		return errLinkScope
	}
	limit, err := limitOf(r)
	if err != nil {
		return err
	}
	after := ""
	if a := r.URL.Query().Get("after"); a != "" {
		id, err := threadNamed(ws.ThreadID(), a, "after")
		if err != nil {
			return err
		}
		after = id.String()
	}
	type child struct {
		ID string `json:"id"`
	}
	return list(w, limit, func(n int) ([]child, error) {
		ids, err := ws.Children(r.Context(), after, n)
		out := make([]child, len(ids))
		for i, id := range ids {
			out[i] = child{ID: id.String()}
		}
		return out, err
	})
}

// adminPatchThread changes the thread's settings, each only when given: {"agent_writes":
// "direct"|"propose"|null, "untrusted_writes": "propose"|"apply"|"refuse"|null} (null: inherited,
// docs/spec.md §17, §19), "title" (string or null), "shared_with" (the admin's, §20). Every value
// is checked before any is written.
func (s *Server) adminPatchThread(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	var in struct {
		AgentWrites     json.RawMessage `json:"agent_writes"`
		UntrustedWrites json.RawMessage `json:"untrusted_writes"`
		SharedWith      json.RawMessage `json:"shared_with"`
		// Title is the user's name of the thread; "" or null for none.
		Title json.RawMessage `json:"title"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		return err
	}
	var title *string
	if in.Title != nil {
		if err := json.Unmarshal(in.Title, &title); err != nil {
			return apierr.BadRequest("invalid_type", "title", "title must be a string or null")
		}
		if title == nil {
			title = new(string)
		}
	}
	var sharedWith []string
	if in.SharedWith != nil {
		if !principalFrom(r.Context()).admin { // docs/spec.md §20: the admin shares, no client
			return errShareAdminOnly
		}
		if string(in.SharedWith) != "null" {
			if err := json.Unmarshal(in.SharedWith, &sharedWith); err != nil {
				return apierr.BadRequest("invalid_value", "shared_with", `shared_with must be a list of client names, or ["*"] for every client`)
			}
		}
	}
	agentWrites, err := setting(in.AgentWrites, "agent_writes", `agent_writes must be "direct", "propose" or null`)
	if err != nil {
		return err
	}
	untrustedWrites, err := setting(in.UntrustedWrites, "untrusted_writes", `untrusted_writes must be "propose", "apply", "refuse" or null`)
	if err != nil {
		return err
	}
	if title != nil {
		if err := ws.SetTitle(r.Context(), *title); err != nil {
			return err
		}
	}
	if agentWrites != nil {
		if err := ws.SetAgentWrites(r.Context(), *agentWrites); err != nil {
			return err
		}
	}
	if untrustedWrites != nil {
		if err := ws.SetUntrustedWrites(r.Context(), *untrustedWrites); err != nil {
			return err
		}
	}
	if in.SharedWith != nil {
		if err := ws.SetSharedWith(r.Context(), sharedWith); err != nil {
			return err
		}
	}
	d, err := ws.Get(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, d)
}

// adminCreateThread makes the thread, empty, when it does not exist (docs/spec.md §17: a scope
// is named before it holds anything): 201 with it when made, 200 when it existed.
func (s *Server) adminCreateThread(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	created, err := ws.Create(r.Context())
	if err != nil {
		return err
	}
	d, err := ws.Get(r.Context())
	if err != nil {
		return err
	}
	if created {
		return writeJSON(w, http.StatusCreated, d)
	}
	return writeJSON(w, http.StatusOK, d)
}

// setting reads a setting of a PATCH: nil when absent, "" for null (inherited), else its value; a
// value that is not a string, or is empty, is refused with message.
func setting(raw json.RawMessage, field, message string) (*string, error) {
	if raw == nil {
		return nil, nil
	}
	mode := ""
	if string(raw) != "null" {
		if err := json.Unmarshal(raw, &mode); err != nil || mode == "" {
			return nil, apierr.BadRequest("invalid_value", field, "%s", message)
		}
	}
	return &mode, nil
}

// adminMovePreference moves a preference to another thread of the client (a scope, usually):
// POST …/preferences/{id}/move {"to": "alice"}; 200 with the preference as it now stands there.
func (s *Server) adminMovePreference(w http.ResponseWriter, r *http.Request) error {
	ws, id, err := s.itemOf(r)
	if err != nil {
		return err
	}
	if principalFrom(r.Context()).thread != "" {
		return errLinkScope
	}
	var in struct {
		To *string `json:"to"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		return err
	}
	if in.To == nil {
		return apierr.BadRequest("missing_required_parameter", "to", "to is required: the thread to move the preference to")
	}
	to, err := threadNamed(ws.ThreadID(), *in.To, "to")
	if err != nil {
		return err
	}
	if err := s.sharedScopeRefused(r, to); err != nil { // a client never writes a shared scope
		return err
	}
	p, err := ws.MovePreference(r.Context(), id, to)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}

// adminDismiss dismisses a pending proposal (docs/spec.md §17): it can never be applied.
func (s *Server) adminDismiss(w http.ResponseWriter, r *http.Request) error {
	return s.eventAction(w, r, (*workspace.Workspace).DismissProposal)
}

// adminProposals lists the thread's pending proposals, oldest first (one page: a thread holds
// few).
func (s *Server) adminProposals(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	limit, err := limitOf(r)
	if err != nil {
		return err
	}
	return list(w, limit, func(n int) ([]workspace.Event, error) { return ws.PendingProposals(r.Context(), n) })
}
