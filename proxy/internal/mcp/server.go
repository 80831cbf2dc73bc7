// Package mcp serves the workspace over the Model Context Protocol (docs/spec.md §15): the five
// workspace tools and a resource per thread, over MCP's streamable HTTP transport through the
// official Go SDK. It is stateless: every request is authenticated and answered on its own, so
// any replica answers any request, and nothing another replica would need is kept in memory.
// Its calls take the agent path of tools (locks in SQL, a transaction per call, an event per
// change, via "mcp"); it never reaches the turn engine.
package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/eventhub"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// Options configure a Server.
type Options struct {
	// Store holds the workspaces. Required.
	Store *workspace.Store
	// Guard authenticates requests (the admin token, client keys) and throttles failures.
	// Required.
	Guard *auth.Guard
	// Hub wakes the resource subscriptions when their thread changes on any replica. Required.
	Hub *eventhub.Hub
	// ReadBody reads a request's body within the HTTP edge's limits; the caller calls release
	// when done with it. Required.
	ReadBody func(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error)
	// MaxBatch bounds the messages of one request (a JSON-RPC batch's, MCP 2025-03-26): a batch
	// of more is refused whole, before any of its calls runs. Required.
	MaxBatch int
	// Metrics, when set, count the tool calls.
	Metrics Metrics
	// Admit, when set, counts a request of a client (its key's, or its thread token's) against
	// its limits, and refuses it (an error to answer with) past one (docs/spec.md §20).
	Admit func(r *http.Request, client string) error
	// TracerProvider, when set, traces each tool call as an execute_tool span; TraceContent
	// records its arguments and result on it.
	TracerProvider trace.TracerProvider
	TraceContent   bool
	// Version is the version the server names to its clients. Empty means "dev".
	Version string
	// Logger; nil discards.
	Logger *slog.Logger
	// Watching, a test's hook, is called with a resource's URI once its watch has read where the
	// thread stands: every change after it is announced to the resource's subscribers. Nil in
	// production.
	Watching func(uri string)
}

// Metrics count what MCP does; the HTTP edge's Prometheus metrics implement it.
type Metrics interface {
	// MCPToolCall counts a workspace tool call over MCP: its tool, whether it succeeded, and the
	// locked preferences it named and left alone.
	MCPToolCall(tool string, ok bool, lockedSkips int, untrusted string)
}

// Server serves /mcp. Close ends its subscriptions.
type Server struct {
	opts    Options
	log     *slog.Logger
	signer  auth.Signer
	tracing tracing
	handler http.Handler // the SDK's streamable HTTP transport
	// The SDK's servers: one for the admin token, one for thread tokens, one per client (their
	// resources' URIs name threads within the client's namespace, so their subscriptions must
	// not meet another client's).
	admin, bound *mcp.Server
	clientsMu    sync.Mutex
	clients      map[string]*mcp.Server
	subs         subscriptions
	// closing ends the requests in flight (the subscriptions' streams) and the watches.
	closing  context.Context
	close    context.CancelFunc
	watching sync.WaitGroup
}

// New returns the MCP server.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	closing, closeFn := context.WithCancel(context.Background())
	s := &Server{opts: opts, log: opts.Logger, signer: opts.Guard.Signer(),
		tracing: newTracing(opts.TracerProvider, opts.TraceContent), clients: map[string]*mcp.Server{},
		subs: subscriptions{watches: map[watchKey]*watch{}}, closing: closing, close: closeFn}
	s.admin, s.bound = s.newServer(adminTools), s.newServer(boundTools)
	s.handler = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server { return s.serverFor(scopeFrom(r.Context())) },
		&mcp.StreamableHTTPOptions{
			Stateless: true,
			// One JSON answer per call; a subscriptions/listen stream is SSE all the same.
			JSONResponse: true,
			// Every request carries a bearer token (never a cookie), so a page of another site
			// that a DNS rebinding points at a loopback wsproxy has nothing to send; behind a
			// proxy on the same host, every Host is another.
			DisableLocalhostProtection: true,
			// Bodies are read within the edge's limits before the SDK reads them (ServeHTTP).
			MaxRequestBodyBytes: -1,
			// A subscriptions/listen stream ends when its client leaves (or at Close).
			PropagateRequestCancellation: true,
			Logger:                       sdkLogger(opts.Logger),
		})
	return s
}

// newServer is one of the SDK's servers, with the tools of defs and the workspace resources.
func (s *Server) newServer(defs []*mcp.Tool) *mcp.Server {
	var srv *mcp.Server
	srv = mcp.NewServer(&mcp.Implementation{Name: "wsproxy", Title: "wsproxy workspace", Version: s.opts.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       sdkLogger(s.opts.Logger),
		// The tool list never changes; nor is a new thread told (resources/list pages through
		// them as they are).
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Resources: &mcp.ResourceCapabilities{Subscribe: true}},
		SubscribeHandler: func(ctx context.Context, req *mcp.SubscribeRequest) error {
			return s.subscribe(ctx, srv, req)
		},
		UnsubscribeHandler: func(_ context.Context, req *mcp.UnsubscribeRequest) error {
			s.unsubscribe(srv, req.Params.URI, req.Session)
			return nil
		},
		// What a token sees is its own: no answer may be shared with another's.
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) { c.CacheScope = "private" },
	})
	for _, t := range defs {
		srv.AddTool(t, s.callTool(t.Name))
	}
	srv.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: uriScheme + "{thread}", Name: "workspace", Title: "A thread's workspace",
		Description: "The thread's workspace block: its objective and preferences, as the proxied conversation's model sees it.",
		MIMEType:    "text/plain"}, s.readResource)
	srv.AddReceivingMiddleware(oneAtATime, s.listResources)
	return srv
}

// callsKey holds a request's turn to run a call (withCalls).
type callsKey struct{}

// withCalls gives ctx's request the turn its calls take one at a time (oneAtATime).
func withCalls(ctx context.Context) context.Context {
	return context.WithValue(ctx, callsKey{}, make(chan struct{}, 1))
}

// oneAtATime runs the calls of one request one at a time, as a turn runs a round's calls: the SDK
// runs a batch's calls at once, and each would hold one of the pool's connections. Notifications
// (a call's cancellation among them) never wait.
func oneAtATime(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		turn, ok := ctx.Value(callsKey{}).(chan struct{})
		if !ok || strings.HasPrefix(method, "notifications/") {
			return next(ctx, method, req)
		}
		select {
		case turn <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		defer func() { <-turn }()
		return next(ctx, method, req)
	}
}

// instructions tell the client what the server is.
const instructions = "wsproxy keeps a persistent workspace per conversation thread: an objective and the user's " +
	"preferences (hard: must-haves; soft: preferences). The same workspace is injected into the thread's proxied " +
	"conversations. Read it (list_preferences, or the workspace://{thread} resource) and keep it current with the " +
	"tools: set the objective, record every preference the user states in the user's own words, edit or remove one only when the user asks. " +
	"Items marked (locked) are the user's: the tools cannot change them, so ask the user to unlock one first."

// serverFor is the SDK server of the request's scope.
func (s *Server) serverFor(sc scope) *mcp.Server {
	switch {
	case sc.bound():
		return s.bound
	case sc.admin:
		return s.admin
	}
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	srv := s.clients[sc.client]
	if srv == nil { // the clients are CLIENT_KEYS's: a few
		srv = s.newServer(clientTools)
		s.clients[sc.client] = srv
	}
	return srv
}

// ServeHTTP serves /mcp: the request is authenticated (401 before any MCP message is read) and
// its body read within the edge's limits, a batch of more than MaxBatch messages refused; then
// the SDK answers it, in the request's scope, its calls one at a time (oneAtATime). A
// request still running when Close is called ends then, and a thread token's when its token no
// longer holds.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sc, err := s.authenticate(r)
	if err == nil && s.opts.Admit != nil && !sc.admin {
		client := sc.client
		if sc.bound() {
			client = sc.thread.Client
		}
		if client != "" {
			err = s.opts.Admit(r, client)
		}
	}
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	body, release, err := s.opts.ReadBody(w, r)
	defer release()
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	if overBatch(body, s.opts.MaxBatch) {
		writeBatchRefused(w, s.opts.MaxBatch)
		return
	}
	ctx, cancel := context.WithCancel(withCalls(withScope(r.Context(), sc)))
	defer cancel()
	defer context.AfterFunc(s.closing, cancel)()
	if sc.bound() && listens(body) {
		go s.endWithToken(ctx, cancel, sc)
	}
	r = r.WithContext(ctx)
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.handler.ServeHTTP(w, r)
}

// listens reports whether body, one message or a batch, holds a subscriptions/listen request: a
// stream held open, which ends when its thread token no longer holds (endWithToken). Any other
// request was authenticated as it began and answers by itself: a call that meets its thread's
// deletion is refused, not cut.
func listens(body []byte) bool {
	method := func(msg []byte) bool {
		s, e, ok := rawjson.Member(msg, "method")
		if !ok {
			return false
		}
		m, _ := rawjson.Unquote(json.RawMessage(msg[s:e]))
		return m == "subscriptions/listen"
	}
	if method(body) {
		return true
	}
	found := false
	_ = rawjson.Each(body, func(_, start, end int) error {
		found = found || method(body[start:end])
		return nil
	})
	return found
}

// errOverBatch stops counting a batch's messages at the first past the bound.
var errOverBatch = errors.New("a batch over the bound")

// overBatch reports whether body is a JSON-RPC batch of more than bound messages: the top-level
// array's elements are counted where they lie, none decoded, up to the first past bound. Anything
// else (one message, malformed JSON) is the SDK's to answer.
func overBatch(body []byte, bound int) bool {
	err := rawjson.Each(body, func(i, _, _ int) error {
		if i >= bound {
			return errOverBatch
		}
		return nil
	})
	return errors.Is(err, errOverBatch)
}

// writeBatchRefused answers a batch over the bound: 413, and a JSON-RPC error (one, as for a
// batch that is invalid as a whole) saying the bound.
func writeBatchRefused(w http.ResponseWriter, bound int) {
	b, _ := rawjson.Marshal(struct {
		JSONRPC string         `json:"jsonrpc"`
		ID      *int           `json:"id"` // null: the batch is refused as a whole
		Error   *jsonrpc.Error `json:"error"`
	}{JSONRPC: "2.0", Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
		Message: fmt.Sprintf("a batch carries at most %d messages; nothing of this one was run: send it in smaller batches", bound)}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	_, _ = w.Write(b)
}

// Close ends the requests in flight (the subscriptions' streams) and the subscriptions' watches,
// once; an HTTP server's shutdown waits for the streams otherwise.
func (s *Server) Close() {
	s.close()
	s.watching.Wait()
}

// sdkLogger is log for the SDK: its warnings and errors only (it logs every subscription and
// notification at Info, with messages of its own making).
func sdkLogger(log *slog.Logger) *slog.Logger {
	return slog.New(warnHandler{log.Handler()})
}

type warnHandler struct{ slog.Handler }

func (h warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnHandler{h.Handler.WithAttrs(attrs)}
}

func (h warnHandler) WithGroup(name string) slog.Handler {
	return warnHandler{h.Handler.WithGroup(name)}
}
