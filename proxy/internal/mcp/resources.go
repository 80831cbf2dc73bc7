package mcp

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wsproxy/wsproxy/proxy/internal/eventhub"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// A thread's workspace is the resource workspace://{thread} (docs/spec.md §15): the block of
// §4, text/plain, the thread named as the scope names it.
const uriScheme = "workspace://"

// uriEscaper escapes what RFC 6570's simple expansion of {thread} escapes in a thread id (the
// rest of a thread id's characters are unreserved).
var uriEscaper = strings.NewReplacer(":", "%3A", "@", "%40")

// resourceURI is the URI of the thread the scope names name.
func resourceURI(name string) string { return uriScheme + uriEscaper.Replace(name) }

// threadOfURI is the thread name of a workspace resource's URI.
func threadOfURI(uri string) (string, bool) {
	rest, ok := strings.CutPrefix(uri, uriScheme)
	if !ok {
		return "", false
	}
	name, err := url.PathUnescape(rest)
	return name, err == nil && name != ""
}

// resolveURI is the thread of a workspace resource's URI in ctx's scope; a resource not found
// (the SDK's error) when it names none the scope may see.
func resolveURI(ctx context.Context, uri string) (workspace.ThreadID, error) {
	name, ok := threadOfURI(uri)
	if !ok {
		return workspace.ThreadID{}, mcp.ResourceNotFoundError(uri)
	}
	id, err := scopeFrom(ctx).resolve(name)
	if err != nil {
		return workspace.ThreadID{}, mcp.ResourceNotFoundError(uri)
	}
	return id, nil
}

// readResource answers resources/read: the thread's block as it would be injected now, ending
// with its version (as of change N: an update's or removal's as_of).
func (s *Server) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	id, err := resolveURI(ctx, req.Params.URI)
	if err != nil {
		return nil, err
	}
	d, err := s.opts.Store.Workspace(id).Get(ctx)
	if errors.Is(err, workspace.ErrNotFound) {
		return nil, mcp.ResourceNotFoundError(req.Params.URI)
	}
	if err != nil {
		return nil, s.storeError(ctx, "mcp resource read failed", err)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "text/plain", Text: tools.AsOfChange(d.Block, d.LastEventID)}}}, nil
}

// storeError is the JSON-RPC error of a failure of the store, logged.
func (s *Server) storeError(ctx context.Context, msg string, err error) error {
	s.log.LogAttrs(ctx, slog.LevelWarn, msg, slog.Any("err", err))
	if errors.Is(err, workspace.ErrUnavailable) {
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the workspace store (Postgres) is unavailable"}
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "internal error"}
}

// resourcePageSize is how many threads a page of resources/list holds.
const resourcePageSize = 100

// listResources answers resources/list itself (the SDK lists only resources added to it): the
// threads of the request's scope, most recently updated first, a page at a time (the cursor is
// the thread listing's, docs/spec.md §8).
func (s *Server) listResources(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "resources/list" {
			return next(ctx, method, req)
		}
		var cursor string
		if p, ok := req.GetParams().(*mcp.ListResourcesParams); ok && p != nil {
			cursor = p.Cursor
		}
		sc := scopeFrom(ctx)
		var threads []workspace.Thread
		var err error
		if sc.bound() {
			var th workspace.Thread
			th, err = s.opts.Store.Workspace(sc.thread).Summary(ctx)
			switch {
			case err == nil && cursor == "":
				threads = []workspace.Thread{th}
			case errors.Is(err, workspace.ErrNotFound):
				err = nil
			}
		} else {
			threads, err = s.opts.Store.Threads(ctx, cursor, sc.listPrefix(), workspace.ThreadFilter{}, resourcePageSize+1)
		}
		var ve *workspace.ValidationError
		if errors.As(err, &ve) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "cursor: not a cursor of this listing"}
		}
		if err != nil {
			return nil, s.storeError(ctx, "mcp resource list failed", err)
		}
		res := &mcp.ListResourcesResult{Resources: []*mcp.Resource{}, Cacheable: mcp.Cacheable{CacheScope: "private"}}
		if len(threads) > resourcePageSize {
			threads = threads[:resourcePageSize]
			res.NextCursor = threads[len(threads)-1].Cursor
		}
		for _, th := range threads {
			id, _ := workspace.ParseThreadID(th.ID) // every stored id was checked when the thread was made
			name := sc.name(id)
			r := &mcp.Resource{URI: resourceURI(name), Name: name, MIMEType: "text/plain"}
			if th.Objective != nil {
				r.Description = *th.Objective
			}
			res.Resources = append(res.Resources, r)
		}
		return res, nil
	}
}

// Subscriptions (docs/spec.md §15). The server keeps no session, so a subscription lives in the
// stream of the request that holds it: the subscriptions/listen request of MCP 2026-07-28, held
// open by its client on whichever replica it reached. One watch per SDK server and resource,
// woken by the hub on every replica's change of the thread, reads the thread's last event id and
// tells the SDK when it moved, which notifies every session subscribed to the resource there.
// resources/subscribe of an earlier version of MCP cannot be served: its notifications would go
// on a session's GET stream, and a stateless server has neither.

type watchKey struct {
	srv *mcp.Server
	uri string
}

// watch is a resource's watch, and the sessions subscribed to it.
type watch struct {
	sessions map[*mcp.ServerSession]bool
	stop     context.CancelFunc
}

type subscriptions struct {
	mu      sync.Mutex
	watches map[watchKey]*watch
}

// errSubscribeStateless: resources/subscribe before MCP 2026-07-28.
var errSubscribeStateless = &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
	Message: "this server keeps no session: subscribe with MCP 2026-07-28 (subscriptions/listen), whose stream carries the notifications"}

// subscribe subscribes the request's session to a workspace resource of its scope on srv.
func (s *Server) subscribe(ctx context.Context, srv *mcp.Server, req *mcp.SubscribeRequest) error {
	if ip := req.Session.InitializeParams(); ip != nil && ip.ProtocolVersion < "2026-07-28" {
		return errSubscribeStateless
	}
	id, err := resolveURI(ctx, req.Params.URI)
	if err != nil {
		return err
	}
	s.subs.mu.Lock()
	defer s.subs.mu.Unlock()
	k := watchKey{srv, req.Params.URI}
	w := s.subs.watches[k]
	if w == nil {
		ctx, stop := context.WithCancel(s.closing)
		w = &watch{sessions: map[*mcp.ServerSession]bool{}, stop: stop}
		s.subs.watches[k] = w
		ws := s.opts.Store.Workspace(id)
		s.watching.Go(func() { s.watchResource(ctx, srv, req.Params.URI, ws) })
	}
	w.sessions[req.Session] = true
	return nil
}

// unsubscribe ends session's subscription to uri on srv, and the resource's watch with the last.
func (s *Server) unsubscribe(srv *mcp.Server, uri string, session *mcp.ServerSession) {
	s.subs.mu.Lock()
	defer s.subs.mu.Unlock()
	k := watchKey{srv, uri}
	w := s.subs.watches[k]
	if w == nil || !w.sessions[session] {
		return
	}
	delete(w.sessions, session)
	if len(w.sessions) == 0 {
		w.stop()
		delete(s.subs.watches, k)
	}
}

// watchResource tells srv's subscribers of uri, the workspace of ws, of every change of it, until
// ctx ends: woken by the hub, or at each heartbeat, it reads the last event ids of the thread (a
// thread deleted has none) and of its ancestors (docs/spec.md §17: their preferences are in the
// resource, and the watch follows them as the parents change), and a new one is a change.
func (s *Server) watchResource(ctx context.Context, srv *mcp.Server, uri string, ws *workspace.Workspace) {
	var last []int64 // the thread's, then its ancestors'
	var ancestors []string
	first := true
	_ = s.opts.Hub.WatchAlso(ctx, ws.ThreadID().String(), eventhub.Heartbeat, func(bool) ([]string, error) {
		now, also, err := versions(ctx, ws)
		if err != nil {
			if ctx.Err() == nil {
				s.log.LogAttrs(ctx, slog.LevelWarn, "mcp subscription read failed", slog.String("thread", ws.ThreadID().String()), slog.Any("err", err))
			}
			return ancestors, nil // read again at the next wake-up
		}
		ancestors = also
		switch {
		case first:
			first, last = false, now
			if s.opts.Watching != nil {
				s.opts.Watching(uri)
			}
		case !slices.Equal(now, last):
			last = now
			_ = srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: uri}) // it logs its own failures
		}
		return ancestors, nil
	})
}

// versions is the last event id of ws's thread (0 for a thread that does not exist, as for one
// with no event yet: a turn's start that creates a thread is no change of its workspace, its
// first event is), then its ancestors', and the ancestors (stored form).
func versions(ctx context.Context, ws *workspace.Workspace) ([]int64, []string, error) {
	id, err := lastEventID(ctx, ws)
	if err != nil {
		return nil, nil, err
	}
	ancestors, err := ws.Ancestors(ctx)
	if err != nil {
		return nil, nil, err
	}
	now, also := []int64{id}, make([]string, len(ancestors))
	for i, a := range ancestors {
		now = append(now, a.LastEventID)
		also[i] = a.Thread.String()
	}
	return now, also, nil
}

// lastEventID is the thread's last event id; 0 for a thread that does not exist.
func lastEventID(ctx context.Context, ws *workspace.Workspace) (int64, error) {
	id, err := ws.LastEventID(ctx)
	if errors.Is(err, workspace.ErrNotFound) {
		return 0, nil
	}
	return id, err
}
