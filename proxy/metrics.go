package proxy

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/tools"
)

var liveHeap = regexp.MustCompile(`^/gc/heap/live:bytes$`)

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
	lockedSkips      *prometheus.CounterVec
	toolRounds       prometheus.Histogram
	tokens           *prometheus.CounterVec
	cachedTokens     prometheus.Counter
	inflight         prometheus.Gauge
	poolWait         prometheus.Histogram
}

// NewMetrics registers the metrics, and the Go and process collectors, on reg.
func NewMetrics(reg *prometheus.Registry) *Metrics {
	m := &Metrics{
		registry: reg,
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
			Name: "wsproxy_tool_calls_total", Help: "Workspace tool calls run, by tool and outcome (ok, error).",
		}, []string{"tool", "outcome"}),
		lockedSkips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_locked_skips_total", Help: "Locked preferences a tool call named and left untouched, by tool.",
		}, []string{"tool"}),
		toolRounds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wsproxy_tool_rounds", Help: "Rounds per thread turn that ran workspace tool calls: its tool rounds, and a last round that ran them beside the client's calls (0 when the model answered at once).",
			Buckets: []float64{0, 1, 2, 3, 4, 5, 6, 8, 10, 16},
		}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wsproxy_tokens_total", Help: "Tokens the upstream reported for thread turns, by kind (prompt, completion).",
		}, []string{"kind"}),
		cachedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wsproxy_cached_prompt_tokens_total", Help: "The part of the prompt tokens of thread turns the upstream served from its prompt cache.",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wsproxy_inflight_requests", Help: "HTTP requests being served.",
		}),
		poolWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wsproxy_db_pool_acquire_duration_seconds", Help: "Time to get a Postgres connection from the pool (waiting while all are in use).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	reg.MustRegister(m.httpRequests, m.httpDuration, m.upstreamRequests, m.upstreamDuration, m.upstreamRetries, m.toolCalls,
		m.lockedSkips, m.toolRounds, m.tokens, m.cachedTokens, m.inflight, m.poolWait,
		// The Go collector's default metrics, and the live heap at the last GC (what a leak check
		// compares: the heap in use also counts garbage not yet collected).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{Matcher: liveHeap})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, name := range tools.Names {
		for _, outcome := range []string{"ok", "error"} {
			m.toolCalls.WithLabelValues(name, outcome)
		}
	}
	m.tokens.WithLabelValues("prompt")
	m.tokens.WithLabelValues("completion")
	return m
}

// PoolTracer times every wait for a pooled Postgres connection: set it as the pool's
// ConnConfig.Tracer (with pgx's multitracer beside another) before the pool is made.
func (m *Metrics) PoolTracer() pgx.QueryTracer { return poolTracer{m} }

// WatchPool serves the pool's connections as gauges: wsproxy_db_connections by state (acquired:
// in use by an operation; idle; constructing) and wsproxy_db_connections_max, the pool's size.
func (m *Metrics) WatchPool(pool *pgxpool.Pool) {
	if m == nil {
		return
	}
	conns := func(state string, f func(*pgxpool.Stat) int32) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "wsproxy_db_connections", Help: "Postgres connections of the pool, by state (acquired, idle, constructing).",
			ConstLabels: prometheus.Labels{"state": state},
		}, func() float64 { return float64(f(pool.Stat())) })
	}
	m.registry.MustRegister(
		conns("acquired", (*pgxpool.Stat).AcquiredConns),
		conns("idle", (*pgxpool.Stat).IdleConns),
		conns("constructing", (*pgxpool.Stat).ConstructingConns),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "wsproxy_db_connections_max", Help: "The most Postgres connections the pool opens (pool_max_conns).",
		}, func() float64 { return float64(pool.Config().MaxConns) }))
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

// ToolCall counts a workspace call (turn.Metrics).
func (m *Metrics) ToolCall(name string, ok bool, lockedSkips int) {
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
	m.toolCalls.WithLabelValues(name, outcome).Inc()
	if lockedSkips > 0 {
		m.lockedSkips.WithLabelValues(name).Add(float64(lockedSkips))
	}
}

// ToolRounds records a turn's rounds that ran workspace calls (turn.Metrics).
func (m *Metrics) ToolRounds(n int) {
	if m != nil {
		m.toolRounds.Observe(float64(n))
	}
}

// Tokens counts the tokens of one upstream round (turn.Metrics).
func (m *Metrics) Tokens(u tools.Usage) {
	if m == nil {
		return
	}
	m.tokens.WithLabelValues("prompt").Add(float64(u.PromptTokens))
	m.tokens.WithLabelValues("completion").Add(float64(u.CompletionTokens))
	m.cachedTokens.Add(float64(u.CachedPromptTokens))
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
