// Package proxy is all of wsproxy's HTTP: the routes, the chat handler and its request rewrite,
// the tool loop (Runner), SSE, the pass-through to the upstream, the admin REST and metrics.
package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/auth"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
	"github.com/wsproxy/wsproxy/tools"
)

// Defaults of Options' zero values.
const (
	DefaultMaxRequestBytes = 8 << 20
	DefaultUpstreamTimeout = 10 * time.Minute
	DefaultStreamKeepalive = 15 * time.Second
	// DefaultUpstreamURL is OpenAI's API, the upstream when none is configured.
	DefaultUpstreamURL = "https://api.openai.com/v1"
)

// Prompt cache key modes (PROMPT_CACHE_KEY, SPEC §3.1).
const (
	// PromptCacheKeyAuto sets the key on thread turns when the upstream is DefaultUpstreamURL.
	PromptCacheKeyAuto = "auto"
	// PromptCacheKeyThread sets the key on every thread turn whose client sent none.
	PromptCacheKeyThread = "thread"
	// PromptCacheKeyOff never sets it.
	PromptCacheKeyOff = "off"
)

// Headers of the proxy's own: a thread on /v1 routes, and a request's placement (SPEC §3.1).
// Neither is forwarded.
const (
	threadHeader    = "X-Thread-Id"
	placementHeader = "X-Workspace-Placement"
)

// Options configure a Server. Zero values take the defaults their comments state.
type Options struct {
	// Store holds the workspaces. Required.
	Store *tools.Store
	// UpstreamURL is the base URL of the OpenAI-compatible upstream, e.g. https://api.openai.com/v1.
	UpstreamURL *url.URL
	// UpstreamAPIKey, when set, replaces the client's Authorization toward the upstream;
	// otherwise the client's is forwarded.
	UpstreamAPIKey string
	// UpstreamTimeout is the longest wait for an upstream's response headers and the longest
	// silence inside its body. Zero means DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	// Transport carries the upstream requests. Nil means a clone of http.DefaultTransport.
	Transport http.RoundTripper
	// ClientKeys, when set, are required on every /v1 request and namespace threads per client;
	// UpstreamAPIKey must then be set (clients' keys are wsproxy's, not the upstream's).
	ClientKeys *auth.ClientKeys
	// PassThroughRoutes are the routes forwarded as they are when ClientKeys is set (others:
	// 403). Nil means DefaultPassThroughRoutes.
	PassThroughRoutes *Routes
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
	// Placement is where the workspace goes in a request (SPEC §3.1); a request's
	// X-Workspace-Placement header wins. Empty means PlaceTail.
	Placement Placement
	// PromptCacheKey is PromptCacheKeyAuto, PromptCacheKeyThread or PromptCacheKeyOff: whether a
	// thread turn without a prompt_cache_key gets one derived from its thread. Empty means auto.
	PromptCacheKey string
	// Instructions stand before the block, whatever the placement. Empty means
	// tools.TailInstructions with PlaceTail and tools.SystemInstructions with PlaceSystem.
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
	// ListenURL is a direct connection to Postgres for LISTEN (DATABASE_LISTEN_URL): the event
	// streams of every replica wake on its notifications. Empty: streams read at each heartbeat.
	ListenURL string
	// NoPanel turns the workspace panel (/ui/) off (UI=off).
	NoPanel bool
	// StreamKeepalive is the longest a streamed turn's client waits without a byte once the
	// stream has started or a round it cannot see has begun: past it, a keepalive comment.
	// Zero means DefaultStreamKeepalive.
	StreamKeepalive time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Server serves wsproxy's routes.
type Server struct {
	guard    *auth.Guard // who may call
	opts     Options
	log      *slog.Logger
	runner   *Runner
	client   *http.Client // thread turns' upstream calls
	reverse  *httputil.ReverseProxy
	handler  http.Handler
	tracing  tracing
	maxBytes int64
	budget   bodyBudget
	cacheKey bool // set prompt_cache_key on thread turns
	// usage writes the turns' usage in the background; Wait writes what is left.
	usage *usageWriter
	// turns are the thread turns in flight, which Wait waits for; draining (set by Wait) refuses
	// new ones.
	turnsMu  sync.Mutex
	draining bool
	turns    sync.WaitGroup
	// The panel and the event streams: sessions and links are signed by signer; the hub wakes
	// streams on Postgres's notifications, listened to until Close; closing ends the streams.
	signer     signer
	hub        *eventHub
	closing    chan struct{}
	closeOnce  sync.Once
	heartbeat  time.Duration // of the event streams
	stopListen context.CancelFunc
	listening  sync.WaitGroup
}

// NewServer returns a server with its routes.
func NewServer(opts Options) *Server {
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
	if opts.PassThroughRoutes == nil {
		opts.PassThroughRoutes, _ = ParseRoutes(DefaultPassThroughRoutes)
	}
	if opts.Placement == "" {
		opts.Placement = PlaceTail
	}
	if opts.StreamKeepalive <= 0 {
		opts.StreamKeepalive = DefaultStreamKeepalive
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	base := opts.Transport
	if base == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		base = t
	}
	transport := &timeoutTransport{Base: base, Timeout: opts.UpstreamTimeout, Observe: opts.Metrics.observeUpstream}
	tracing := newTracing(opts.TracerProvider, opts.TraceContent, opts.UpstreamURL)
	s := &Server{
		opts:    opts,
		log:     opts.Logger,
		tracing: tracing,
		runner: &Runner{MaxToolRounds: opts.MaxToolRounds, MaxToolCallsPerRound: opts.MaxToolCallsPerRound, MaxToolCallsPerTurn: opts.MaxToolCallsPerTurn,
			Metrics: opts.Metrics, Logger: opts.Logger,
			Retries: opts.Retries, RetryBackoff: opts.RetryBackoff, tracing: tracing},
		client:   &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		maxBytes: opts.MaxRequestBytes,
		usage:    newUsageWriter(opts.Store, opts.Logger),
	}
	s.budget.max = opts.MaxBufferedBytes
	s.guard = &auth.Guard{AdminToken: opts.AdminToken, MetricsToken: opts.MetricsToken, ClientKeys: opts.ClientKeys, Peers: opts.TrustedProxies}
	s.signer, s.hub, s.closing, s.heartbeat = newSigner(opts.AdminToken), newEventHub(), make(chan struct{}), heartbeat
	listenCtx, stop := context.WithCancel(context.Background())
	s.stopListen = stop
	if opts.ListenURL != "" {
		s.listening.Go(func() {
			tools.ListenEvents(listenCtx, opts.ListenURL, s.hub.changed, s.hub.resync, s.log)
		})
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

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("POST /threads/{thread}/v1/chat/completions", s.chat)
	mux.HandleFunc("POST /v1/responses", s.responses)
	mux.HandleFunc("POST /threads/{thread}/v1/responses", s.responses)
	mux.HandleFunc("/v1/", s.passThrough)
	mux.HandleFunc("/threads/{thread}/v1/", s.passThrough)
	s.adminRoutes(mux)
	if !opts.NoPanel {
		s.panelRoutes(mux)
	}
	if opts.Metrics != nil {
		mux.Handle("GET /metrics", s.metricsAuth(opts.Metrics.Handler()))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		apierr.WriteJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("GET /readyz", s.ready)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		apierr.Write(w, r, s.log, &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: "no route for " + r.Method + " " + r.URL.Path})
	})
	s.handler = tracing.serverSpan(opts.Metrics.instrument(mux))
	return s
}

// ClientKeys are the keys of wsproxy's own clients (CLIENT_KEYS); ParseClientKeys reads them.
type ClientKeys = auth.ClientKeys

// ParseClientKeys reads CLIENT_KEYS: name=key pairs separated by commas or new lines.
func ParseClientKeys(spec string) (*ClientKeys, error) { return auth.ParseClientKeys(spec) }

// ParseTrustedProxies reads TRUSTED_PROXIES: addresses or CIDRs separated by commas.
func ParseTrustedProxies(spec string) (auth.Peers, error) { return auth.ParseTrustedProxies(spec) }

var errClientKey = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
	Message: "a valid wsproxy client key is required: Authorization: Bearer <key>"}

// clientOf authenticates a /v1 request (Authorization: Bearer <key>) and returns its client (""
// when client keys are off). A wrong key counts as a failed authentication of the client's
// address (throttled).
func (s *Server) clientOf(r *http.Request) (string, error) {
	if s.opts.ClientKeys == nil {
		return "", nil
	}
	key, ok := auth.BearerToken(r)
	if !ok {
		return "", errClientKey
	}
	var name string
	err := s.guard.Attempt(r, func() bool {
		name, ok = s.guard.Client(key)
		return ok
	}, errClientKey)
	return name, err
}

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

// placementOf is the request's placement: its X-Workspace-Placement header, else the
// configured one.
func (s *Server) placementOf(r *http.Request) (Placement, error) {
	h := r.Header.Get(placementHeader)
	if h == "" {
		return s.opts.Placement, nil
	}
	p, err := ParsePlacement(h)
	if err != nil {
		return "", apierr.BadRequest("invalid_placement", placementHeader, "%s: %s", placementHeader, err.Error())
	}
	return p, nil
}

// instructions is the text that stands before the block.
func (s *Server) instructions(p Placement) string {
	switch {
	case s.opts.Instructions != "":
		return s.opts.Instructions
	case p == PlaceSystem:
		return tools.SystemInstructions
	}
	return tools.TailInstructions
}

// threadOf returns the thread a request names: the X-Thread-Id header or the path, for the
// request's client ("" without client keys). ok is false when it names none (the id then holds
// the client alone). Empty headers count as absent; two that differ, or a header and a path that
// differ, are a thread_mismatch.
func threadOf(r *http.Request, client string) (id tools.ThreadID, ok bool, err error) {
	name := r.PathValue("thread")
	for _, h := range r.Header.Values(threadHeader) {
		switch {
		case h == "":
		case name == "":
			name = h
		case h != name:
			return tools.ThreadID{}, false, apierr.BadRequest("thread_mismatch", threadHeader,
				"the %s headers and the path name different threads", threadHeader)
		}
	}
	if name == "" {
		return tools.ThreadID{Client: client}, false, nil
	}
	if id, err = tools.NewThreadID(client, name); err != nil {
		return tools.ThreadID{}, false, apierr.BadRequest("invalid_thread_id", threadHeader, "%s", err.Error())
	}
	return id, true, nil
}

// copyBuffers recycles the 32 KB buffers ReverseProxy copies response bodies with.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

// inbound reads what every /v1 request brings: the thread it names (ok false for none), for
// its client when there are client keys, and its body; the caller calls release when done with
// the body. check, when set, runs once the client is known, before anything else is read.
func (s *Server) inbound(w http.ResponseWriter, r *http.Request, check func(*http.Request) error) (thread tools.ThreadID, ok bool, body []byte, release func(), err error) {
	release = func() {}
	client, err := s.clientOf(r)
	if err != nil {
		return thread, false, nil, release, err
	}
	if check != nil {
		if err := check(r); err != nil {
			return thread, false, nil, release, err
		}
	}
	if thread, ok, err = threadOf(r, client); err != nil {
		return thread, false, nil, release, err
	}
	body, release, err = s.readBody(w, r)
	return thread, ok, body, release, err
}

// passThrough forwards any other /v1 request to the upstream unchanged.
func (s *Server) passThrough(w http.ResponseWriter, r *http.Request) {
	_, _, body, release, err := s.inbound(w, r, s.passThroughAllowed)
	defer release()
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	s.forward(w, r, body)
}

// forward sends the request with body to the upstream and its response back, both unchanged.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body = http.NoBody
	}
	s.reverse.ServeHTTP(w, r)
}

func (s *Server) rewritePassThrough(pr *httputil.ProxyRequest) {
	// The path goes on as the client escaped it (%2F stays %2F); passThroughAllowed refused
	// any path with dot segments.
	pr.Out.URL = upstreamURL(s.opts.UpstreamURL, restOfPath(pr.In.URL.EscapedPath()), pr.In.URL.RawQuery)
	pr.Out.Host = ""
	s.stripHeaders(pr.Out.Header)
	if s.opts.UpstreamAPIKey != "" {
		// An error body is read for the key (fromUpstream): gzip is the one encoding it reads.
		if strings.Contains(strings.ToLower(pr.In.Header.Get("Accept-Encoding")), "gzip") {
			pr.Out.Header.Set("Accept-Encoding", "gzip")
		} else {
			pr.Out.Header.Del("Accept-Encoding")
		}
	}
	s.tracing.inject(pr.In.Context(), pr.Out.Header)
}

// restOfPath is the part of a client path (escaped) after its /v1 (or /threads/{thread}/v1).
func restOfPath(path string) string {
	if rest, ok := strings.CutPrefix(path, "/threads/"); ok {
		if i := strings.Index(rest, "/v1/"); i >= 0 {
			return rest[i+len("/v1"):]
		}
	}
	return strings.TrimPrefix(path, "/v1")
}

// passThroughAllowed checks a request that is about to be forwarded as it is, once its client
// is known (inbound: a client without a key learns nothing of the routes). A path with a
// segment that decodes to "." or ".." (where "/" and "\" inside a segment also separate) is
// refused: an upstream that resolves dot segments would serve a path outside its base URL with
// the operator's key. CONNECT and TRACE are refused (a tunnel; an echo of the request, its
// credentials among them). With client keys, only the routes PASSTHROUGH_ROUTES allows are
// forwarded.
func (s *Server) passThroughAllowed(r *http.Request) error {
	if r.Method == http.MethodConnect || r.Method == http.MethodTrace {
		return &apierr.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
			Message: r.Method + " is not forwarded"}
	}
	escaped := r.URL.EscapedPath()
	for _, seg := range strings.Split(escaped, "/") {
		decoded, err := url.PathUnescape(seg)
		if err != nil {
			return apierr.BadRequest("invalid_path", "", "the path is not a valid escaped URL path")
		}
		for _, part := range strings.FieldsFunc(decoded, func(r rune) bool { return r == '/' || r == '\\' }) {
			if part == "." || part == ".." {
				return apierr.BadRequest("invalid_path", "", "the path has a dot segment (. or ..); it is not forwarded")
			}
		}
	}
	if s.opts.ClientKeys != nil && !s.opts.PassThroughRoutes.Allows(r.Method, "/v1"+restOfPath(escaped)) {
		return &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "route_not_allowed",
			Message: r.Method + " /v1" + restOfPath(escaped) + " is not among the routes this proxy forwards for its clients (PASSTHROUGH_ROUTES)"}
	}
	return nil
}

// turnInbound is what a chat or Responses request brings: a thread turn's thread, placement and
// body. A request without a thread is passed to forward, for its client ("" without client
// keys), and one that fails is answered; ok is then false. The caller calls release when done
// with the body.
func (s *Server) turnInbound(w http.ResponseWriter, r *http.Request, forward func(w http.ResponseWriter, r *http.Request, client string, body []byte)) (thread tools.ThreadID, placement Placement, body []byte, release func(), ok bool) {
	thread, ok, body, release, err := s.inbound(w, r, nil)
	if err == nil && !ok {
		if err = s.passThroughAllowed(r); err == nil {
			forward(w, r, thread.Client, body)
			return thread, "", nil, release, false
		}
	}
	if err == nil {
		placement, err = s.placementOf(r)
	}
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return thread, "", nil, release, false
	}
	return thread, placement, body, release, true
}

// errShuttingDown answers a turn that would start once Wait has begun.
var errShuttingDown = &apierr.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
	Message: "this wsproxy is shutting down; retry the request", Header: http.Header{"Retry-After": {"1"}}}

// startTurn begins a thread turn: the next turn number, and the workspace text to inject. The
// caller ends a turn it started with endTurn.
func (s *Server) startTurn(r *http.Request, ws *tools.Workspace, placement Placement, model, path string) (*Turn, string, error) {
	s.turnsMu.Lock()
	if s.draining {
		s.turnsMu.Unlock()
		return nil, "", errShuttingDown
	}
	s.turns.Add(1) // under turnsMu: before Wait's
	s.turnsMu.Unlock()
	start, err := ws.StartTurn(r.Context())
	if err != nil {
		s.turns.Done()
		return nil, "", err
	}
	t := &Turn{
		Workspace: ws,
		Start:     start,
		Model:     model,
		Upstream: &clientUpstream{client: s.client, url: upstreamURL(s.opts.UpstreamURL, path, "").String(),
			header: s.outboundHeader(r.Header), tracing: s.tracing, back: s.fromUpstream()},
	}
	return t, s.instructions(placement) + "\n\n" + start.Block(), nil
}

// chat serves POST /v1/chat/completions and its thread-path form.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	thread, placement, body, release, ok := s.turnInbound(w, r, func(w http.ResponseWriter, r *http.Request, _ string, body []byte) { s.forward(w, r, body) })
	defer release()
	if !ok {
		return
	}
	req, err := ParseChatRequest(body)
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	if req.Legacy {
		s.forward(w, r, body) // legacy functions: no workspace, no turn
		return
	}
	t, text, err := s.startTurn(r, s.opts.Store.Workspace(thread), placement, req.Model(), "/chat/completions")
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	req.InjectWorkspace(text, placement)
	req.askUsage()
	if s.cacheKey {
		req.setDefault("prompt_cache_key", rawjson.String(promptCacheKey(thread)))
	}
	defer s.endTurn(t)
	if req.Stream {
		out := s.sseWriter(w, thread)
		defer out.close()
		s.stream(r, t, newChatSSE(req, t.Upstream, s.log, thread.String(), out), out)
		return
	}
	d := &chatJSON{req: req, up: t.Upstream, log: s.log, thread: thread.String()}
	s.reply(w, r, t, d, func() ([]byte, http.Header) { return d.body, d.header })
}

// responses serves POST /v1/responses and its thread-path form (docs/spec.md §12).
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	thread, placement, body, release, ok := s.turnInbound(w, r, s.forwardResponses)
	defer release()
	if !ok {
		return
	}
	req, err := ParseResponsesRequest(body)
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	ws := s.opts.Store.Workspace(thread)
	if req.ClientPrevious != "" {
		cont, err := ws.Continuation(r.Context(), req.ClientPrevious)
		switch {
		case err == nil:
			req.Continue(cont)
		case !errors.Is(err, tools.ErrNotFound):
			apierr.Write(w, r, s.log, err)
			return
		}
	}
	// With client keys: another thread's turn, or a response of a pass-through, is the client's
	// own or a 404; so is every item the input references.
	if err := s.ownedContinuation(r.Context(), thread, body, req.Continued); err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	t, text, err := s.startTurn(r, ws, placement, req.Model(), "/responses")
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	ids := &answerIDs{}
	if s.opts.ClientKeys != nil {
		t.Upstream = tappedUpstream{Upstream: t.Upstream, ids: ids}
	}
	req.InjectWorkspace(text, placement)
	req.askReasoning()
	if s.cacheKey {
		req.setDefault("prompt_cache_key", rawjson.String(promptCacheKey(thread)))
	}
	record := func(first, last string, owed []string) error {
		if first == "" || last == "" {
			return nil // nothing a client could continue from
		}
		// Recorded also when the client left while the round's workspace calls ran (they run
		// to their end): a continuation from the turn must find them.
		return ws.RecordResponseTurn(context.WithoutCancel(r.Context()), t.Start.Number, first, last, owed, ids.all())
	}
	defer s.endTurn(t)
	if req.Stream {
		out := s.sseWriter(w, thread)
		defer out.close()
		s.stream(r, t, newResponsesSSE(req, t.Upstream, out, record), out)
		return
	}
	d := &responsesJSON{responsesTurn: responsesTurn{req: req, up: t.Upstream, record: record}}
	s.reply(w, r, t, d, func() ([]byte, http.Header) { return d.body, d.header })
}

// reply runs a non-streamed turn and answers with the body and header answer gives once it ended.
func (s *Server) reply(w http.ResponseWriter, r *http.Request, t *Turn, d dialect, answer func() ([]byte, http.Header)) {
	rounds, err := s.runner.run(r.Context(), t, d)
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	body, header := answer()
	h := w.Header()
	apierr.CopyHeader(h, responseHeader(header))
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set(threadHeader, t.Workspace.ThreadID().Name)
	h.Set("X-Workspace-Rounds", strconv.Itoa(rounds))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// endTurn ends a turn startTurn began: it queues the turn's usage for its thread's totals,
// written in the background (neither the answer nor the next request on the connection waits
// for it; a failure to write it costs the count, not the answer).
func (s *Server) endTurn(t *Turn) {
	s.usage.add(t.Workspace.ThreadID(), t.Usage)
	s.turns.Done()
}

// Wait waits for the thread turns still running, refusing new ones (503 shutting_down), then
// writes the usage of every turn and waits for the writer to stop. Call it after the HTTP server
// has shut down, before the store's pool closes: turns that outlived the shutdown deadline have
// had their connections closed, so they end soon (their workspace calls within the store's
// timeout), and their usage is kept.
func (s *Server) Wait() {
	s.turnsMu.Lock()
	s.draining = true
	s.turnsMu.Unlock()
	s.turns.Wait()
	s.usage.close()
}

// Close ends the event streams and stops listening to Postgres. Call it when the HTTP server
// starts to shut down (http.Server.RegisterOnShutdown), so that the streams let it finish.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.stopListen()
		s.listening.Wait()
	})
}

// isOpenAI reports whether the upstream is OpenAI's API (DefaultUpstreamURL).
func isOpenAI(u *url.URL) bool { return strings.TrimSuffix(u.String(), "/") == DefaultUpstreamURL }

// promptCacheKey is the prompt_cache_key of a thread's turns: the same on every replica, never
// the thread's id (SPEC §3.1).
func promptCacheKey(thread tools.ThreadID) string {
	sum := sha256.Sum256([]byte("wsproxy prompt_cache_key\n" + thread.String()))
	return "wsp_" + hex.EncodeToString(sum[:16])
}

// streamDialect is a dialect that streams to the client.
type streamDialect interface {
	dialect
	// failure is the event (name and data) that ends a stream whose turn failed after its
	// first byte.
	failure(err error) (event string, data []byte)
	// end is what follows the last event of a stream that succeeded (nil for nothing).
	end() []byte
}

// stream serves a streamed turn. The status and headers go out with the first event, so a
// failure before it gets a plain error response (but for the upstream's error event); after it,
// one failure event ends the stream.
func (s *Server) stream(r *http.Request, t *Turn, d streamDialect, out *sseWriter) {
	_, err := s.runner.run(r.Context(), t, d)
	if err == nil {
		if end := d.end(); end != nil {
			if err := out.write(end); err != nil {
				s.log.LogAttrs(r.Context(), slog.LevelDebug, "client left before the end of the stream", slog.Any("err", err))
			}
		}
		return
	}
	var se *apierr.StreamError
	if started := out.close(); !started && !errors.As(err, &se) {
		apierr.Write(out.w, r, s.log, err) // nothing went out yet: a plain error response
		return
	}
	// After the first byte, or for the upstream's own error event (which a client straight from
	// the upstream reads inside a stream too): one failure event ends the stream.
	var ue *apierr.UpstreamError
	if errors.As(err, &se) || errors.As(err, &ue) {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream error after the stream started", slog.String("thread", t.Workspace.ThreadID().String()))
	} else {
		e := apierr.From(err)
		if e.Status == apierr.StatusClientClosedRequest {
			return
		}
		e.Log(r.Context(), s.log, "stream failed", slog.String("thread", t.Workspace.ThreadID().String()))
	}
	name, data := d.failure(err)
	_ = out.write(sse.AppendNamedEvent(nil, name, data))
}

// sseWriter is the client side of a streamed turn: server-sent events on the response, and a
// keepalive comment when the client has had nothing for the keepalive interval (docs/spec.md
// §16) — once the stream started, or once the proxy began a round the client cannot see (before
// that, the client waits for the upstream's status as it would straight). The keepalive is a
// runtime timer, not a goroutine: it fires only when the stream is silent.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	thread  string
	every   time.Duration
	mu      sync.Mutex // the timer writes too
	started bool
	waiting bool // a round the client cannot see began: keepalives may start the stream
	closed  bool
	last    time.Time // the last write
	timer   *time.Timer
	buf     []byte
}

var keepaliveComment = []byte(": keepalive\n\n")

func (s *Server) sseWriter(w http.ResponseWriter, thread tools.ThreadID) *sseWriter {
	o := &sseWriter{w: w, rc: http.NewResponseController(w), thread: thread.Name, every: s.opts.StreamKeepalive, last: time.Now()}
	o.mu.Lock() // the timer may fire before it is assigned
	o.timer = time.AfterFunc(o.every, o.keepalive)
	o.mu.Unlock()
	return o
}

func (o *sseWriter) Emit(event string, data []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.start()
	o.buf = sse.AppendNamedEvent(o.buf[:0], event, data)
	o.last = time.Now()
	_, err := o.w.Write(o.buf)
	return err
}

// start sends the status and headers of the stream, once.
func (o *sseWriter) start() {
	if o.started {
		return
	}
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx in front: do not buffer the stream
	h.Set(threadHeader, o.thread)
	o.w.WriteHeader(http.StatusOK)
	o.started = true
}

// Flush sends what was written; before the stream started it means a round the client cannot
// see began (the runner flushes before it runs the workspace's tools).
func (o *sseWriter) Flush() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.started {
		o.waiting = true
		return nil
	}
	return o.rc.Flush()
}

// keepalive writes a comment when the stream has been silent for the interval, and sets the
// timer for the next check.
func (o *sseWriter) keepalive() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	if !o.started && !o.waiting {
		o.timer.Reset(o.every)
		return
	}
	if idle := time.Since(o.last); idle < o.every {
		o.timer.Reset(o.every - idle)
		return
	}
	o.start()
	o.last = time.Now()
	if _, err := o.w.Write(keepaliveComment); err == nil {
		_ = o.rc.Flush()
	}
	o.timer.Reset(o.every)
}

// write writes b and flushes it.
func (o *sseWriter) write(b []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.start()
	o.last = time.Now()
	if _, err := o.w.Write(b); err != nil {
		return err
	}
	return o.rc.Flush()
}

// close stops the keepalives and reports whether the stream started; the handler calls it
// before it answers otherwise, and before it returns.
func (o *sseWriter) close() (started bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	o.timer.Stop()
	return o.started
}
