package proxy

import (
	"context"
	"net/http"
	"net/url"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/wsproxy/wsproxy/tools"
)

// Traces follow the OpenTelemetry semantic conventions v1.40.0 (SemconvVersion), GenAI ones
// included (still marked Development there): a server span per request, a client span per
// upstream round (`chat {model}`), an `execute_tool {name}` span per workspace tool call, and the
// Postgres statements below it (db.Tracer).

// SemconvVersion is the version of the semantic conventions the traces follow.
const SemconvVersion = "1.40.0"

// instrumentationName names wsproxy's tracer.
const instrumentationName = "github.com/wsproxy/wsproxy/proxy"

// tracing is what the proxy needs to trace: a tracer and the W3C trace-context propagator. Off
// (the zero value) it starts no span and allocates nothing.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// content: record tool arguments and results (an explicit opt-in).
	content bool
	on      bool
	// provider is gen_ai.provider.name: openai for OpenAI's API, else the upstream's host.
	provider string
}

func newTracing(tp trace.TracerProvider, content bool, upstream *url.URL) tracing {
	provider := upstream.Hostname()
	if isOpenAI(upstream) {
		provider = "openai"
	}
	if tp == nil {
		return tracing{provider: provider}
	}
	return tracing{tracer: tp.Tracer(instrumentationName), prop: propagation.TraceContext{}, content: content, on: true, provider: provider}
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

// roundInfo is what a round's reply says of itself, for its span.
type roundInfo struct {
	model, id     string
	finishReasons []string
}

// roundSpan starts the client span of one upstream round of a turn.
func (tr tracing) roundSpan(ctx context.Context, t *Turn, n int) (context.Context, trace.Span) {
	if !tr.on {
		return ctx, noop.Span{}
	}
	name := "chat"
	if t.Model != "" {
		name += " " + t.Model
	}
	return tr.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		semconv.GenAIOperationNameChat,
		semconv.GenAIProviderNameKey.String(tr.provider),
		semconv.GenAIRequestModel(t.Model),
		semconv.GenAIConversationID(t.Workspace.ThreadID().Name),
		attribute.Int("wsproxy.round", n),
	))
}

// endRound records a round's outcome on its span.
func endRound(span trace.Span, info roundInfo, usage tools.Usage, retries int, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(
		semconv.GenAIResponseModel(info.model),
		semconv.GenAIResponseID(info.id),
		semconv.GenAIResponseFinishReasons(info.finishReasons...),
		semconv.GenAIUsageInputTokens(int(usage.PromptTokens)),
		semconv.GenAIUsageOutputTokens(int(usage.CompletionTokens)),
		semconv.GenAIUsageCacheReadInputTokens(int(usage.CachedPromptTokens)),
		attribute.Int("wsproxy.retries", retries),
	)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// toolSpan starts the span of one workspace tool call.
func (tr tracing) toolSpan(ctx context.Context, call toolCall) (context.Context, trace.Span) {
	if !tr.on {
		return ctx, noop.Span{}
	}
	ctx, span := tr.tracer.Start(ctx, "execute_tool "+call.Name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		semconv.GenAIOperationNameExecuteTool,
		semconv.GenAIToolName(call.Name),
		semconv.GenAIToolCallID(call.ID),
		semconv.GenAIToolType("function"),
	))
	if tr.content && span.IsRecording() {
		span.SetAttributes(attribute.String("gen_ai.tool.call.arguments", call.Arguments))
	}
	return ctx, span
}

// endTool records a tool call's outcome on its span.
func (tr tracing) endTool(span trace.Span, res tools.Result, err error) {
	if tr.on && span.IsRecording() {
		outcome := "ok"
		if !res.OK {
			outcome = "error"
		}
		span.SetAttributes(attribute.String("wsproxy.tool.outcome", outcome), attribute.Int("wsproxy.tool.locked_skips", res.LockedSkips))
		if tr.content {
			span.SetAttributes(attribute.String("gen_ai.tool.call.result", res.Content))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// inject puts the trace context of ctx into an outbound request's header (traceparent).
func (tr tracing) inject(ctx context.Context, h http.Header) {
	if tr.on {
		tr.prop.Inject(ctx, propagation.HeaderCarrier(h))
	}
}
