package proxy

import (
	"cmp"
	"context"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/proxy/internal/admin"
	"github.com/wsproxy/wsproxy/proxy/internal/limits"
	"github.com/wsproxy/wsproxy/proxy/internal/mcp"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

var liveHeap = regexp.MustCompile(`^/gc/heap/live:bytes$`)

// DefaultMaxModels is MetricsOptions.MaxModels' zero value: the distinct models the token
// counters name before the rest count as "other".
const DefaultMaxModels = 20

// maxModelLabel is the longest model name that becomes a label value; longer ones are "other".
const maxModelLabel = 128

// MetricsOptions configure NewMetrics. Zero values take the defaults their comments state.
type MetricsOptions struct {
	// Clients are the client names of CLIENT_KEYS (ClientKeys.Names): with them the token
	// counters have a client label. Nil means no client label.
	Clients []string
	// Version is wsproxy's version, for wsproxy_build_info.
	Version string
	// MaxModels bounds the model label: the first MaxModels distinct models requested keep their
	// name, later ones count as "other". Zero means DefaultMaxModels.
	MaxModels int
}

// Metrics are wsproxy's Prometheus metrics (docs/spec.md §9), registered on the registry given to
// NewMetrics. A nil *Metrics records nothing.
type Metrics struct {
	registry         *prometheus.Registry
	httpRequests     *prometheus.CounterVec
	httpDuration     *prometheus.HistogramVec
	upstreamRequests *prometheus.CounterVec
	upstreamDuration prometheus.Histogram
	upstreamRetries  prometheus.Counter
	toolCalls        *prometheus.CounterVec
	untrustedWrites  *prometheus.CounterVec
	lockedSkips      *prometheus.CounterVec
	toolRounds       prometheus.Histogram
	roundsExhausted  prometheus.Counter
	turns            *prometheus.CounterVec // kind
	bypassed         prometheus.Counter
	tokens           *prometheus.CounterVec // kind, model[, client]
	cachedTokens     *prometheus.CounterVec // model[, client]
	inflight         prometheus.Gauge
	eventStreams     prometheus.Gauge
	streamsFailed    prometheus.Counter
	poolWait         prometheus.Histogram
	limited          *prometheus.CounterVec // limit[, client]
	byClient         bool                   // the token counters have a client label
	// usageLag is the usage writer's lag (wsproxy_usage_lag_seconds); unset until a server
	// watches its writer.
	usageLag atomic.Pointer[func() time.Duration]
	models   modelLabels
}

// NewMetrics registers the metrics, and the Go and process collectors, on reg.
func NewMetrics(reg *prometheus.Registry, opts MetricsOptions) *Metrics {
	tokenLabels, cachedLabels, limitedLabels := []string{"kind", "model"}, []string{"model"}, []string{"limit"}
	if opts.Clients != nil {
		tokenLabels, cachedLabels, limitedLabels = append(tokenLabels, "client"), append(cachedLabels, "client"), append(limitedLabels, "client")
	}
	m := &Metrics{
		registry: reg,
		byClient: opts.Clients != nil,
		models:   modelLabels{max: cmp.Or(opts.MaxModels, DefaultMaxModels), seen: map[string]bool{}},
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_client_limited_total", Help: "Requests refused (429) by a client's limit, by limit (requests_per_minute, tokens_per_day, max_threads).",
		}, limitedLabels),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_http_requests_total", Help: "HTTP requests served, by route pattern and status code.",
		}, []string{"route", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wsproxy_http_request_duration_seconds", Help: "Time to serve an HTTP request, by route pattern.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"route"}),
		upstreamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_upstream_requests_total", Help: "Requests sent to the upstream, by status code (\"error\" when none came back).",
		}, []string{"code"}),
		upstreamDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wsproxy_upstream_request_duration_seconds", Help: "Time from sending an upstream request to the end of its response body.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}),
		upstreamRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wsproxy_upstream_retries_total", Help: "Upstream rounds retried after the turn's tools ran.",
		}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_tool_calls_total", Help: "Workspace tool calls run, by tool, outcome (ok, error) and the path they came by (via: proxy, a proxied turn's; mcp).",
		}, []string{"tool", "outcome", "via"}),
		untrustedWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_untrusted_writes_total",
			Help: "Workspace writes of turns that read content the user did not write (docs/spec.md §19), by outcome (grounded, proposed, unconfirmed, refused, over_limit) and via.",
		}, []string{"outcome", "via"}),
		lockedSkips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_locked_skips_total", Help: "Locked preferences a tool call named and left untouched, by tool.",
		}, []string{"tool"}),
		toolRounds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wsproxy_tool_rounds", Help: "Rounds per thread turn that ran workspace tool calls: its tool rounds, and a last round that ran them beside the client's calls (0 when the model answered at once).",
			Buckets: []float64{0, 1, 2, 3, 4, 5, 6, 8, 10, 16},
		}),
		roundsExhausted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wsproxy_tool_rounds_exhausted_total", Help: "Thread turns whose tool rounds reached MAX_TOOL_ROUNDS: their last upstream call went without the workspace tools.",
		}),
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_turns_total", Help: "Requests of threads, by kind: turn (a thread turn: the workspace, the tools, the loop), side (an agent's side request) and compaction (an agent's summary of its history), the last two forwarded as they came.",
		}, []string{"kind"}),
		bypassed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wsproxy_workspace_bypassed_total", Help: "Thread turns forwarded without their workspace, which could not be read in time (WORKSPACE_UNAVAILABLE=bypass).",
		}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_tokens_total", Help: "Tokens the upstream reported for thread turns, by kind (prompt, completion) and the model requested.",
		}, tokenLabels),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_cached_prompt_tokens_total", Help: "The part of the prompt tokens of thread turns the upstream served from its prompt cache, by the model requested.",
		}, cachedLabels),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wsproxy_inflight_requests", Help: "HTTP requests being served.",
		}),
		eventStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wsproxy_event_streams", Help: "Event streams open (the admin REST's and the panel's live history).",
		}),
		streamsFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wsproxy_event_streams_failed_total", Help: "Event streams the server ended on an error (Postgres failed), not by their client's leaving, a session's end or a shutdown.",
		}),
		poolWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wsproxy_db_pool_acquire_duration_seconds", Help: "Time to get a Postgres connection from the pool (waiting while all are in use).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "wsproxy_build_info", Help: "Always 1: the version of wsproxy and of Go it was built with.",
		ConstLabels: prometheus.Labels{"version": cmp.Or(opts.Version, "unknown"), "goversion": runtime.Version()},
	})
	buildInfo.Set(1)
	usageLag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wsproxy_usage_lag_seconds", Help: "How long the oldest turn's usage not yet written to Postgres has waited (0 when all is written).",
	}, func() float64 {
		if lag := m.usageLag.Load(); lag != nil {
			return (*lag)().Seconds()
		}
		return 0
	})
	reg.MustRegister(m.httpRequests, m.httpDuration, m.upstreamRequests, m.upstreamDuration, m.upstreamRetries, m.toolCalls,
		m.untrustedWrites, m.lockedSkips, m.toolRounds, m.roundsExhausted, m.turns, m.bypassed, m.tokens, m.cachedTokens, m.inflight, m.eventStreams, m.streamsFailed, m.poolWait, m.limited, buildInfo, usageLag,
		// The Go collector's default metrics, and the live heap at the last GC (what a leak check
		// compares: the heap in use also counts garbage not yet collected).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{Matcher: liveHeap})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The series whose labels are known in advance start at zero.
	for _, name := range tools.Names {
		for _, outcome := range []string{"ok", "error"} {
			for _, via := range []string{workspace.ViaProxy, workspace.ViaMCP} {
				m.toolCalls.WithLabelValues(name, outcome, via)
			}
		}
	}
	for _, outcome := range []string{tools.OutcomeGrounded, tools.OutcomeProposed, tools.OutcomeUnconfirmed, tools.OutcomeRefused, tools.OutcomeOverLimit} {
		for _, via := range []string{workspace.ViaProxy, workspace.ViaMCP} {
			m.untrustedWrites.WithLabelValues(outcome, via)
		}
	}
	for _, kind := range []string{turn.KindTurn, turn.KindSide, turn.KindCompaction} {
		m.turns.WithLabelValues(kind)
	}
	if !m.byClient {
		for _, limit := range []string{limits.RequestsPerMinute, limits.TokensPerDay, limits.MaxThreads} {
			m.limited.WithLabelValues(limit)
		}
	}
	for _, name := range []string{tools.UpdatePreferences, tools.RemovePreferences} { // the tools that can meet a lock
		m.lockedSkips.WithLabelValues(name)
	}
	return m
}

// watchUsage has wsproxy_usage_lag_seconds report lag (the usage writer's).
func (m *Metrics) watchUsage(lag func() time.Duration) {
	if m != nil {
		m.usageLag.Store(&lag)
	}
}

// modelLabels bounds the model label's values: the first max distinct models keep their name.
type modelLabels struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

// of is model's label value: its name, or "other" once max others were seen (or when it is
// longer than maxModelLabel).
func (l *modelLabels) of(model string) string {
	if len(model) > maxModelLabel {
		return "other"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.seen[model] {
		if len(l.seen) >= l.max {
			return "other"
		}
		l.seen[model] = true
	}
	return model
}

// poolCollector reports the state of a Postgres pool at each scrape.
type poolCollector struct{ pool *pgxpool.Pool }

var (
	poolAcquired = prometheus.NewDesc("wsproxy_db_pool_acquired_connections", "Postgres connections in use.", nil, nil)
	poolIdle     = prometheus.NewDesc("wsproxy_db_pool_idle_connections", "Postgres connections idle in the pool.", nil, nil)
	poolTotal    = prometheus.NewDesc("wsproxy_db_pool_connections", "Postgres connections open (in use, idle and being opened).", nil, nil)
	poolMax      = prometheus.NewDesc("wsproxy_db_pool_max_connections", "The pool's size (pool_max_conns).", nil, nil)
	poolWaits    = prometheus.NewDesc("wsproxy_db_pool_acquire_waits_total", "Acquires that waited for a connection because none was idle.", nil, nil)
	postgresUp   = prometheus.NewDesc("wsproxy_postgres_up", "1 when Postgres answered a ping through the pool within 2 s at this scrape (what /readyz asks), else 0.", nil, nil)
)

// postgresPing bounds the ping of wsproxy_postgres_up, as /readyz bounds its own.
const postgresPing = 2 * time.Second

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolAcquired, poolIdle, poolTotal, poolMax, poolWaits, postgresUp} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(poolAcquired, prometheus.GaugeValue, float64(s.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(poolIdle, prometheus.GaugeValue, float64(s.IdleConns()))
	ch <- prometheus.MustNewConstMetric(poolTotal, prometheus.GaugeValue, float64(s.TotalConns()))
	ch <- prometheus.MustNewConstMetric(poolMax, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(poolWaits, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ctx, cancel := context.WithTimeout(context.Background(), postgresPing)
	defer cancel()
	up := 1.0
	if c.pool.Ping(ctx) != nil {
		up = 0
	}
	ch <- prometheus.MustNewConstMetric(postgresUp, prometheus.GaugeValue, up)
}

// PoolTracer times every wait for a pooled Postgres connection: set it as the pool's
// ConnConfig.Tracer (with pgx's multitracer beside another) before the pool is made.
func (m *Metrics) PoolTracer() pgx.QueryTracer { return poolTracer{m} }

// WatchPool reports pool's state at each scrape (the wsproxy_db_pool_* gauges, the acquires that
// waited, and wsproxy_postgres_up: whether Postgres answers a ping); the time of each acquire
// comes from PoolTracer.
func (m *Metrics) WatchPool(pool *pgxpool.Pool) {
	if m != nil {
		m.registry.MustRegister(poolCollector{pool})
	}
}

// poolTracer is the pgxpool.AcquireTracer of PoolTracer; its statement hooks do nothing.
type poolTracer struct{ m *Metrics }

type acquireStartKey struct{}

func (t poolTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return context.WithValue(ctx, acquireStartKey{}, time.Now())
}

func (t poolTracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	if start, ok := ctx.Value(acquireStartKey{}).(time.Time); ok && t.m != nil {
		t.m.poolWait.Observe(time.Since(start).Seconds())
	}
}

func (poolTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (poolTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Handler serves the registry: in the Prometheus text format, or in OpenMetrics, with the
// latency histograms' exemplars (trace ids), when the scraper asks for it.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// observe records d on h, with the trace id of ctx's span as an exemplar when it is sampled.
func observe(ctx context.Context, h prometheus.Observer, d time.Duration) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		if eo, ok := h.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(d.Seconds(), prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	h.Observe(d.Seconds())
}

// requestStarted and requestDone count a request by its route pattern (never its path: a thread
// id must not become a label value).
func (m *Metrics) requestStarted() {
	if m != nil {
		m.inflight.Inc()
	}
}

// requestDone counts a request that ended with status on route, taking d.
func (m *Metrics) requestDone(ctx context.Context, route string, status int, d time.Duration) {
	if m == nil {
		return
	}
	m.inflight.Dec()
	m.httpRequests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	observe(ctx, m.httpDuration.WithLabelValues(route), d)
}

func (m *Metrics) observeUpstream(ctx context.Context, code string, d time.Duration) {
	if m == nil {
		return
	}
	m.upstreamRequests.WithLabelValues(code).Inc()
	observe(ctx, m.upstreamDuration, d)
}

// UpstreamRetry counts a round sent again after the turn's tools ran (turn.Metrics).
func (m *Metrics) UpstreamRetry() {
	if m != nil {
		m.upstreamRetries.Inc()
	}
}

// ToolCall counts a workspace call of a proxied turn (turn.Metrics).
func (m *Metrics) ToolCall(name string, ok bool, lockedSkips int, untrusted string) {
	m.toolCall(workspace.ViaProxy, name, ok, lockedSkips, untrusted)
}

// MCPToolCall counts a workspace call over MCP (mcp.Metrics).
func (m *Metrics) MCPToolCall(name string, ok bool, lockedSkips int, untrusted string) {
	m.toolCall(workspace.ViaMCP, name, ok, lockedSkips, untrusted)
}

// EventStreams adds delta to the event streams open (admin.Metrics).
func (m *Metrics) EventStreams(delta int) {
	if m != nil {
		m.eventStreams.Add(float64(delta))
	}
}

// EventStreamFailed counts an event stream ended on an error (admin.Metrics).
func (m *Metrics) EventStreamFailed() {
	if m != nil {
		m.streamsFailed.Inc()
	}
}

// admin is m as the user path's metrics: nil (an interface holding none) when m is.
func (m *Metrics) admin() admin.Metrics {
	if m == nil {
		return nil
	}
	return m
}

// mcp is m as MCP's metrics: nil (an interface holding none) when m is.
func (m *Metrics) mcp() mcp.Metrics {
	if m == nil {
		return nil
	}
	return m
}

func (m *Metrics) toolCall(via, name string, ok bool, lockedSkips int, untrusted string) {
	if m == nil {
		return
	}
	if !tools.IsTool(name) {
		name = "unknown" // a made-up name must not become a label value
	}
	outcome := "ok"
	if !ok {
		outcome = "error"
	}
	m.toolCalls.WithLabelValues(name, outcome, via).Inc()
	if lockedSkips > 0 {
		m.lockedSkips.WithLabelValues(name).Add(float64(lockedSkips))
	}
	if untrusted != "" {
		m.untrustedWrites.WithLabelValues(untrusted, via).Inc()
	}
}

// workspaceBypassed counts a turn forwarded without its workspace.
func (m *Metrics) workspaceBypassed() {
	if m != nil {
		m.bypassed.Inc()
	}
}

// turn counts a request of a thread of kind (turn.KindTurn, …).
func (m *Metrics) turn(kind string) {
	if m != nil {
		m.turns.WithLabelValues(kind).Inc()
	}
}

// ToolRounds records a turn's rounds that ran workspace calls (turn.Metrics).
func (m *Metrics) ToolRounds(n int) {
	if m != nil {
		m.toolRounds.Observe(float64(n))
	}
}

// ToolRoundsExhausted counts a turn whose tool rounds reached MAX_TOOL_ROUNDS (turn.Metrics).
func (m *Metrics) ToolRoundsExhausted() {
	if m != nil {
		m.roundsExhausted.Inc()
	}
}

// Tokens counts the tokens of one upstream round of a turn that requested model, for client
// ("" without client keys) (turn.Metrics).
func (m *Metrics) Tokens(model, client string, u workspace.Usage) {
	if m == nil {
		return
	}
	model = m.models.of(model)
	prompt, completion, cached := []string{"prompt", model}, []string{"completion", model}, []string{model}
	if m.byClient {
		prompt, completion, cached = append(prompt, client), append(completion, client), append(cached, client)
	}
	m.tokens.WithLabelValues(prompt...).Add(float64(u.PromptTokens))
	m.tokens.WithLabelValues(completion...).Add(float64(u.CompletionTokens))
	m.cachedTokens.WithLabelValues(cached...).Add(float64(u.CachedPromptTokens))
}

// statusWriter remembers the status code written; it passes Flush and the rest through Unwrap
// (http.ResponseController finds them there).
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// clientLimited counts a request refused by client's limit (wsproxy_client_limited_total).
func (m *Metrics) clientLimited(limit, client string) {
	if m == nil {
		return
	}
	if m.byClient {
		m.limited.WithLabelValues(limit, client).Inc()
		return
	}
	m.limited.WithLabelValues(limit).Inc()
}
