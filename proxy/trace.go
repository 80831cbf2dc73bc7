package proxy

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

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

// serverSpan traces a request: its context continues the client's trace (traceparent), and the
// span is named after the route once the mux has matched it.
func (tr tracing) serverSpan(next http.Handler) http.Handler {
	if !tr.on {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := tr.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tr.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		next.ServeHTTP(sw, r)
		route := r.Pattern // set by the mux on this request
		if route == "" {
			route = "unmatched"
		}
		span.SetName(route)
		span.SetAttributes(semconv.HTTPRoute(route), semconv.HTTPResponseStatusCode(sw.status()))
		if sw.status() >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status()))
		}
	})
}

// inject puts the trace context of ctx into an outbound request's header (traceparent).
func (tr tracing) inject(ctx context.Context, h http.Header) {
	if tr.on {
		tr.prop.Inject(ctx, propagation.HeaderCarrier(h))
	}
}
