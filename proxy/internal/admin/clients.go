package admin

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/workspace"
)

// The clients' REST (docs/spec.md §20): the admin creates, rotates and revokes clients' keys
// while every replica serves; a key is shown once, in the answer that made it, and only its hash
// and prefix are kept. A client reads its own name and limits (GET /admin/v1/me).

var errAdminOnly = &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "admin_only",
	Message: "the clients are the admin's: this needs the admin token (or the admin's panel session)"}

// clientView is a client as the REST shows it: its keys' prefixes, never a key, and what it used
// in the current windows (null when nothing counts it).
type clientView struct {
	workspace.Client
	Usage any `json:"usage"`
}

// newKeyView is a key just made: the key itself, shown this once.
type newKeyView struct {
	workspace.ClientKey
	Key string `json:"key"`
}

// createdClient is a client just made, with its first key shown this once.
type createdClient struct {
	clientView
	Key string `json:"key"`
}

func (s *Server) view(c workspace.Client) clientView {
	return clientView{Client: c, Usage: s.usage(c.Name)}
}

// usage is what client used in the current windows, nil when nothing counts it.
func (s *Server) usage(client string) any {
	if s.opts.Usage == nil {
		return nil
	}
	return s.opts.Usage(client)
}

// adminOnly refuses every principal but the admin.
func adminOnly(r *http.Request) error {
	if !principalFrom(r.Context()).admin {
		return errAdminOnly
	}
	return nil
}

func clientNotFound(name string) error {
	return &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Param: "name",
		Message: fmt.Sprintf("no client %q", name)}
}

// limitsBody is a request's limits: each present field sets that limit, null to none.
type limitsBody map[string]*int64

// patch reads the limits given, each checked: a whole number from 1 up, or null for none (a
// limit of 0 is refused rather than read as either "none" or "refuse all": revoke to refuse).
func (l limitsBody) patch() (workspace.LimitsPatch, error) {
	var p workspace.LimitsPatch
	for name, v := range l {
		if v != nil && *v < 1 {
			return p, apierr.BadRequest("invalid_value", "limits."+name, "limits.%s must be 1 or more, or null for none", name)
		}
		switch name {
		case "requests_per_minute", "max_threads":
			var n *int32
			if v != nil {
				if *v > math.MaxInt32 {
					return p, apierr.BadRequest("invalid_value", "limits."+name, "limits.%s must be at most %d", name, math.MaxInt32)
				}
				x := int32(*v)
				n = &x
			}
			if name == "requests_per_minute" {
				p.SetRequestsPerMinute, p.Limits.RequestsPerMinute = true, n
			} else {
				p.SetMaxThreads, p.Limits.MaxThreads = true, n
			}
		case "tokens_per_day":
			p.SetTokensPerDay, p.Limits.TokensPerDay = true, v
		default:
			return p, apierr.BadRequest("unknown_parameter", "limits."+name,
				"unknown limit %q: the limits are requests_per_minute, tokens_per_day and max_threads", name)
		}
	}
	return p, nil
}

// reloadClients has this replica hold the change at once (the others within their next read).
func (s *Server) reloadClients(r *http.Request) {
	if err := s.opts.Guard.ClientKeys.Reload(r.Context()); err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "the client keys are changed; this replica holds them at its next read", slog.Any("err", err))
	}
}

func (s *Server) adminCreateClient(w http.ResponseWriter, r *http.Request) error {
	if err := adminOnly(r); err != nil {
		return err
	}
	var in struct {
		Name   *string    `json:"name"`
		Limits limitsBody `json:"limits"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		return err
	}
	if in.Name == nil {
		return apierr.BadRequest("missing_parameter", "name", "name is required")
	}
	if !workspace.ValidClientName(*in.Name) {
		return apierr.BadRequest("invalid_value", "name", "%s", workspace.ErrInvalidClient.Error())
	}
	p, err := in.Limits.patch()
	if err != nil {
		return err
	}
	key, stored := auth.NewKey()
	c, err := s.opts.Store.CreateClient(r.Context(), *in.Name, p.Limits, stored)
	if errors.Is(err, workspace.ErrClientExists) {
		return &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "client_exists", Param: "name",
			Message: fmt.Sprintf("a client %q exists: add a key to it (POST /admin/v1/clients/%s/keys) or delete it first", *in.Name, *in.Name)}
	}
	if err != nil {
		return err
	}
	s.reloadClients(r)
	w.Header().Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusCreated, createdClient{clientView: s.view(c), Key: key})
}

func (s *Server) adminListClients(w http.ResponseWriter, r *http.Request) error {
	if err := adminOnly(r); err != nil {
		return err
	}
	cs, err := s.opts.Store.Clients(r.Context())
	if err != nil {
		return err
	}
	out := make([]clientView, len(cs))
	for i, c := range cs {
		out[i] = s.view(c)
	}
	return writeJSON(w, http.StatusOK, page[clientView]{Data: out})
}

func (s *Server) adminGetClient(w http.ResponseWriter, r *http.Request) error {
	if err := adminOnly(r); err != nil {
		return err
	}
	name := r.PathValue("name")
	c, err := s.opts.Store.Client(r.Context(), name)
	if errors.Is(err, workspace.ErrNotFound) {
		return clientNotFound(name)
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, s.view(c))
}

func (s *Server) adminPatchClient(w http.ResponseWriter, r *http.Request) error {
	if err := adminOnly(r); err != nil {
		return err
	}
	var in struct {
		Limits limitsBody `json:"limits"`
	}
	if err := s.decodeBody(w, r, &in); err != nil {
		return err
	}
	p, err := in.Limits.patch()
	if err != nil {
		return err
	}
	name := r.PathValue("name")
	c, err := s.opts.Store.SetClientLimits(r.Context(), name, p)
	if errors.Is(err, workspace.ErrNotFound) {
		return clientNotFound(name)
	}
	if err != nil {
		return err
	}
	s.reloadClients(r)
	return writeJSON(w, http.StatusOK, s.view(c))
}

func (s *Server) adminDeleteClient(w http.ResponseWriter, r *http.Request) error {
	if err := adminOnly(r); err != nil {
		return err
	}
	name := r.PathValue("name")
	err := s.opts.Store.DeleteClient(r.Context(), name)
	if errors.Is(err, workspace.ErrNotFound) {
		return clientNotFound(name)
	}
	if err != nil {
		return err
	}
	s.reloadClients(r)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) adminAddClientKey(w http.ResponseWriter, r *http.Request) error {
	if err := adminOnly(r); err != nil {
		return err
	}
	name := r.PathValue("name")
	key, stored := auth.NewKey()
	k, err := s.opts.Store.AddClientKey(r.Context(), name, stored)
	if errors.Is(err, workspace.ErrNotFound) {
		return clientNotFound(name)
	}
	if err != nil {
		return err
	}
	s.reloadClients(r)
	w.Header().Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusCreated, newKeyView{ClientKey: k, Key: key})
}

func (s *Server) adminRevokeClientKey(w http.ResponseWriter, r *http.Request) error {
	if err := adminOnly(r); err != nil {
		return err
	}
	name, idText := r.PathValue("name"), r.PathValue("id")
	id, err := strconv.ParseInt(idText, 10, 64)
	if err == nil {
		err = s.opts.Store.RevokeClientKey(r.Context(), name, id)
	}
	if err != nil && (errors.Is(err, workspace.ErrNotFound) || errors.Is(err, strconv.ErrSyntax) || errors.Is(err, strconv.ErrRange)) {
		return &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Param: "id",
			Message: fmt.Sprintf("client %q has no live key %q", name, idText)}
	}
	if err != nil {
		return err
	}
	s.reloadClients(r)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// adminMe tells a client, by its key or its panel session, its name and limits (docs/spec.md
// §20); the admin is no client and has none.
func (s *Server) adminMe(w http.ResponseWriter, r *http.Request) error {
	p := principalFrom(r.Context())
	switch {
	case p.admin:
		return writeJSON(w, http.StatusOK, map[string]any{"admin": true, "name": nil, "limits": nil, "usage": nil})
	case p.thread != "" || p.client == "":
		return &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "link_not_allowed",
			Message: "a link opens one thread: it names no client"}
	}
	c, err := s.opts.Store.Client(r.Context(), p.client)
	if errors.Is(err, workspace.ErrNotFound) {
		// A client of a replica's CLIENT_KEYS not seeded (a test's, or a table not reached yet).
		c, err = workspace.Client{Name: p.client, Keys: []workspace.ClientKey{}}, nil
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		Admin  bool                   `json:"admin"`
		Name   string                 `json:"name"`
		Limits workspace.ClientLimits `json:"limits"`
		Usage  any                    `json:"usage"`
	}{Name: c.Name, Limits: c.Limits, Usage: s.usage(c.Name)})
}
