package proxy

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
)

// anthropicClient is anthropic-sdk-go pointed at the proxy, with the thread in the path ("" for
// none).
func (e *env) anthropicClient(thread string, opts ...option.RequestOption) anthropic.Client {
	base := e.srv.URL
	if thread != "" {
		base += "/threads/" + thread
	}
	return anthropic.NewClient(append([]option.RequestOption{option.WithBaseURL(base), option.WithAPIKey("sk-ant-client"),
		option.WithMaxRetries(0)}, opts...)...)
}

// messagesParams is a user message and the client's tool Bash, with thinking on.
func messagesParams(text string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     "claude-test",
		MaxTokens: 1024,
		Thinking:  anthropic.ThinkingConfigParamOfEnabled(1024),
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))},
		Tools: []anthropic.ToolUnionParam{anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{
			Properties: map[string]any{"command": map[string]any{"type": "string"}}}, "Bash")},
	}
}

// runMessages runs a turn through the SDK, streamed or not, and returns the message the client
// has at the end (a stream accumulated with Message.Accumulate) and every event type it read.
func runMessages(t *testing.T, client anthropic.Client, params anthropic.MessageNewParams, streamed bool) (*anthropic.Message, []string, error) {
	t.Helper()
	ctx := context.Background()
	if !streamed {
		m, err := client.Messages.New(ctx, params)
		return m, nil, err
	}
	stream := client.Messages.NewStreaming(ctx, params)
	var m anthropic.Message
	var events []string
	for stream.Next() {
		ev := stream.Current()
		events = append(events, ev.Type)
		require.NoError(t, m.Accumulate(ev))
	}
	return &m, events, stream.Err()
}

// messagesRequests are the Messages requests the upstream received, decoded.
func (e *env) messagesRequests() []map[string]any {
	var out []map[string]any
	for _, r := range e.up.Requests() {
		if strings.HasPrefix(r.Path, "/v1/messages") {
			out = append(out, r.JSON(e.t))
		}
	}
	return out
}

func forEachMode(t *testing.T, f func(t *testing.T, streamed bool)) {
	for _, mode := range []struct {
		name     string
		streamed bool
	}{{"JSON", false}, {"SSE", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f(t, mode.streamed)
		})
	}
}

// TestMessagesTurnWithAWorkspaceCall: a Messages turn whose first round thinks and calls a
// workspace tool, and whose second answers, reads through anthropic-sdk-go as one message under
// the first round's id: its thinking and the answer, never the workspace call, the last
// stop_reason and the usage of both rounds; the tool ran, and the thinking went back upstream
// unchanged (the fake refuses it otherwise).
func TestMessagesTurnWithAWorkspaceCall(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, streamed bool) {
		e := setup(t)
		e.up.Script(
			upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_1", Blocks: []upstreamtest.Block{
				upstreamtest.ThinkingBlock("The user states a goal; record it."),
				upstreamtest.ToolUseBlock("toolu_1", "set_objective", `{"text":"A tidy repository","action_and_reasoning":"The user stated their goal."}`)}}),
			upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_2", Blocks: []upstreamtest.Block{
				upstreamtest.ThinkingBlock("Recorded; answer."), upstreamtest.TextBlock("Noted: a tidy repository.")},
				Usage: map[string]int{"input_tokens": 30, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 100, "output_tokens": 7}}),
		)
		m, events, err := runMessages(t, e.anthropicClient("mt"), messagesParams("My goal is a tidy repository."), streamed)
		require.NoError(t, err)
		require.Equal(t, "msg_1", m.ID)
		require.Len(t, m.Content, 3)
		require.Equal(t, []string{"thinking", "thinking", "text"}, []string{m.Content[0].Type, m.Content[1].Type, m.Content[2].Type})
		require.Equal(t, "The user states a goal; record it.", m.Content[0].Thinking)
		require.Equal(t, upstreamtest.Signature("The user states a goal; record it."), m.Content[0].Signature)
		require.Equal(t, "Noted: a tidy repository.", m.Content[2].Text)
		require.Equal(t, anthropic.StopReasonEndTurn, m.StopReason)
		require.Equal(t, []int64{40, 2, 104, 12}, []int64{m.Usage.InputTokens, m.Usage.CacheCreationInputTokens, m.Usage.CacheReadInputTokens, m.Usage.OutputTokens})
		if streamed {
			require.Equal(t, 1, count(events, "message_start"))
			require.Equal(t, 1, count(events, "message_delta"))
			require.Equal(t, 1, count(events, "message_stop"))
			require.Equal(t, "message_stop", events[len(events)-1])
		}
		require.Equal(t, "A tidy repository", e.workspace("mt").Objective.Text)

		reqs := e.messagesRequests()
		require.Len(t, reqs, 2)
		msgs := reqs[1]["messages"].([]any)
		require.Len(t, msgs, 3)
		assistant, _ := json.Marshal(msgs[1])
		require.JSONEq(t, `{"role":"assistant","content":[{"type":"thinking","thinking":"The user states a goal; record it.","signature":"`+
			upstreamtest.Signature("The user states a goal; record it.")+`"},{"type":"tool_use","id":"toolu_1","name":"set_objective",`+
			`"input":{"text":"A tidy repository","action_and_reasoning":"The user stated their goal."}}]}`, string(assistant))
		results, _ := json.Marshal(msgs[2])
		require.JSONEq(t, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"{\"ok\":true,\"result\":\"objective set: A tidy repository\"}"}]}`, string(results))
		require.Eventually(t, func() bool {
			u := e.workspace("mt").Usage
			return u == tools.Usage{PromptTokens: 146, CachedPromptTokens: 104, CompletionTokens: 12, CacheWriteTokens: 2}
		}, 10*time.Second, 10*time.Millisecond, "the thread's usage: input, cache reads and writes are its prompt")
	})
}

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// TestMessagesThinkingByteIdentical: the thinking and redacted_thinking blocks of a round, and a
// block of a type the proxy does not know, go back upstream with the next round byte for byte
// in value (thinking text and signature as the upstream sent them), streamed or not.
func TestMessagesThinkingByteIdentical(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, streamed bool) {
		e := setup(t)
		thinking := "Unicode \u00e9\u4e2d and \"quotes\", <tags> & a\nnew line \\ backslash."
		e.up.Script(
			upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_1", Blocks: []upstreamtest.Block{
				upstreamtest.ThinkingBlock(thinking), upstreamtest.RedactedThinkingBlock("opaque+/=="),
				{Type: "server_tool_use", Raw: `{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"x"}}`},
				upstreamtest.ToolUseBlock("toolu_1", "list_preferences", `{"action_and_reasoning":"look"}`)}}),
			upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_2", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("None yet.")}}),
		)
		m, _, err := runMessages(t, e.anthropicClient("tb"), messagesParams("What are my preferences?"), streamed)
		require.NoError(t, err)
		require.Equal(t, []string{"thinking", "redacted_thinking", "server_tool_use", "text"}, blockTypes(m))
		msgs := e.messagesRequests()[1]["messages"].([]any)
		content := msgs[1].(map[string]any)["content"].([]any)
		require.Len(t, content, 4)
		require.Equal(t, thinking, content[0].(map[string]any)["thinking"])
		require.Equal(t, upstreamtest.Signature(thinking), content[0].(map[string]any)["signature"])
		require.Equal(t, "EmwKAhgBEgyopaque+/==", content[1].(map[string]any)["data"])
		require.Equal(t, "srvtoolu_1", content[2].(map[string]any)["id"])
	})
}

func blockTypes(m *anthropic.Message) []string {
	var out []string
	for _, b := range m.Content {
		out = append(out, b.Type)
	}
	return out
}

// TestMessagesMixedRoundContinued: a round that calls a workspace tool and the client's Bash
// ends the turn with the thinking and the client's tool_use only (stop_reason tool_use); the
// client's next request, built by the SDK from that message and Bash's result, is accepted by an
// upstream that checks tool_use/tool_result pairing and thinking signatures as Anthropic does.
func TestMessagesMixedRoundContinued(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, streamed bool) {
		e := setup(t)
		e.up.Script(
			upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_1", Blocks: []upstreamtest.Block{
				upstreamtest.ThinkingBlock("Record the preference, then list the files."),
				upstreamtest.ToolUseBlock("toolu_ws", "add_preferences", `{"items":[{"title":"Tabs"}],"action_and_reasoning":"The user prefers tabs."}`),
				upstreamtest.ToolUseBlock("toolu_bash", "Bash", `{"command":"ls"}`)}}),
			upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_2", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("Two files.")}}),
		)
		client := e.anthropicClient("mx")
		params := messagesParams("I prefer tabs. List the files.")
		m, _, err := runMessages(t, client, params, streamed)
		require.NoError(t, err)
		require.Equal(t, []string{"thinking", "tool_use"}, blockTypes(m))
		require.Equal(t, "Bash", m.Content[1].Name)
		require.Equal(t, anthropic.StopReasonToolUse, m.StopReason)
		require.Equal(t, "Tabs", e.workspace("mx").Preferences[0].Title)

		params.Messages = append(params.Messages, m.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock("toolu_bash", "a.go b.go", false)))
		m, _, err = runMessages(t, client, params, streamed)
		require.NoError(t, err, "the upstream accepts the client's continuation")
		require.Equal(t, "Two files.", m.Content[0].Text)
		require.Equal(t, 0, e.up.Remaining())
	})
}

// TestMessagesFakeRefusesWhatAnthropicRefuses: the fake upstream of these tests refuses a
// tool_use without its tool_result, and a thinking block altered in any way.
func TestMessagesFakeRefusesWhatAnthropicRefuses(t *testing.T) {
	t.Parallel()
	sig := upstreamtest.Signature("think")
	for _, tt := range []struct{ name, messages, want string }{
		{"Accepted", `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"think","signature":"` + sig + `"},` +
			`{"type":"tool_use","id":"t1","name":"Bash","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]`, ""},
		{"ToolUseWithoutResult", `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"think","signature":"` + sig + `"},` +
			`{"type":"tool_use","id":"t1","name":"Bash","input":{}},{"type":"tool_use","id":"t2","name":"set_objective","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]`, "without `tool_result`"},
		{"AlteredThinking", `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"think!","signature":"` + sig + `"},` +
			`{"type":"tool_use","id":"t1","name":"Bash","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]`, "Invalid `signature`"},
		{"ThinkingDropped", `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]`, "must start with a thinking block"},
		{"ResultAfterText", `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"think","signature":"` + sig + `"},` +
			`{"type":"tool_use","id":"t1","name":"Bash","input":{}}]},{"role":"user","content":[{"type":"text","text":"x"},{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]`, "must come first"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := upstreamtest.CheckMessages([]byte(`{"model":"m","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":1024},"messages":` + tt.messages + `}`))
			if tt.want == "" {
				require.Empty(t, got)
				return
			}
			require.Contains(t, got, tt.want)
		})
	}
}

// TestMessagesMaxRoundsLastRound: after MAX_TOOL_ROUNDS rounds of workspace calls, the last
// round goes without the workspace tools (the client's stay) and its answer ends the turn.
func TestMessagesMaxRoundsLastRound(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.MaxToolRounds = 1 })
	e.up.Script(
		upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_1", Blocks: []upstreamtest.Block{
			upstreamtest.ToolUseBlock("toolu_1", "list_preferences", `{}`)}}),
		upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_2", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("Done.")}}),
	)
	params := messagesParams("List them.")
	params.Thinking = anthropic.ThinkingConfigParamUnion{}
	m, _, err := runMessages(t, e.anthropicClient("mr"), params, false)
	require.NoError(t, err)
	require.Equal(t, "Done.", m.Content[0].Text)
	reqs := e.messagesRequests()
	require.Len(t, reqs, 2)
	require.Len(t, reqs[0]["tools"], 6, "Bash and the five")
	require.Len(t, reqs[1]["tools"], 1, "Bash alone")
	require.Equal(t, "Bash", reqs[1]["tools"].([]any)[0].(map[string]any)["name"])
}

// TestMessagesCountTokens: count_tokens with a thread goes upstream as the turn's first round
// would (the five tools, the block in place), answers as the upstream did, and counts no turn;
// without a thread it is passed through as it came.
func TestMessagesCountTokens(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.admin("PUT", "/admin/v1/threads/ct/objective", map[string]string{"text": "Count me"}, 200, nil)
	e.up.Script(upstreamtest.JSON(200, `{"input_tokens":321}`), upstreamtest.JSON(200, `{"input_tokens":12}`))
	resp := e.post("/threads/ct/v1/messages/count_tokens?beta=true", map[string]string{"Anthropic-Version": "2023-06-01"},
		`{"model":"claude-test","messages":[{"role":"user","content":"hi"}],"tools":[{"name":"Bash","input_schema":{"type":"object"}}]}`)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, `{"input_tokens":321}`, readBody(t, resp))
	req := e.up.Requests()[0]
	require.Equal(t, "/v1/messages/count_tokens?beta=true", req.Path)
	require.Equal(t, "2023-06-01", req.Header.Get("Anthropic-Version"))
	body := req.JSON(t)
	require.Len(t, body["tools"], 6)
	last := body["messages"].([]any)[0].(map[string]any)["content"].([]any)
	require.Equal(t, "hi", last[0].(map[string]any)["text"])
	require.Contains(t, last[1].(map[string]any)["text"], "Objective: Count me")
	require.Zero(t, e.turns("ct"), "no turn counted")

	resp = e.post("/v1/messages/count_tokens", nil, `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, `{"input_tokens":12}`, readBody(t, resp))
	require.Equal(t, `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`, string(e.up.Requests()[1].Body))
}
