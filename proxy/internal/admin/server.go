// Package admin is wsproxy's user path: the admin REST (docs/spec.md §8, §13), the workspace
// panel and its sessions and links, and the live event streams with the LISTEN loop that wakes
// them. It reaches the workspace only through tools (the user path, which ignores locks), never
// through the turn engine: the model's path and the user's meet in tools and Postgres alone.
package admin

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/tools"
)

// Options configure a Server.
type Options struct {
	// Store holds the workspaces. Required.
	Store *tools.Store
	// Guard authenticates calls (the admin token, client keys for the panel) and throttles
	// failures. Required.
	Guard *auth.Guard
	// ReadBody reads a request's body within the HTTP edge's limits; the caller calls release
	// when done with it. Required.
	ReadBody func(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error)
	// ListenURL is a direct connection to Postgres for LISTEN (DATABASE_LISTEN_URL): the event
	// streams of every replica wake on its notifications. Empty: streams read at each heartbeat.
	ListenURL string
	// DisablePanel turns the workspace panel (/ui/) off.
	DisablePanel bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// Server serves the user path. Close ends its event streams.
type Server struct {
	opts Options
	log  *slog.Logger
	// Sessions and links are signed by signer; the hub wakes streams on Postgres's
	// notifications, listened to until Close; closing ends the streams.
	signer     signer
	hub        *eventHub
	closing    chan struct{}
	closeOnce  sync.Once
	heartbeat  atomic.Int64 // of the event streams, in nanoseconds
	stopListen context.CancelFunc
	listening  sync.WaitGroup
}

// New returns the user path's server; it listens to Postgres's notifications until Close.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, log: opts.Logger, signer: newSigner(opts.Guard.AdminToken), hub: newEventHub(),
		closing: make(chan struct{})}
	s.SetHeartbeat(heartbeat)
	listenCtx, stop := context.WithCancel(context.Background())
	s.stopListen = stop
	if opts.ListenURL != "" {
		s.listening.Go(func() {
			tools.ListenEvents(listenCtx, opts.ListenURL, s.hub.changed, s.hub.resync, s.log)
		})
	}
	return s
}

// Register adds the admin REST's routes, and the panel's unless it is off, to mux.
func (s *Server) Register(mux *http.ServeMux) {
	s.adminRoutes(mux)
	if !s.opts.DisablePanel {
		s.panelRoutes(mux)
	}
}

// Close ends the event streams and stops listening to Postgres, once; an HTTP server's
// shutdown waits for the streams otherwise.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.stopListen()
		s.listening.Wait()
	})
}

// SetHeartbeat sets how often an idle event stream gets a comment line (15 s unless set), for
// the streams opened after it.
func (s *Server) SetHeartbeat(d time.Duration) { s.heartbeat.Store(int64(d)) }

// Routes are the admin REST's routes, "METHOD /path" each, as the OpenAPI document names them.
func Routes() []string {
	out := make([]string, len(adminRouteTable))
	for i, rt := range adminRouteTable {
		out[i] = rt.method + " " + rt.path
	}
	return out
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, func(), error) {
	return s.opts.ReadBody(w, r)
}
