// Package admin is wsproxy's user path: the admin REST (docs/spec.md §8, §13), the workspace
// panel and its sessions and links, and the live event streams (eventhub wakes them). It
// reaches the workspace only through tools (the user path, which ignores locks), never through
// the turn engine: the model's path and the user's meet in tools and Postgres alone.
package admin

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/eventhub"
	"github.com/wsproxy/wsproxy/workspace"
)

// Options configure a Server.
type Options struct {
	// Store holds the workspaces. Required.
	Store *workspace.Store
	// Guard authenticates calls (the admin token, client keys for the panel) and throttles
	// failures. Required.
	Guard *auth.Guard
	// ReadBody reads a request's body within the HTTP edge's limits; the caller calls release
	// when done with it. Required.
	ReadBody func(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error)
	// Hub wakes the event streams when their thread changes on any replica. Required.
	Hub *eventhub.Hub
	// DisablePanel turns the workspace panel (/ui/) off.
	DisablePanel bool
	// DisableMCP says MCP (/mcp) is off: no MCP token is issued.
	DisableMCP bool
	// Heartbeat is how often an idle event stream gets a comment line and reads its thread
	// unwoken. Zero means eventhub.Heartbeat.
	Heartbeat time.Duration
	// Metrics, when set, counts the event streams.
	Metrics Metrics
	// Usage, when set, is what a client used in the current windows on every replica (the
	// limits' counts, docs/spec.md §20), shown by the clients listing and GET /admin/v1/me; a
	// value JSON encodes. Nil shows null.
	Usage func(client string) any
	// Logger; nil discards.
	Logger *slog.Logger
}

// Metrics count the event streams; the HTTP edge's Prometheus metrics implement it.
type Metrics interface {
	// EventStreams adds delta to the event streams open: 1 when one starts, -1 when it ends.
	EventStreams(delta int)
	// EventStreamFailed counts an event stream the server ended on an error (Postgres failed),
	// not its client's leaving, its session's end or a shutdown.
	EventStreamFailed()
}

type noMetrics struct{}

func (noMetrics) EventStreams(int)   {}
func (noMetrics) EventStreamFailed() {}

// Server serves the user path. Close ends its event streams.
type Server struct {
	opts Options
	log  *slog.Logger
	// Sessions and links are signed by signer; closing ends the streams.
	signer  auth.Signer
	closing context.Context
	close   context.CancelFunc
}

// New returns the user path's server.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = eventhub.Heartbeat
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	s := &Server{opts: opts, log: opts.Logger, signer: opts.Guard.Signer()}
	s.closing, s.close = context.WithCancel(context.Background())
	return s
}

// Register adds the admin REST's routes, and the panel's unless it is off, to mux.
func (s *Server) Register(mux *http.ServeMux) {
	s.adminRoutes(mux)
	if !s.opts.DisablePanel {
		s.panelRoutes(mux)
	}
}

// Close ends the event streams, once; an HTTP server's shutdown waits for them otherwise.
func (s *Server) Close() { s.close() }

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, func(), error) {
	return s.opts.ReadBody(w, r)
}
