package db

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracer traces the statements a pool runs as client spans, children of the caller's span: one
// per statement, one per pipeline (batch) with an event per statement. A span is named after the
// sqlc query (`ThreadTurnNext`), else the statement's first word (`BEGIN`). Set it as a pool's
// ConnConfig.Tracer.
type Tracer struct {
	tracer trace.Tracer
}

// NewTracer returns a Tracer on tp.
func NewTracer(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer("github.com/wsproxy/wsproxy/db")}
}

// queryName is the name of an sqlc query ("-- name: X :one" starts its text), else the
// statement's first word.
func queryName(sql string) string {
	if rest, ok := strings.CutPrefix(sql, "-- name: "); ok {
		if name, _, ok := strings.Cut(rest, " "); ok {
			return name
		}
	}
	if f := strings.Fields(sql); len(f) > 0 {
		return strings.ToUpper(f[0])
	}
	return "query"
}

func (t *Tracer) start(ctx context.Context, name string, attrs ...attribute.KeyValue) context.Context {
	ctx, _ = t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, semconv.DBSystemNamePostgreSQL)...))
	return ctx
}

func end(ctx context.Context, err error) {
	span := trace.SpanFromContext(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// TraceQueryStart starts a statement's span.
func (t *Tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name := queryName(d.SQL)
	return t.start(ctx, name, semconv.DBQuerySummary(name), semconv.DBQueryText(d.SQL))
}

// TraceQueryEnd ends it.
func (t *Tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	end(ctx, d.Err)
}

// TraceBatchStart starts a pipeline's span.
func (t *Tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	names := make([]string, 0, d.Batch.Len())
	for _, q := range d.Batch.QueuedQueries {
		names = append(names, queryName(q.SQL))
	}
	return t.start(ctx, "pipeline", semconv.DBQuerySummary(strings.Join(names, "; ")), attribute.Int("db.operation.batch.size", len(names)))
}

// TraceBatchQuery records one statement of the pipeline as an event.
func (t *Tracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	attrs := []attribute.KeyValue{semconv.DBQuerySummary(queryName(d.SQL))}
	if d.Err != nil {
		attrs = append(attrs, attribute.String("error", d.Err.Error()))
	}
	trace.SpanFromContext(ctx).AddEvent("statement", trace.WithAttributes(attrs...))
}

// TraceBatchEnd ends the pipeline's span.
func (t *Tracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	end(ctx, d.Err)
}
