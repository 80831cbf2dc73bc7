package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// agentFake is a recording model server for capturing what a coding agent really sends: it
// listens on loopback only, keeps every request (method, path, query, headers, body), and answers
// each in the agent's own wire API — the Messages API (Claude Code), the Responses API (Codex CLI)
// and the Gemini API (Gemini CLI) — with a short valid answer, so the agent proceeds as it would
// against its provider. A WebSocket upgrade is refused with 426 (Codex falls back to HTTP at once).
type agentFake struct {
	*httptest.Server
	mu       sync.Mutex
	requests []capturedRequest
	// Reply, when set, picks the answer's text for a request (its body decoded); else "OK.".
	Reply func(r capturedRequest) string
}

// capturedRequest is one request as the agent sent it, its credentials redacted: the form of the
// fixtures under proxy/testdata/agents.
type capturedRequest struct {
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	Query   string              `json:"query,omitempty"`
	Headers map[string][]string `json:"headers"`
	Body    json.RawMessage     `json:"body,omitempty"`
}

// redactedHeaders carry credentials; a fixture keeps that they were sent, not their values.
var redactedHeaders = []string{"Authorization", "X-Api-Key", "X-Goog-Api-Key", "Api-Key", "Cookie", "Proxy-Authorization"}

func newAgentFake(t *testing.T, reply func(capturedRequest) string) *agentFake {
	t.Helper()
	f := &agentFake{Reply: reply} // before the server starts: the agents' requests come from another process
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f.Server = &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(f.serve)}}
	f.Start()
	t.Cleanup(f.Close)
	return f
}

// Requests are the requests received so far, in order.
func (f *agentFake) Requests() []capturedRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

func (f *agentFake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c := capturedRequest{Method: r.Method, Path: r.URL.Path, Query: redactQuery(r.URL.RawQuery), Headers: map[string][]string{}}
	for k, v := range r.Header {
		c.Headers[k] = slices.Clone(v)
	}
	for _, k := range redactedHeaders {
		if _, ok := c.Headers[k]; ok {
			c.Headers[k] = []string{"[redacted]"}
		}
	}
	if r.Host != "" {
		c.Headers["Host"] = []string{"127.0.0.1"} // the fake's port changes every run
	}
	if len(body) > 0 {
		if json.Valid(body) {
			c.Body = body
		} else {
			c.Body, _ = json.Marshal(string(body))
		}
	}
	f.mu.Lock()
	f.requests = append(f.requests, c)
	f.mu.Unlock()

	text := "OK."
	if f.Reply != nil {
		text = f.Reply(c)
	}
	var req struct {
		Stream bool            `json:"stream"`
		Model  string          `json:"model"`
		Input  json.RawMessage `json:"input"`
	}
	_ = json.Unmarshal(body, &req)
	path := r.URL.Path
	switch {
	case strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUpgradeRequired)
		_, _ = io.WriteString(w, `{"error":{"message":"WebSocket is not supported here: use HTTP.","type":"invalid_request_error","param":null,"code":"websocket_not_supported"}}`)
	case r.Method == http.MethodPost && strings.HasSuffix(path, "/messages/count_tokens"):
		writeJSON(w, map[string]any{"input_tokens": 1000})
	case r.Method == http.MethodPost && strings.HasSuffix(path, "/messages"):
		fakeMessages(w, req.Model, req.Stream, text)
	case r.Method == http.MethodPost && strings.HasSuffix(path, "/responses/compact"):
		writeJSON(w, map[string]any{"id": "resp_fake_compact", "object": "response.compaction", "output": []any{
			map[string]any{"type": "compaction", "encrypted_content": "fake-compacted-history"}}})
	case r.Method == http.MethodPost && strings.HasSuffix(path, "/responses"):
		fakeResponses(w, req.Model, bytes.Contains(req.Input, []byte(`"compaction_trigger"`)), text)
	case r.Method == http.MethodPost && strings.Contains(path, ":streamGenerateContent"):
		fakeGemini(w, true, text)
	case r.Method == http.MethodPost && strings.Contains(path, ":generateContent"):
		fakeGemini(w, false, text)
	case r.Method == http.MethodPost && strings.Contains(path, ":countTokens"):
		writeJSON(w, map[string]any{"totalTokens": 1000})
	case r.Method == http.MethodGet && strings.HasSuffix(path, "/models"):
		writeJSON(w, map[string]any{"object": "list", "data": []any{}, "models": []any{}})
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":{"message":"not found","type":"invalid_request_error","code":"not_found"}}`)
	}
}

func redactQuery(raw string) string {
	q, err := url.ParseQuery(raw)
	if err != nil || !q.Has("key") {
		return raw
	}
	q.Set("key", "[redacted]")
	return q.Encode()
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// sse writes server-sent events, each {event, data}; an empty event name writes data only.
func sse(w http.ResponseWriter, events ...[2]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	for _, ev := range events {
		data, _ := json.Marshal(ev[1])
		if name := ev[0].(string); name != "" {
			fmt.Fprintf(w, "event: %s\n", name)
		}
		fmt.Fprintf(w, "data: %s\n\n", data)
	}
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}

func fakeMessages(w http.ResponseWriter, model string, stream bool, text string) {
	usage := map[string]any{"input_tokens": 1000, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	if !stream {
		writeJSON(w, map[string]any{"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
			"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": "end_turn", "stop_sequence": nil, "usage": usage})
		return
	}
	sse(w,
		[2]any{"message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_fake", "type": "message", "role": "assistant",
			"model": model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": usage}}},
		[2]any{"content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}}},
		[2]any{"content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": text}}},
		[2]any{"content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}},
		[2]any{"message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 10}}},
		[2]any{"message_stop", map[string]any{"type": "message_stop"}},
	)
}

// fakeResponses answers a Responses request as a stream; a compaction_trigger request gets the one
// compaction item Codex requires in its place.
func fakeResponses(w http.ResponseWriter, model string, compaction bool, text string) {
	item := map[string]any{"type": "message", "id": "msg_fake", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
	if compaction {
		item = map[string]any{"type": "compaction", "id": "cmp_fake", "encrypted_content": "fake-compacted-history"}
	}
	resp := map[string]any{"id": "resp_fake", "object": "response", "created_at": 1, "model": model, "status": "in_progress", "output": []any{}}
	done := maps.Clone(resp)
	done["status"], done["output"] = "completed", []any{item}
	done["usage"] = map[string]any{"input_tokens": 5000, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": 10, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 5010}
	sse(w,
		[2]any{"response.created", map[string]any{"type": "response.created", "sequence_number": 0, "response": resp}},
		[2]any{"response.output_item.done", map[string]any{"type": "response.output_item.done", "sequence_number": 1, "output_index": 0, "item": item}},
		[2]any{"response.completed", map[string]any{"type": "response.completed", "sequence_number": 2, "response": done}},
	)
}

func fakeGemini(w http.ResponseWriter, stream bool, text string) {
	answer := map[string]any{
		"candidates":    []any{map[string]any{"content": map[string]any{"role": "model", "parts": []any{map[string]any{"text": text}}}, "finishReason": "STOP", "index": 0}},
		"usageMetadata": map[string]any{"promptTokenCount": 1000, "candidatesTokenCount": 10, "totalTokenCount": 1010},
		"modelVersion":  "fake", "responseId": "fake-response",
	}
	if !stream {
		writeJSON(w, answer)
		return
	}
	sse(w, [2]any{"", answer})
}

// writeFixtures writes each request as two files of proxy/testdata/agents: <name>.json (method,
// path, query and headers) and <name>.body.json (the body's bytes as sent), the run's temporary
// folders in the body replaced with placeholders so that a fixture names no machine's paths.
func writeFixtures(t *testing.T, fixtures map[string]capturedRequest, folders map[string]string) {
	t.Helper()
	dir := filepath.Join("..", "..", "proxy", "testdata", "agents")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, r := range fixtures {
		body := string(r.Body)
		for _, k := range slices.Sorted(maps.Keys(folders)) {
			body = strings.ReplaceAll(body, k, folders[k])
		}
		r.Body = nil
		delete(r.Headers, "Content-Length") // the body's placeholders change its length
		b, err := json.MarshalIndent(r, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name+".json"), append(b, '\n'), 0o644))
		if body != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name+".body.json"), []byte(body), 0o644))
		}
		t.Logf("wrote %s (%d bytes of body)", name, len(body))
	}
}
