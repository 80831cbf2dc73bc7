package turn

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/wsproxy/wsproxy/tools"
)

// SemconvVersion is the version of the semantic conventions the traces follow.
const SemconvVersion = "1.40.0"

// instrumentationName names the turn engine's tracer.
const instrumentationName = "github.com/wsproxy/wsproxy/proxy"

// Traces follow the OpenTelemetry semantic conventions v1.40.0 (SemconvVersion), GenAI ones
// included: a client span per upstream round (`chat {model}`) and an `execute_tool {name}` span
// per workspace call, below the HTTP edge's server span.

// Tracing traces a turn's rounds and tool calls. Off (the zero value) it starts no span and
// allocates nothing.
type Tracing struct {
	tracer trace.Tracer
	// content: record tool arguments and results (an explicit opt-in).
	content bool
	on      bool
	// provider is gen_ai.provider.name: openai for OpenAI's API, else the upstream's host.
	provider string
}

// NewTracing traces with tp (nil: nothing), recording tool arguments and results when content
// is set, naming the upstream's provider (gen_ai.provider.name) provider.
func NewTracing(tp trace.TracerProvider, content bool, provider string) Tracing {
	if tp == nil {
		return Tracing{provider: provider}
	}
	return Tracing{tracer: tp.Tracer(instrumentationName), content: content, on: true, provider: provider}
}

// roundInfo is what a round's reply says of itself, for its span.
type roundInfo struct {
	model, id     string
	finishReasons []string
}

// roundSpan starts the client span of one upstream round of a turn.
func (tr Tracing) roundSpan(ctx context.Context, t *Turn, n int) (context.Context, trace.Span) {
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
func (tr Tracing) toolSpan(ctx context.Context, call toolCall) (context.Context, trace.Span) {
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
func (tr Tracing) endTool(span trace.Span, res tools.Result, err error) {
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
