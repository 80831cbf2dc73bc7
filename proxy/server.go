// Package proxy is wsproxy's HTTP edge: the routes, the frame every thread turn runs in
// (serveTurn: the thread, the turn's start, the upstream over HTTP, the stream's writer, the
// usage written after it), the pass-through, the bodies' budget, request framing, metrics and
// the server spans. The turn engine is proxy/internal/turn, the user path proxy/internal/admin
// (docs/architecture.md).
package proxy

import (
	"cmp"
	"context"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/proxy/internal/admin"
	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/eventhub"
	"github.com/wsproxy/wsproxy/proxy/internal/limits"
	"github.com/wsproxy/wsproxy/proxy/internal/mcp"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/workspace"
)

// Defaults of Options' zero values.
const (
	DefaultMaxRequestBytes = 8 << 20
	DefaultUpstreamTimeout = 10 * time.Minute
	DefaultStreamKeepalive = 15 * time.Second
	DefaultWorkspaceBudget = 2 * time.Second
	// DefaultUpstreamURL is OpenAI's API, the upstream when none is configured.
	DefaultUpstreamURL = "https://api.openai.com/v1"
)

// Prompt cache key modes (PROMPT_CACHE_KEY, docs/spec.md §3.1).
const (
	// PromptCacheKeyAuto sets the key on thread turns when the upstream is DefaultUpstreamURL.
	PromptCacheKeyAuto = "auto"
	// PromptCacheKeyThread sets the key on every thread turn whose client sent none.
	PromptCacheKeyThread = "thread"
	// PromptCacheKeyOff never sets it.
	PromptCacheKeyOff = "off"
)

// Headers of the proxy's own: a thread on /v1 routes, and a request's placement (docs/spec.md §3.1).
// Neither is forwarded.
const (
	threadHeader    = "X-Thread-Id"
	placementHeader = "X-Workspace-Placement"
)

// Options configure a Server. Zero values take the defaults their comments state.
type Options struct {
	// Store holds the workspaces. Required.
	Store *workspace.Store
	// UpstreamURL is the base URL of the OpenAI-compatible upstream, e.g. https://api.openai.com/v1.
	UpstreamURL *url.URL
	// UpstreamAPIKey, when set, replaces the client's Authorization toward the upstream;
	// otherwise the client's is forwarded.
	UpstreamAPIKey string
	// Upstreams are the upstreams of the wire APIs, by API (proxy/api.go): OpenAI, OpenAI's
	// (whose base URL ends in /v1), in place of UpstreamURL and UpstreamAPIKey when neither is
	// set; Anthropic, the Messages API's (docs/spec.md §14; its base URL without /v1, e.g.
	// https://api.anthropic.com; its key goes in x-api-key); Gemini, the Gemini API's (§18; its
	// key goes in x-goog-api-key). One missing, or without a URL, is the provider's own API; one
	// without a key forwards the client's credentials.
	Upstreams map[API]Upstream
	// ThreadHeaders, when set, name the headers that name the thread of a request that names
	// none by X-Thread-Id or its path (such as X-Claude-Code-Session-Id), on every route: the
	// first of them the request carries (docs/spec.md §18).
	ThreadHeaders []string
	// ThreadParents, when set, are the parents (docs/spec.md §17; names in the client's
	// namespace, nearest first) a thread named by ThreadHeaders is created with: a new agent
	// session starts with its project's and its person's preferences (THREAD_PARENTS).
	ThreadParents []string
	// UntrustedMarkers begin text a client adds to a user's message, beside those of the clients
	// wsproxy knows (turn.ClientMarkers; UNTRUSTED_MARKERS, docs/spec.md §19).
	UntrustedMarkers []string
	// UpstreamTimeout is the longest wait for an upstream's response headers and the longest
	// silence inside its body. Zero means DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	// Transport carries the upstream requests. Nil means a clone of http.DefaultTransport that
	// keeps every idle connection until it has been idle for 90 s.
	Transport http.RoundTripper
	// ClientKeys, when set, are required on every /v1 request and namespace threads per client;
	// UpstreamAPIKey must then be set (clients' keys are wsproxy's, not the upstream's).
	ClientKeys *auth.ClientKeys
	// PassThroughRoutes are the routes forwarded as they are when ClientKeys is set (others:
	// 403). Nil means DefaultPassThroughRoutes.
	PassThroughRoutes *AllowedRoutes
	// TrustedProxies are the peers (proxies in front of wsproxy) whose X-Forwarded-For,
	// X-Forwarded-Proto and X-Forwarded-Host are believed: the client's address (failed
	// authentication is throttled per address), and the scheme and host it reached wsproxy by
	// (the session cookie's Secure, links, the panel's origin). Nil believes no peer.
	TrustedProxies auth.Peers
	// AdminToken is the bearer token of the admin REST. Empty refuses every admin call.
	AdminToken string
	// MaxToolRounds: see Runner. Zero means DefaultMaxToolRounds.
	MaxToolRounds int
	// MaxToolCallsPerRound and MaxToolCallsPerTurn: see Runner.
	MaxToolCallsPerRound, MaxToolCallsPerTurn int
	// Retries and RetryBackoff: see Runner.
	Retries      int
	RetryBackoff time.Duration
	// MaxRequestBytes caps a request body (413 over it). Zero means DefaultMaxRequestBytes.
	MaxRequestBytes int64
	// RequestReadTimeout bounds the time a request body may take to arrive (408 past it). Zero
	// means DefaultRequestReadTimeout.
	RequestReadTimeout time.Duration
	// MaxBufferedBytes bounds the request bodies held in memory across all requests at once (503
	// with Retry-After past it). Zero means DefaultMaxBufferedBytes.
	MaxBufferedBytes int64
	// Placement is where the workspace goes in a request (docs/spec.md §3.1); a request's
	// X-Workspace-Placement header wins. Empty means PlaceTail.
	Placement Placement
	// PromptCacheKey is PromptCacheKeyAuto, PromptCacheKeyThread or PromptCacheKeyOff: whether a
	// thread turn without a prompt_cache_key gets one derived from its thread. Empty means auto.
	PromptCacheKey string
	// Instructions stand before the block, whatever the placement. Empty means
	// workspace.TailInstructions with PlaceTail and workspace.SystemInstructions with PlaceSystem.
	Instructions string
	// Metrics, when set, are recorded; nil records none and serves no /metrics.
	Metrics *Metrics
	// MetricsToken, when set, is the bearer token /metrics needs (METRICS_TOKEN); empty serves
	// /metrics to anyone.
	MetricsToken string
	// TracerProvider, when set, traces requests, upstream rounds and tool calls (proxy/trace.go);
	// nil traces nothing, at no cost.
	TracerProvider trace.TracerProvider
	// TraceContent records tool arguments and results on spans (off by default: they come from
	// users' conversations).
	TraceContent bool
	// EventsInterval is how often each replica reads where the threads its event streams and MCP
	// subscriptions watch stand (docs/spec.md §13): a change reaches them within about that.
	// Zero means eventhub.DefaultInterval.
	EventsInterval time.Duration
	// DisablePanel turns the workspace panel (/ui/) off (UI=off).
	DisablePanel bool
	// DisableMCP turns the workspace over MCP (/mcp) off (MCP=off).
	DisableMCP bool
	// Version is the version MCP's clients are told. Empty means "dev".
	Version string
	// BypassUnavailable (WORKSPACE_UNAVAILABLE=bypass) forwards a thread turn whose workspace
	// cannot be read within WorkspaceBudget as a pass-through, marked X-Workspace: unavailable
	// and counted (docs/spec.md §10); off, such a turn gets 503 workspace_unavailable.
	BypassUnavailable bool
	// WorkspaceBudget is how long a bypassing turn waits for its workspace. Zero means
	// DefaultWorkspaceBudget.
	WorkspaceBudget time.Duration
	// StreamKeepalive is the longest a streamed turn's client waits without a byte once the
	// stream has started or a round it cannot see has begun: past it, a keepalive comment; also
	// the admin event streams' heartbeat (admin.Options.Heartbeat). Zero means
	// DefaultStreamKeepalive.
	StreamKeepalive time.Duration
	// Limits, when set, are each client's limits (docs/spec.md §20), asked on every request of a
	// client; nil takes them from ClientKeys (the clients table's, as its keys were last loaded).
	// The admin token is no client and has none.
	Limits LimitsSource
	// LimitsInterval is how often each replica writes its clients' usage to Postgres and reads
	// the other replicas' (how far over a limit a burst can go: proxy/internal/limits). Zero
	// means one second.
	LimitsInterval time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Server serves wsproxy's routes.
type Server struct {
	guard *auth.Guard // who may call
	// upstreamKeys are the operator's keys of every upstream (those set), redacted from what the
	// client gets.
	upstreamKeys [][]byte
	opts         Options
	log          *slog.Logger
	runner       *turn.Runner
	transport    http.RoundTripper // thread turns' upstream calls
	reverse      *httputil.ReverseProxy
	handler      http.Handler
	tracing      tracing
	maxBytes     int64
	budget       bodyBudget
	cacheKey     bool // set prompt_cache_key on thread turns
	// usage writes the turns' usage in the background; Shutdown writes what is left.
	usage *usageWriter
	// turns are the thread turns in flight, and the records of compactions being written
	// (compaction.go), which Shutdown waits for; draining (set by Shutdown) refuses new turns.
	turnsMu  sync.Mutex
	draining bool
	turns    sync.WaitGroup
	// hub wakes the event streams and MCP's subscriptions on Postgres's notifications.
	hub *eventhub.Hub
	// admin is the user path: the admin REST, the panel, the event streams.
	admin *admin.Server
	// mcp is the workspace over MCP; nil when off.
	mcp *mcp.Server
	// counter counts the clients' requests and tokens and holds them to their limits (nil
	// without client keys); stopLimits ends its sync (Shutdown). knownThreads are threads seen
	// to exist (max_threads).
	counter      *limits.Counter
	stopLimits   func()
	knownThreads knownThreads
}

// NewServer returns a server with its routes.
func NewServer(opts Options) *Server {
	turn.AddClientMarkers(opts.UntrustedMarkers)
	opts = opts.withDefaults()
	base := opts.Transport
	if base == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// Every connection a burst of streams opened stays for the next burst until it has
		// been idle for IdleConnTimeout (90 s); DefaultTransport keeps 100 at most, and every
		// stream past them would open a new one (a TCP and a TLS handshake).
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 0, math.MaxInt
		// A turn's request (the client's body, the workspace block and the five tools'
		// definitions: 5 KiB for a 1 KiB message) goes out in one write: with the default 4 KiB
		// buffer it took two, the second through a buffer allocated for each request.
		t.WriteBufferSize = 16 << 10
		base = t
	}
	transport := &timeoutTransport{Base: base, Timeout: opts.UpstreamTimeout,
		Observe: func(ctx context.Context, code string, d time.Duration) {
			opts.Metrics.observeUpstream(ctx, code, d)
			noteUpstream(ctx, code)
		}}
	tracing := newTracing(opts.TracerProvider)
	s := &Server{
		opts:    opts,
		log:     opts.Logger,
		tracing: tracing,
		runner: &turn.Runner{MaxToolRounds: opts.MaxToolRounds, MaxToolCallsPerRound: opts.MaxToolCallsPerRound, MaxToolCallsPerTurn: opts.MaxToolCallsPerTurn,
			Metrics: opts.Metrics,
			Retries: opts.Retries, RetryBackoff: opts.RetryBackoff, Tracing: turn.NewTracing(opts.TracerProvider, opts.TraceContent)},
		transport: transport,
		maxBytes:  opts.MaxRequestBytes,
		usage:     newUsageWriter(opts.Store, opts.Logger),
	}
	for _, a := range wireAPIs {
		if k := s.upstream(a).APIKey; k != "" {
			s.upstreamKeys = append(s.upstreamKeys, []byte(k))
		}
	}
	s.runner.Logger = s.fromUpstream().redactingLog(opts.Logger)
	opts.Metrics.watchUsage(s.usage.lag)
	s.budget.max = opts.MaxBufferedBytes
	s.startLimits()
	s.guard = &auth.Guard{AdminToken: opts.AdminToken, MetricsToken: opts.MetricsToken, ClientKeys: opts.ClientKeys, Peers: opts.TrustedProxies}
	var versions eventhub.Versions
	if opts.Store != nil {
		versions = opts.Store.Versions
	}
	s.hub = eventhub.New(versions, opts.EventsInterval, opts.Logger)
	s.admin = admin.New(admin.Options{Store: opts.Store, Guard: s.guard, ReadBody: s.readBody, Hub: s.hub,
		DisablePanel: opts.DisablePanel, DisableMCP: opts.DisableMCP, Heartbeat: opts.StreamKeepalive, Metrics: opts.Metrics.admin(),
		Usage: func(client string) any { return s.ClientUsage(client) }, Logger: opts.Logger})
	if !opts.DisableMCP {
		s.mcp = mcp.New(mcp.Options{Store: opts.Store, Guard: s.guard, Hub: s.hub, ReadBody: s.readBody,
			MaxBatch: cmp.Or(opts.MaxToolCallsPerRound, DefaultMaxToolCallsPerRound), Metrics: opts.Metrics.mcp(), Admit: s.admitMCP,
			TracerProvider: opts.TracerProvider, TraceContent: opts.TraceContent, Version: opts.Version, Logger: opts.Logger})
	}
	s.cacheKey = opts.PromptCacheKey == PromptCacheKeyThread || (opts.PromptCacheKey != PromptCacheKeyOff && isOpenAI(opts.UpstreamURL))
	s.reverse = &httputil.ReverseProxy{
		Rewrite:        s.rewritePassThrough,
		ModifyResponse: s.modifyResponse,
		Transport:      transport,
		BufferPool:     copyBuffers{}, // nil would allocate 32 KB per response
		// FlushInterval 0: ReverseProxy flushes every write of a text/event-stream response, or
		// of one without a Content-Length, and buffers the others (a flush per write of a plain
		// JSON body costs a syscall each).
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			apierr.Write(w, r, s.log, apierr.Transport(r.Context(), err))
		},
	}

	s.handler = s.observed(s.routes())
	return s
}

// withDefaults is opts with the default of every setting left zero.
func (opts Options) withDefaults() Options {
	if opts.UpstreamTimeout <= 0 {
		opts.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.RequestReadTimeout <= 0 {
		opts.RequestReadTimeout = DefaultRequestReadTimeout
	}
	if opts.MaxBufferedBytes <= 0 {
		opts.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	upstreams := make(map[API]Upstream, len(wireAPIs))
	for _, a := range wireAPIs {
		up := opts.Upstreams[a.name]
		if a.name == OpenAI && (opts.UpstreamURL != nil || opts.UpstreamAPIKey != "") {
			up = Upstream{URL: opts.UpstreamURL, APIKey: opts.UpstreamAPIKey}
		}
		if up.URL == nil {
			up.URL, _ = url.Parse(a.defaultURL)
		}
		upstreams[a.name] = up
	}
	opts.Upstreams = upstreams
	opts.UpstreamURL, opts.UpstreamAPIKey = upstreams[OpenAI].URL, upstreams[OpenAI].APIKey
	if opts.PassThroughRoutes == nil {
		opts.PassThroughRoutes, _ = ParseAllowedRoutes(DefaultPassThroughRoutes)
	}
	if opts.Placement == "" {
		opts.Placement = turn.PlaceTail
	}
	if opts.WorkspaceBudget <= 0 {
		opts.WorkspaceBudget = DefaultWorkspaceBudget
	}
	if opts.StreamKeepalive <= 0 {
		opts.StreamKeepalive = DefaultStreamKeepalive
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Logger = slog.New(requestIDHandler{opts.Logger.Handler()})
	return opts
}

// routes is the server's mux: the thread turns, the pass-through, the user path, the operator's
// endpoints, and the not_found error for everything else.
func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	s.registerAPIs(mux)
	s.admin.Register(mux)
	if s.mcp != nil {
		mux.Handle("/mcp", s.mcp)
	}
	if s.opts.Metrics != nil {
		mux.Handle("GET /metrics", s.metricsAuth(s.opts.Metrics.Handler()))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		apierr.WriteJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("GET /readyz", s.ready)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		apierr.Write(w, r, s.log, apierr.NoRoute(mux, r, "no route for "+r.Method+" "+r.URL.Path))
	})
	return mux
}

// Placement is where the workspace goes in a request (docs/spec.md §3.1): PlaceTail or
// PlaceSystem; ParsePlacement reads its name.
type Placement = turn.Placement

// Placements.
const (
	PlaceTail   = turn.PlaceTail
	PlaceSystem = turn.PlaceSystem
)

// ParsePlacement reads a placement's name (WORKSPACE_PLACEMENT, X-Workspace-Placement).
func ParsePlacement(s string) (Placement, error) { return turn.ParsePlacement(s) }

// Defaults of the loop's bounds (Options' zero values).
const (
	DefaultMaxToolRounds        = turn.DefaultMaxToolRounds
	DefaultMaxToolCallsPerRound = turn.DefaultMaxToolCallsPerRound
	DefaultMaxToolCallsPerTurn  = turn.DefaultMaxToolCallsPerTurn
)

// ClientKeys are the keys of wsproxy's own clients (CLIENT_KEYS); ParseClientKeys reads them.
type ClientKeys = auth.ClientKeys

// MinSecretLength is the least length of a client key, the admin token and the metrics token
// (cmd/proxy refuses a shorter one at start).
const MinSecretLength = auth.MinSecretLength

// ParseClientKeys reads CLIENT_KEYS: name=key pairs separated by commas or new lines.
func ParseClientKeys(spec string) (*ClientKeys, error) { return auth.ParseClientKeys(spec) }

// NewClientKeys returns client keys with no client yet, to Load from the clients' table.
func NewClientKeys() *ClientKeys { return auth.NewClientKeys() }

// ParseTrustedProxies reads TRUSTED_PROXIES: addresses or CIDRs separated by commas.
func ParseTrustedProxies(spec string) (auth.Peers, error) { return auth.ParseTrustedProxies(spec) }

var errMetricsToken = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_metrics_token",
	Message: "/metrics needs Authorization: Bearer <METRICS_TOKEN>"}

// metricsAuth requires `Authorization: Bearer <MetricsToken>` when one is set; a wrong token
// counts as a failed authentication of the client's address.
func (s *Server) metricsAuth(next http.Handler) http.Handler {
	if s.opts.MetricsToken == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := auth.BearerToken(r)
		var err error = errMetricsToken
		if ok {
			err = s.guard.Attempt(r, func() bool { return s.guard.IsMetrics(got) }, errMetricsToken)
		}
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="wsproxy metrics"`)
			apierr.Write(w, r, s.log, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ambiguousFraming(r) { // on a connection of Listener (proxy/framing.go)
		apierr.Write(w, r, s.log, errAmbiguousFraming)
		return
	}
	s.handler.ServeHTTP(w, r)
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.opts.Store.Ping(ctx); err != nil {
		apierr.WriteJSON(w, http.StatusServiceUnavailable, []byte(`{"status":"postgres unavailable"}`))
		return
	}
	apierr.WriteJSON(w, http.StatusOK, []byte(`{"status":"ready"}`))
}

// Shutdown stops the server: it ends the event streams and MCP's subscriptions at once (an HTTP
// server's Shutdown waits for them otherwise), refuses new thread turns (503 shutting_down),
// waits for the running ones and writes the usage of every turn. Call it as the HTTP server
// starts to shut down, beside http.Server.Shutdown, and close the store's pool after it. The HTTP
// server closes the connections of requests that outlive its deadline, so their turns end soon
// after (their workspace calls within the store's timeout): Shutdown waits for them past ctx, to
// keep their usage, and then reports ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.admin.Close()
	if s.mcp != nil {
		s.mcp.Close()
	}
	s.hub.Close()
	s.turnsMu.Lock()
	s.draining = true
	s.turnsMu.Unlock()
	done := make(chan struct{})
	go func() { s.turns.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		s.log.Warn("thread turns still running at the shutdown deadline; waiting for them to end")
		<-done
	}
	s.usage.close()
	if s.stopLimits != nil {
		s.stopLimits() // writes the last counts of the turns that ended
	}
	return err
}

// isOpenAI reports whether the upstream is OpenAI's API (DefaultUpstreamURL).
func isOpenAI(u *url.URL) bool { return strings.TrimSuffix(u.String(), "/") == DefaultUpstreamURL }
