// Package genai traces the workspace's tool calls as the OpenTelemetry semantic conventions
// v1.40.0 say (GenAI's included), for the turn engine and MCP alike: an `execute_tool {name}`
// span per call.
package genai

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/wsproxy/wsproxy/tools"
)

// InstrumentationName names wsproxy's tracer.
const InstrumentationName = "github.com/wsproxy/wsproxy/proxy"

// Tools traces tool calls. Off (the zero value) it starts no span and allocates nothing.
type Tools struct {
	tracer  trace.Tracer
	content bool // record arguments and results (an explicit opt-in)
}

// NewTools traces with tp (nil: nothing), recording arguments and results when content is set.
func NewTools(tp trace.TracerProvider, content bool) Tools {
	if tp == nil {
		return Tools{}
	}
	return Tools{tracer: tp.Tracer(InstrumentationName), content: content}
}

// Tracer is the tracer of the spans (nil when off).
func (t Tools) Tracer() trace.Tracer { return t.tracer }

// Start starts the span of a call of tool name with arguments args and attributes attrs.
func (t Tools) Start(ctx context.Context, name, args string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if t.tracer == nil {
		return ctx, noop.Span{}
	}
	attrs = append([]attribute.KeyValue{semconv.GenAIOperationNameExecuteTool, semconv.GenAIToolName(name), semconv.GenAIToolType("function")},
		attrs...)
	ctx, span := t.tracer.Start(ctx, "execute_tool "+name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	if t.content && span.IsRecording() {
		span.SetAttributes(attribute.String("gen_ai.tool.call.arguments", args))
	}
	return ctx, span
}

// End records a tool call's outcome on its span and ends it.
func (t Tools) End(span trace.Span, res tools.Result, err error) {
	if t.tracer != nil && span.IsRecording() {
		outcome := "ok"
		if !res.OK {
			outcome = "error"
		}
		span.SetAttributes(attribute.String("wsproxy.tool.outcome", outcome), attribute.Int("wsproxy.tool.locked_skips", res.LockedSkips))
		if t.content {
			span.SetAttributes(attribute.String("gen_ai.tool.call.result", res.Content))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}
