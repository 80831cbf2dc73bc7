package proxy

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
)

// SemconvVersion is the version of the OpenTelemetry semantic conventions the traces follow.
const SemconvVersion = turn.SemconvVersion

// tracing is the edge's part of the traces: a server span per request (its context continues
// the client's traceparent), and the trace context that goes upstream. The turn engine adds a
// span per round and per tool call (Tracing), and db.Tracer the Postgres statements. Off
// (the zero value) it starts no span and allocates nothing.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	on     bool
}

func newTracing(tp trace.TracerProvider) tracing {
	if tp == nil {
		return tracing{}
	}
	return tracing{tracer: tp.Tracer("github.com/wsproxy/wsproxy/proxy"), prop: propagation.TraceContext{}, on: true}
}

// serverSpan starts the span of a request: its context continues the client's trace
// (traceparent); end names the span after the route the mux matched and records the status.
func (tr tracing) serverSpan(r *http.Request) (context.Context, func(route string, status int)) {
	if !tr.on {
		return r.Context(), func(string, int) {}
	}
	ctx := tr.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := tr.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method)))
	return ctx, func(route string, status int) {
		span.SetName(route)
		span.SetAttributes(semconv.HTTPRoute(route), semconv.HTTPResponseStatusCode(status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		span.End()
	}
}

// observed serves next within the request's server span, counts it in the metrics and writes
// its line of the request log, all by its route pattern (set by the mux) and the status
// written: one writer that remembers the status, one place that observes each request.
func (s *Server) observed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ctx, end := s.tracing.serverSpan(r)
		info := &requestInfo{id: requestID(r)}
		ctx = apierr.WithRequestID(withRequestInfo(ctx, info), info.id)
		if s.tracing.on {
			trace.SpanFromContext(ctx).SetAttributes(attribute.String("wsproxy.request_id", info.id))
		}
		w.Header().Set(requestIDHeader, info.id)
		s.opts.Metrics.requestStarted()
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		defer func() { // also when the handler panics (net/http recovers it)
			route := r.Pattern
			if route == "" {
				route = "unmatched"
			}
			d := time.Since(start)
			end(route, sw.status())
			s.opts.Metrics.requestDone(ctx, route, sw.status(), d)
			s.logRequest(ctx, r, route, sw.status(), d, info)
		}()
		next.ServeHTTP(sw, r)
	})
}

// inject puts the trace context of ctx into an outbound request's header (traceparent).
func (tr tracing) inject(ctx context.Context, h http.Header) {
	if tr.on {
		tr.prop.Inject(ctx, propagation.HeaderCarrier(h))
	}
}
