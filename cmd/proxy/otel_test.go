package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestTracesExportOverOTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set, a turn with a tool round on the
// demo model reaches a real OTLP/HTTP receiver (protobuf) as one trace: the server span, each
// upstream round, the tool call and its Postgres work, under the configured service name.
func TestTracesExportOverOTLP(t *testing.T) {
	var mu sync.Mutex
	spans := map[string][][]byte{} // name -> the trace ids of spans of that name
	services := map[string]bool{}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.Resource.Attributes {
				if kv.Key == "service.name" {
					services[kv.Value.GetStringValue()] = true
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					spans[s.Name] = append(spans[s.Name], s.TraceId)
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(b)
	}))
	defer receiver.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "wsproxy-test")

	m, logs := MustRunMain(t, nil)
	require.Contains(t, logs.String(), "tracing: exporting spans over OTLP")
	req, _ := http.NewRequest("POST", m.URL+"/threads/otlp/v1/chat/completions",
		strings.NewReader(`{"model":"wsproxy-demo","messages":[{"role":"user","content":"My goal is to test tracing."}]}`))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.NoError(t, m.Close()) // flushes the spans

	mu.Lock()
	defer mu.Unlock()
	require.True(t, services["wsproxy-test"])
	require.Len(t, spans["POST /threads/{thread}/v1/chat/completions"], 1)
	trace := spans["POST /threads/{thread}/v1/chat/completions"][0]
	for _, name := range []string{"chat wsproxy-demo", "execute_tool set_objective", "pipeline"} {
		require.True(t, slices.ContainsFunc(spans[name], func(id []byte) bool { return bytes.Equal(id, trace) }),
			"%s in the turn's trace (spans: %v)", name, keysOf(spans))
	}
}

func keysOf(m map[string][][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
