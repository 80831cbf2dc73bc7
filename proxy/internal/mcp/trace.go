package mcp

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/wsproxy/wsproxy/tools"
)

// tracing traces MCP's tool calls as the turn engine traces a turn's (the semantic conventions
// v1.40.0, GenAI's included): an `execute_tool {name}` span below the request's server span,
// its Postgres statements below it. Off (the zero value) it starts no span.
type tracing struct {
	tracer  trace.Tracer
	content bool // record arguments and results
	on      bool
}

func newTracing(tp trace.TracerProvider, content bool) tracing {
	if tp == nil {
		return tracing{}
	}
	return tracing{tracer: tp.Tracer("github.com/wsproxy/wsproxy/proxy"), content: content, on: true}
}

// toolSpan starts the span of a tool call on thread.
func (tr tracing) toolSpan(ctx context.Context, name string, thread tools.ThreadID, args json.RawMessage) (context.Context, trace.Span) {
	if !tr.on {
		return ctx, noop.Span{}
	}
	ctx, span := tr.tracer.Start(ctx, "execute_tool "+name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		semconv.GenAIOperationNameExecuteTool,
		semconv.GenAIToolName(name),
		semconv.GenAIToolType("function"),
		semconv.GenAIConversationID(thread.Name),
		attribute.String("wsproxy.via", tools.ViaMCP),
	))
	if tr.content && span.IsRecording() {
		span.SetAttributes(attribute.String("gen_ai.tool.call.arguments", string(args)))
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
