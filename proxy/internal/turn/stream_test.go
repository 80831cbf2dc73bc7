package turn

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
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
		tt := newTurn(t, tools.Limits{}, up)
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
		tt := newTurn(t, tools.Limits{}, up)
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
	tt := newTurn(t, tools.Limits{ArgumentBytesMax: limit}, up)
	out := &recorder{}
	rounds, err := (&Runner{}).Run(context.Background(), tt, req.Stream(tt, out))
	require.NoError(t, err)
	for _, e := range out.events {
		require.NotContains(t, string(e.data), "tool_calls\":[", "no call for the client")
	}
	require.Equal(t, 2, rounds)
	require.Contains(t, string(up.sent[1]), fmt.Sprintf("at most %d bytes (got %d)", limit, len(args)))
}
