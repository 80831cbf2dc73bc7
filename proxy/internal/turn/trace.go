package turn

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/wsproxy/wsproxy/proxy/internal/genai"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// SemconvVersion is the version of the semantic conventions the traces follow.
const SemconvVersion = "1.40.0"

// Traces follow the OpenTelemetry semantic conventions v1.40.0 (SemconvVersion), GenAI ones
// included: a client span per upstream round (`chat {model}`) and an `execute_tool {name}` span
// per workspace call, below the HTTP edge's server span.

// Tracing traces a turn's rounds and tool calls. Off (the zero value) it starts no span and
// allocates nothing.
type Tracing struct {
	tools genai.Tools
}

// NewTracing traces with tp (nil: nothing), recording tool arguments and results when content
// is set. A round's span names its turn's provider (Turn.Provider).
func NewTracing(tp trace.TracerProvider, content bool) Tracing {
	return Tracing{tools: genai.NewTools(tp, content)}
}

// roundInfo is what a round's reply says of itself, for its span.
type roundInfo struct {
	model, id     string
	finishReasons []string
	// untrusted are the parts of the reply the model wrote on what it did not write: a server
	// tool's results, items or blocks of types wsproxy does not know (docs/spec.md §19). They
	// taint the turn from the round on.
	untrusted []workspace.Part
}

// roundSpan starts the client span of one upstream round of a turn.
func (tr Tracing) roundSpan(ctx context.Context, t *Turn, n int) (context.Context, trace.Span) {
	tracer := tr.tools.Tracer()
	if tracer == nil {
		return ctx, noop.Span{}
	}
	name := "chat"
	if t.Model != "" {
		name += " " + t.Model
	}
	return tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		semconv.GenAIOperationNameChat,
		semconv.GenAIProviderNameKey.String(t.Provider),
		semconv.GenAIRequestModel(t.Model),
		semconv.GenAIConversationID(t.Workspace.ThreadID().Name),
		attribute.Int("wsproxy.round", n),
	))
}

// endRound records a round's outcome on its span.
func endRound(span trace.Span, info roundInfo, usage workspace.Usage, retries int, err error) {
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
func (tr Tracing) toolSpan(ctx context.Context, call toolCall) (context.Context, trace.Span) {
	return tr.tools.Start(ctx, call.Name, call.Arguments, semconv.GenAIToolCallID(call.ID))
}

// endTool records a tool call's outcome on its span.
func (tr Tracing) endTool(span trace.Span, res tools.Result, err error) { tr.tools.End(span, res, err) }
