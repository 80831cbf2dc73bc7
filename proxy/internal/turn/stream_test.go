package turn

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestStreamRetryCountsTheRoundOnce: a round after the turn's tools fails once after the
// upstream reported its usage, and is retried; the usage the client gets counts each round once,
// never the failed attempt.
func TestStreamRetryCountsTheRoundOnce(t *testing.T) {
	t.Parallel()
	objective := `{"text":"Count once","action_and_reasoning":"goal"}`
	t.Run("Messages", func(t *testing.T) {
		t.Parallel()
		usage := func(in int) map[string]int { return map[string]int{"input_tokens": in, "output_tokens": 5} }
		round1 := upstreamtest.MessageReply{ID: "msg_1", Usage: usage(100),
			Blocks: []upstreamtest.Block{upstreamtest.ToolUseBlock("toolu_1", tools.SetObjective, objective)}}
		failed := upstreamtest.MessageReply{ID: "msg_2", Usage: usage(1000)}.Events()[0] +
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
		round2 := upstreamtest.MessageReply{ID: "msg_3", Usage: usage(200), Blocks: []upstreamtest.Block{upstreamtest.TextBlock("Done.")}}
		up := &script{replies: bodies(strings.Join(round1.Events(), ""), failed, strings.Join(round2.Events(), ""))}
		req, err := ParseMessagesRequest([]byte(`{"model":"m","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"go"}]}`))
		require.NoError(t, err)
		tt := newTurn(t, workspace.Limits{}, up)
		out := &recorder{}
		rounds, err := (&Runner{RetryBackoff: time.Millisecond}).Run(context.Background(), tt, req.Stream(tt, out))
		require.NoError(t, err)
		require.Equal(t, 2, rounds)
		var delta map[string]any
		for _, e := range out.decoded(t) {
			if e["type"] == "message_delta" {
				delta = e
			}
		}
		require.EqualValues(t, 300, delta["usage"].(map[string]any)["input_tokens"], "round 1 and round 2, not the failed attempt")
		require.EqualValues(t, 300, tt.Usage.PromptTokens)
	})
	t.Run("Chat", func(t *testing.T) {
		t.Parallel()
		round1 := upstreamtest.Events(append(upstreamtest.ToolCallChunks("c", 7, call{ID: "a", Name: tools.SetObjective, Arguments: objective}),
			upstreamtest.UsageChunk("c", 100, 5), "[DONE]")...)
		failed := upstreamtest.Events(upstreamtest.UsageChunk("c", 1000, 5), `{"error":{"message":"Overloaded","type":"server_error"}}`)
		round2 := upstreamtest.Events(append(upstreamtest.ContentChunks("c", "Done."), upstreamtest.UsageChunk("c", 200, 5), "[DONE]")...)
		up := &script{replies: bodies(strings.Join(round1, ""), strings.Join(failed, ""), strings.Join(round2, ""))}
		req, err := ParseChatRequest([]byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"go"}]}`))
		require.NoError(t, err)
		tt := newTurn(t, workspace.Limits{}, up)
		out := &recorder{}
		rounds, err := (&Runner{RetryBackoff: time.Millisecond}).Run(context.Background(), tt, req.Stream(tt, out))
		require.NoError(t, err)
		require.Equal(t, 2, rounds)
		var usage map[string]any
		for _, e := range out.decoded(t) {
			if u, ok := e["usage"].(map[string]any); ok {
				usage = u
			}
		}
		require.EqualValues(t, 300, usage["prompt_tokens"], "round 1 and round 2, not the failed attempt")
	})
}

// TestChatStreamWrapperOverTheBound: a parallel wrapper whose arguments are longer than a
// workspace call may be is the workspace's, refused for its length: the client never gets the
// start of it as a call of its own.
func TestChatStreamWrapperOverTheBound(t *testing.T) {
	t.Parallel()
	const limit = 1024
	args := upstreamtest.Args(map[string]any{"tool_uses": []any{
		map[string]any{"recipient_name": "functions.set_objective", "parameters": map[string]string{"text": strings.Repeat("x", 2*limit), "action_and_reasoning": "goal"}},
		map[string]any{"recipient_name": "functions.get_weather", "parameters": map[string]string{}},
	}})
	round1 := upstreamtest.Events(append(upstreamtest.ToolCallChunks("c", 100, call{ID: "w", Name: "multi_tool_use.parallel", Arguments: args}), "[DONE]")...)
	round2 := upstreamtest.Events(append(upstreamtest.ContentChunks("c", "Done."), "[DONE]")...)
	up := &script{replies: bodies(strings.Join(round1, ""), strings.Join(round2, ""))}
	req, err := ParseChatRequest([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"go"}],` +
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]}`))
	require.NoError(t, err)
	tt := newTurn(t, workspace.Limits{ArgumentBytesMax: limit}, up)
	out := &recorder{}
	rounds, err := (&Runner{}).Run(context.Background(), tt, req.Stream(tt, out))
	require.NoError(t, err)
	for _, e := range out.events {
		require.NotContains(t, string(e.data), "tool_calls\":[", "no call for the client")
	}
	require.Equal(t, 2, rounds)
	require.Contains(t, string(up.sent[1]), fmt.Sprintf("at most %d bytes (got %d)", limit, len(args)))
}

// TestStreamEventNotJSONEndsTheStream: an upstream event whose data is not JSON may hold a
// workspace call the proxy cannot see, so it ends a streamed turn as a non-streamed body that
// is not JSON does (a protocol failure, the client's error event in its own format), never
// reaching the client as it came; an event of JSON the proxy does not know passes.
func TestStreamEventNotJSONEndsTheStream(t *testing.T) {
	t.Parallel()
	ev := func(name, data string) string { return "event: " + name + "\ndata: " + data + "\n\n" }
	for _, c := range []struct {
		name, request, stream string
		parse                 func([]byte) (Request, error)
	}{
		{"chat", `{"model":"m","stream":true,"messages":[{"role":"user","content":"go"}]}`,
			strings.Join(upstreamtest.Events(upstreamtest.Chunk("c", `{"role":"assistant","content":"Hi"}`, ""), `["unknown"]`,
				upstreamtest.Chunk("c", `{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"set_objective","arguments":"{}"}}]}`, "")+"x"), ""),
			chatRequest},
		{"messages", `{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"go"}]}`,
			ev("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"usage":{"input_tokens":1}}}`) +
				ev("unknown", `{"type":"unknown"}`) +
				ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"set_objective","input":{}}`),
			messagesRequest},
		{"responses", `{"model":"m","stream":true,"input":"go"}`,
			ev("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}`) +
				ev("response.unknown", `{"type":"response.unknown","sequence_number":1}`) +
				ev("response.output_item.added", `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"c1","name":"set_objective","arguments":""}`),
			responsesRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			req, err := c.parse([]byte(c.request))
			require.NoError(t, err)
			up := &script{replies: bodies(c.stream)}
			tt := newTurn(t, workspace.Limits{}, up)
			out := &recorder{}
			dialect := req.Stream(tt, out)
			_, err = (&Runner{}).Run(context.Background(), tt, dialect)
			require.ErrorIs(t, err, apierr.ErrUpstreamProtocol)
			unknown := false
			for _, e := range out.events {
				require.NotContains(t, string(e.data), "set_objective", "the unreadable event never reaches the client")
				unknown = unknown || strings.Contains(string(e.data), "unknown")
			}
			require.True(t, unknown, "the event the proxy does not know went on")
			_, failure := dialect.(StreamDialect).Failure(err)
			require.True(t, json.Valid(failure), "%s", failure)
		})
	}
}
