package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// tracedEnv is a proxy that traces into memory, its Postgres statements included.
func tracedEnv(t *testing.T) (*env, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	pool := dbtest.NewPool(t, &dbtest.Options{Tracer: db.NewTracer(tp)})
	return setupWithPool(t, pool, func(o *Options) { o.TracerProvider = tp }), rec
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// spansOf are the ended spans of one trace, by name.
func spansOf(rec *tracetest.SpanRecorder, id trace.TraceID) map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() == id {
			out[s.Name()] = append(out[s.Name()], s)
		}
	}
	return out
}

// TestTraceOfATurn: a turn with a tool round, streamed and not, is one trace continuing the
// client's (traceparent): the server span, a client span per upstream round with the GenAI
// attributes, an execute_tool span with its Postgres statements below it; the upstream gets the
// round span's context; no tool argument or result is recorded.
func TestTraceOfATurn(t *testing.T) {
	t.Parallel()
	e, rec := tracedEnv(t)
	for _, streamed := range []bool{false, true} {
		add := call{ID: "call_1", Name: "add_preferences", Arguments: `{"items":[{"title":"Secret title"}],"action_and_reasoning":"stated"}`}
		if streamed {
			e.up.Script(upstreamtest.Stream(append(upstreamtest.ToolCallChunks("s", 9, add), upstreamtest.UsageChunk("s", 12, 3))...),
				upstreamtest.Stream(append(upstreamtest.ContentChunks("s", "Done."), upstreamtest.UsageChunk("s", 20, 2))...))
		} else {
			e.up.Script(reply(cmpl("", add)), reply(cmpl("Done.")))
		}
		const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		body := `{"model":"gpt-test","messages":[{"role":"user","content":"Remember a secret."}]}`
		if streamed {
			body = `{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"Remember a secret."}]}`
		}
		resp := e.post("/threads/traced/v1/chat/completions", map[string]string{"traceparent": parent}, body)
		require.Equal(t, 200, resp.StatusCode)
		testkit.ReadBody(t, resp)

		id, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
		var spans map[string][]sdktrace.ReadOnlySpan
		require.Eventually(t, func() bool {
			spans = spansOf(rec, id)
			return len(spans["POST /threads/{thread}/v1/chat/completions"]) == map[bool]int{false: 1, true: 2}[streamed]
		}, 5e9, 1e7)
		server := spans["POST /threads/{thread}/v1/chat/completions"][len(spans["POST /threads/{thread}/v1/chat/completions"])-1]
		require.Equal(t, "00f067aa0ba902b7", server.Parent().SpanID().String(), "continues the client's trace")
		require.Equal(t, trace.SpanKindServer, server.SpanKind())
		require.Equal(t, int64(200), attrs(server)["http.response.status_code"].AsInt64())

		var rounds []sdktrace.ReadOnlySpan
		for _, s := range spans["chat gpt-test"] {
			if s.Parent().SpanID() == server.SpanContext().SpanID() {
				rounds = append(rounds, s)
			}
		}
		require.Len(t, rounds, 2)
		r1 := attrs(rounds[0])
		require.Equal(t, trace.SpanKindClient, rounds[0].SpanKind())
		require.Equal(t, "chat", r1["gen_ai.operation.name"].AsString())
		require.Equal(t, "gpt-test", r1["gen_ai.request.model"].AsString())
		require.Equal(t, "gpt-test", r1["gen_ai.response.model"].AsString())
		require.Equal(t, "traced", r1["gen_ai.conversation.id"].AsString())
		require.Equal(t, []string{"tool_calls"}, r1["gen_ai.response.finish_reasons"].AsStringSlice())
		require.Equal(t, int64(1), r1["wsproxy.round"].AsInt64())
		require.Equal(t, int64(0), r1["wsproxy.retries"].AsInt64())
		require.Contains(t, r1, attribute.Key("gen_ai.usage.input_tokens"))
		require.Contains(t, r1, attribute.Key("gen_ai.usage.cache_read.input_tokens"))
		require.Equal(t, []string{"stop"}, attrs(rounds[1])["gen_ai.response.finish_reasons"].AsStringSlice())

		// The upstream saw the round span's context.
		reqs := e.up.Requests()
		up1 := reqs[len(reqs)-2].Header.Get("traceparent")
		require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+rounds[0].SpanContext().SpanID().String()+"-01", up1)

		tool := spans["execute_tool add_preferences"][len(spans["execute_tool add_preferences"])-1]
		ta := attrs(tool)
		require.Equal(t, "add_preferences", ta["gen_ai.tool.name"].AsString())
		require.Equal(t, "call_1", ta["gen_ai.tool.call.id"].AsString())
		require.Equal(t, "ok", ta["wsproxy.tool.outcome"].AsString())
		var pg []string
		for _, s := range rec.Ended() {
			if s.Parent().SpanID() == tool.SpanContext().SpanID() {
				pg = append(pg, s.Name())
				require.Equal(t, "postgresql", attrs(s)["db.system.name"].AsString())
			}
		}
		require.NotEmpty(t, pg, "the tool's Postgres work is below it")
		for _, s := range rec.Ended() {
			for _, kv := range s.Attributes() {
				require.NotContains(t, kv.Value.Emit(), "Secret title", "no tool argument or result without the content setting")
			}
		}
	}
}

// TestTraceOfRefusalsAndFailures: a refused locked call counts its skip; an upstream error in
// round 2 marks that round's span.
func TestTraceOfRefusalsAndFailures(t *testing.T) {
	t.Parallel()
	e, rec := tracedEnv(t)
	e.admin("POST", "/admin/v1/threads/refused/preferences", map[string]any{"title": "Mine", "locked": true}, 201, nil)
	e.up.Script(reply(cmpl("", call{ID: "r", Name: "remove_preferences", Arguments: `{"indices":[1]}`})),
		upstreamtest.JSON(500, `{"error":{"message":"boom"}}`), upstreamtest.JSON(500, `{"error":{"message":"boom"}}`),
		upstreamtest.JSON(500, `{"error":{"message":"boom"}}`), upstreamtest.JSON(500, `{"error":{"message":"boom"}}`))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "refused"}, `{"model":"m","messages":[]}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	var tool, round2 sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			switch {
			case s.Name() == "execute_tool remove_preferences":
				tool = s
			case strings.HasPrefix(s.Name(), "chat") && attrs(s)["wsproxy.round"].AsInt64() == 2:
				round2 = s
			}
		}
		return tool != nil && round2 != nil
	}, 5e9, 1e7)
	require.Equal(t, int64(1), attrs(tool)["wsproxy.tool.locked_skips"].AsInt64())
	require.Equal(t, codes.Error, round2.Status().Code)
	require.Equal(t, int64(turn.DefaultRetries), attrs(round2)["wsproxy.retries"].AsInt64())
}

// TestExemplars: with tracing on, the latency histograms carry the trace id of a sampled request
// when the scraper asks for OpenMetrics; the plain text format carries none.
func TestExemplars(t *testing.T) {
	t.Parallel()
	e, _ := tracedEnv(t)
	e.up.Fallback = reply(cmpl("ok"))
	testkit.ReadBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "ex",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, `{"messages":[]}`))
	req, _ := http.NewRequest("GET", e.srv.URL+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	r, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	om := testkit.ReadBody(t, r)
	require.Contains(t, om, `trace_id="0af7651916cd43dd8448eb211c80319c"`)
	require.NotContains(t, scrape(t, e), "trace_id")
}
