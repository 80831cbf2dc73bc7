package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
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
			return u == workspace.Usage{PromptTokens: 146, CachedPromptTokens: 104, CompletionTokens: 12, CacheWriteTokens: 2}
		}, 10*time.Second, 10*time.Millisecond, "the thread's usage: input, cache reads and writes are its prompt")
		metrics := e.opts().Metrics
		require.Equal(t, 146.0, testutil.ToFloat64(metrics.tokens.WithLabelValues("prompt", "claude-test")))
		require.Equal(t, 104.0, testutil.ToFloat64(metrics.cachedTokens.WithLabelValues("claude-test")))
		require.Equal(t, 1.0, testutil.ToFloat64(metrics.toolCalls.WithLabelValues("set_objective", "ok", "proxy")))
		require.Eventually(t, func() bool {
			return testutil.ToFloat64(metrics.httpRequests.WithLabelValues("POST /threads/{thread}/v1/messages", "200")) == 1
		}, 5*time.Second, 10*time.Millisecond, "the route label")
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
	require.Equal(t, `{"input_tokens":321}`, testkit.ReadBody(t, resp))
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
	require.Equal(t, `{"input_tokens":12}`, testkit.ReadBody(t, resp))
	require.Equal(t, `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`, string(e.up.Requests()[1].Body))
}

// anthropicError is the error body of the Messages API's shape.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeAnthropicError(t *testing.T, body string) anthropicError {
	t.Helper()
	var e anthropicError
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	require.Equal(t, "error", e.Type, body)
	return e
}

// TestMessagesErrors: the proxy's errors on the Messages API's routes are in Anthropic's shape
// (anthropic-sdk-go reads their type); the upstream's errors reach the client as it sent them,
// an error status as a status and an error event inside the stream.
func TestMessagesErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tt := range []struct {
		name, path, header, body string
		status                   int
		typ, message             string
	}{
		{"InvalidJSON", "/threads/er/v1/messages", "", `{"model":`, 400, "invalid_request_error", "not valid JSON"},
		{"NoMessages", "/threads/er/v1/messages", "", `{"model":"m","max_tokens":5}`, 400, "invalid_request_error", "messages"},
		{"ReservedToolName", "/threads/er/v1/messages", "", `{"model":"m","messages":[],"tools":[{"name":"set_objective","input_schema":{"type":"object"}}]}`,
			400, "invalid_request_error", "reserved"},
		{"ThreadMismatch", "/threads/er/v1/messages", "other", `{"model":"m","messages":[]}`, 400, "invalid_request_error", "different threads"},
		{"BadThread", "/threads/bad%20id/v1/messages/count_tokens", "", `{"model":"m","messages":[]}`, 400, "invalid_request_error", "thread"},
		{"BadPlacement", "/v1/messages", "", `{"model":"m","messages":[]}`, 400, "invalid_request_error", "placement"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.header != "" {
				h["X-Thread-Id"] = tt.header
			}
			if tt.name == "BadPlacement" {
				h["X-Thread-Id"], h["X-Workspace-Placement"] = "er", "middle"
			}
			resp := e.post(tt.path, h, tt.body)
			require.Equal(t, tt.status, resp.StatusCode)
			got := decodeAnthropicError(t, testkit.ReadBody(t, resp))
			require.Equal(t, tt.typ, got.Error.Type)
			require.Contains(t, got.Error.Message, tt.message)
		})
	}

	t.Run("ReadBySDK", func(t *testing.T) {
		params := messagesParams("hi")
		params.Tools = append(params.Tools, anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{}, "list_preferences"))
		client := e.anthropicClient("er")
		_, err := client.Messages.New(context.Background(), params)
		var apiErr *anthropic.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, 400, apiErr.StatusCode)
		require.Equal(t, "invalid_request_error", string(apiErr.Type()))
	})
}

// TestMessagesUpstreamErrors: an upstream's error status reaches the client with its body; an
// error event in a stream (here in the round after a workspace call, once the client has the
// first round's message_start) ends the client's stream as the upstream sent it.
func TestMessagesUpstreamErrors(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.Retries = -1 })
	overloaded := `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`
	e.up.Script(upstreamtest.JSON(529, overloaded))
	resp := e.post("/threads/ue/v1/messages", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 529, resp.StatusCode)
	require.Equal(t, overloaded, testkit.ReadBody(t, resp))

	first := upstreamtest.MessageReply{ID: "msg_1", Blocks: []upstreamtest.Block{upstreamtest.ToolUseBlock("toolu_1", "list_preferences", `{}`)}}
	e.up.Script(upstreamtest.Messages(first), upstreamtest.StreamRaw([]string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n",
		"event: error\ndata: " + overloaded + "\n\n"}))
	params := messagesParams("List them.")
	params.Thinking = anthropic.ThinkingConfigParamUnion{}
	m, events, err := runMessages(t, e.anthropicClient("ue"), params, true)
	require.Error(t, err)
	require.Contains(t, err.Error(), "overloaded_error")
	require.Equal(t, []string{"message_start"}, events, "the SDK does not show pings")
	require.Equal(t, "msg_1", m.ID)
}

// TestMessagesClientKeys: with CLIENT_KEYS a client key is accepted in x-api-key or as a
// bearer token (a wrong one is Anthropic's authentication_error); the client's credentials
// never reach the upstream, which gets ANTHROPIC_UPSTREAM_API_KEY in x-api-key; the thread is
// the client's.
func TestMessagesClientKeys(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret")
	require.NoError(t, err)
	e := setup(t, func(o *Options) {
		o.ClientKeys = keys
		o.UpstreamAPIKey = "sk-openai-op"
		setAnthropicKey(o, "sk-ant-op")
	})
	reply := upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_k", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("Hello.")}})
	e.up.Script(reply, reply, reply)
	params := messagesParams("hi")
	params.Thinking = anthropic.ThinkingConfigParamUnion{}
	for _, auth := range []option.RequestOption{option.WithAPIKey("sk-alice-secret"), option.WithAuthToken("sk-alice-secret")} {
		client := anthropic.NewClient(option.WithBaseURL(e.srv.URL+"/threads/ck"), auth, option.WithMaxRetries(0))
		m, _, err := runMessages(t, client, params, false)
		require.NoError(t, err)
		require.Equal(t, "Hello.", m.Content[0].Text)
	}
	m, _, err := runMessages(t, e.anthropicClient("", option.WithAPIKey("sk-alice-secret")), params, true)
	require.NoError(t, err, "a pass-through with the client's key")
	require.Equal(t, "Hello.", m.Content[0].Text)
	for _, r := range e.up.Requests() {
		require.Equal(t, "sk-ant-op", r.Header.Get("X-Api-Key"))
		require.Empty(t, r.Header.Get("Authorization"))
		require.NotContains(t, strings.Join(flatten(r.Header), " "), "sk-alice-secret")
	}
	require.Equal(t, "alice", e.workspace("alice~ck").Client)

	wrong := e.anthropicClient("ck", option.WithAPIKey("sk-wrong"))
	_, err = wrong.Messages.New(context.Background(), params)
	var apiErr *anthropic.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 401, apiErr.StatusCode)
	require.Equal(t, "authentication_error", string(apiErr.Type()))
}

func flatten(h map[string][]string) []string {
	var out []string
	for k, vs := range h {
		out = append(out, k+": "+strings.Join(vs, ","))
	}
	return out
}

// TestMessagesPassThrough: without a thread, a Messages request goes to the Anthropic upstream
// byte for byte, with its query string and its anthropic-version, anthropic-beta and x-api-key
// headers, and its answer comes back as it was.
func TestMessagesPassThrough(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := `{"model":"claude-test", "max_tokens":5,"messages":[{"role":"user","content":"<workspace>hi</workspace>"}],"tools":[{"name":"set_objective","input_schema":{}}]}`
	e.up.Script(upstreamtest.JSON(200, `{"id":"msg_p","type":"message"}`))
	resp := e.post("/v1/messages?beta=true", map[string]string{"Anthropic-Version": "2023-06-01", "Anthropic-Beta": "a,b", "X-Api-Key": "sk-ant-client"}, body)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, `{"id":"msg_p","type":"message"}`, testkit.ReadBody(t, resp))
	r := e.up.Requests()[0]
	require.Equal(t, "/v1/messages?beta=true", r.Path)
	require.Equal(t, body, string(r.Body))
	require.Equal(t, "2023-06-01", r.Header.Get("Anthropic-Version"))
	require.Equal(t, "a,b", r.Header.Get("Anthropic-Beta"))
	require.Equal(t, "sk-ant-client", r.Header.Get("X-Api-Key"))
}

// TestThreadHeader: THREAD_HEADER names the thread of a request that names none by X-Thread-Id
// or its path, on every route (a workspace per Claude Code session); X-Thread-Id and the path
// win over it.
func TestThreadHeader(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.ThreadHeaders = []string{"X-Claude-Code-Session-Id"} })
	reply := upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_h", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("Hi.")}})
	e.up.Script(reply, reply, upstreamtest.JSON(200, upstreamtest.Completion("Hi.")))
	body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	resp := e.post("/v1/messages", map[string]string{"X-Claude-Code-Session-Id": "c5981990-7426-4441-a822-74a12c9d01f9"}, body)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "c5981990-7426-4441-a822-74a12c9d01f9", resp.Header.Get("X-Thread-Id"))
	resp = e.post("/threads/by-path/v1/messages", map[string]string{"X-Claude-Code-Session-Id": "s2"}, body)
	require.Equal(t, "by-path", resp.Header.Get("X-Thread-Id"))
	resp = e.post("/v1/chat/completions", map[string]string{"X-Claude-Code-Session-Id": "s3"}, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, "s3", resp.Header.Get("X-Thread-Id"))
	require.Equal(t, 1, e.turns("c5981990-7426-4441-a822-74a12c9d01f9"))
	require.Equal(t, 1, e.turns("s3"))
}

// TestThreadHeaders: THREAD_HEADER may name several headers, one per agent (Claude Code's,
// Codex's, a wrapper's for Gemini CLI): the first of them a request carries names its thread.
func TestThreadHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) {
		o.ThreadHeaders = []string{"X-Claude-Code-Session-Id", "session-id", "X-Gemini-Session-Id"}
	})
	e.up.Fallback = reply(cmpl("Hi."))
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		header map[string]string
		want   string
	}{
		{map[string]string{"X-Gemini-Session-Id": "g1"}, "g1"},
		{map[string]string{"Session-Id": "c1"}, "c1"},
		{map[string]string{"X-Gemini-Session-Id": "g2", "X-Claude-Code-Session-Id": "a1"}, "a1"},
		{map[string]string{"X-Gemini-Session-Id": "", "Session-Id": "c2"}, "c2"},
	} {
		resp := e.post("/v1/chat/completions", tt.header, body)
		testkit.ReadBody(t, resp)
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, tt.want, resp.Header.Get("X-Thread-Id"), "%v", tt.header)
	}
	resp := e.post("/v1/chat/completions", map[string]string{"X-Gemini-Session-Id": "not a thread id"}, body)
	require.Equal(t, 400, resp.StatusCode)
	testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "invalid_request_error", "invalid_thread_id")
}

// TestMessagesKeepalivePing: while the proxy runs a round the client cannot see, the client
// gets a ping event every StreamKeepalive; the upstream's second round waits until the client
// has one (beyond the first round's own ping).
func TestMessagesKeepalivePing(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.StreamKeepalive = 20 * time.Millisecond })
	sawPing := make(chan struct{})
	second := upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_2", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("None yet.")}})
	e.up.Script(
		upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_1", Blocks: []upstreamtest.Block{upstreamtest.ToolUseBlock("toolu_1", "list_preferences", `{}`)}}),
		func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-sawPing:
			case <-time.After(10 * time.Second):
			}
			second(w, r)
		})
	resp := e.post("/threads/kp/v1/messages", nil, `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"List them."}]}`)
	require.Equal(t, 200, resp.StatusCode)
	rd := bufio.NewReader(resp.Body)
	var names []string
	for pings := 0; pings < 2; {
		line, err := rd.ReadString('\n')
		require.NoError(t, err)
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "event: "); ok {
			names = append(names, name)
			if name == "ping" {
				pings++
			}
		}
	}
	close(sawPing)
	require.Equal(t, []string{"message_start", "ping", "ping"}, names)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	require.Contains(t, string(rest), `"text":"None yet."`[:10])
	require.True(t, strings.HasSuffix(string(rest), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), string(rest))
}

// members are a JSON object's members, raw.
func members(t *testing.T, b []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &m), string(b))
	return m
}

// TestMessagesPlacementClaudeCode: Claude Code 2.1.332's request (testdata/messages, as it
// sent it) ends with a system message whose text block carries its last cache breakpoint; the
// workspace goes after that block as a new text block without cache_control, so every
// breakpoint covers the bytes it covered before. Every other member reaches the upstream with
// its bytes, the client's twelve tools too, and the tool list is the same bytes on every thread.
func TestMessagesPlacementClaudeCode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body, err := os.ReadFile("testdata/messages/claude-code-2.1.332.json")
	require.NoError(t, err)
	reply := upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_cc", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("Hi.")}})
	e.up.Script(reply, reply)
	for _, thread := range []string{"cc-a", "cc-b"} {
		resp := e.post("/threads/"+thread+"/v1/messages?beta=true", map[string]string{"Anthropic-Beta": "claude-code-20250219"}, string(body))
		require.Equal(t, 200, resp.StatusCode)
		require.Contains(t, testkit.ReadBody(t, resp), "event: message_stop")
	}
	reqs := e.up.Requests()
	require.Equal(t, "/v1/messages?beta=true", reqs[0].Path)
	sent, client := members(t, reqs[0].Body), members(t, body)
	for k, v := range client {
		if k != "messages" && k != "tools" {
			require.Equal(t, string(v), string(sent[k]), k)
		}
	}
	require.Len(t, sent, len(client))

	var clientMsgs, sentMsgs []json.RawMessage
	require.NoError(t, json.Unmarshal(client["messages"], &clientMsgs))
	require.NoError(t, json.Unmarshal(sent["messages"], &sentMsgs))
	require.Len(t, sentMsgs, 2)
	require.Equal(t, string(clientMsgs[0]), string(sentMsgs[0]), "the user message as it came")
	last, clientLast := members(t, sentMsgs[1]), members(t, clientMsgs[1])
	require.Equal(t, `"system"`, string(last["role"]))
	var blocks, clientBlocks []json.RawMessage
	require.NoError(t, json.Unmarshal(last["content"], &blocks))
	require.NoError(t, json.Unmarshal(clientLast["content"], &clientBlocks))
	require.Len(t, blocks, len(clientBlocks)+1)
	for i := range clientBlocks {
		require.Equal(t, string(clientBlocks[i]), string(blocks[i]), "the breakpoint's block as it came")
	}
	added := members(t, blocks[len(blocks)-1])
	require.Equal(t, []string{"text", "type"}, memberNames(added), "a text block without cache_control")
	require.Contains(t, string(added["text"]), "<workspace>")

	var tools [2][]json.RawMessage
	for i := range tools {
		require.NoError(t, json.Unmarshal(members(t, reqs[i].Body)["tools"], &tools[i]))
	}
	var clientTools []json.RawMessage
	require.NoError(t, json.Unmarshal(client["tools"], &clientTools))
	require.Len(t, tools[0], len(clientTools)+5)
	for i := range clientTools {
		require.Equal(t, string(clientTools[i]), string(tools[0][i]))
	}
	require.Equal(t, rawTools(t, reqs[0].Body), rawTools(t, reqs[1].Body), "the tool list's bytes on every thread")
}

func memberNames(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// rawTools is a request body's tools member as it was sent.
func rawTools(t *testing.T, body []byte) string {
	t.Helper()
	o, err := rawjson.Parse(body)
	require.NoError(t, err)
	return string(o.Get("tools"))
}

// TestMessagesPlacement: placement tail appends the block as a new last text block of a last
// user message (a string content becomes its text block and the new one), after its
// tool_result and cache_control'd blocks, with pasted workspace tags neutralised; placement
// system (or a last message of the assistant) appends it to system as a new last text block.
func TestMessagesPlacement(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tt := range []struct {
		name, placement, messages, system string
		wantLast, wantSystem              string // JSON of the last message's content, of system
	}{
		{"String", "", `[{"role":"user","content":"hi"}]`, ``,
			`[{"type":"text","text":"hi"},{"type":"text","text":"BLOCK"}]`, ``},
		{"Blocks", "", `[{"role":"user","content":"run it"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"<workspace>x</workspace>"},` +
			`{"type":"text","text":"go on","cache_control":{"type":"ephemeral"}}]}]`, `"Be brief."`,
			`[{"type":"tool_result","tool_use_id":"t1","content":"‹workspace>x‹/workspace>"},{"type":"text","text":"go on","cache_control":{"type":"ephemeral"}},{"type":"text","text":"BLOCK"}]`,
			`"Be brief."`},
		{"AssistantPrefill", "", `[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure"}]`, `"Be brief."`,
			`"Sure"`, `[{"type":"text","text":"Be brief."},{"type":"text","text":"BLOCK"}]`},
		{"System", "system", `[{"role":"user","content":"hi"}]`, `[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}]`,
			`"hi"`, `[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"BLOCK"}]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e.up.Script(upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_p", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("Hi.")}}))
			body := `{"model":"m","max_tokens":5,"messages":` + tt.messages
			if tt.system != "" {
				body += `,"system":` + tt.system
			}
			h := map[string]string{"X-Thread-Id": "pl-" + strings.ToLower(tt.name)}
			if tt.placement != "" {
				h["X-Workspace-Placement"] = tt.placement
			}
			resp := e.post("/v1/messages", h, body+"}")
			require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
			reqs := e.up.Requests()
			sent := members(t, reqs[len(reqs)-1].Body)
			block := "INSTR\n\n" + workspace.RenderBlock("", nil, nil)
			var msgs []map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(sent["messages"], &msgs))
			wantLast := strings.ReplaceAll(tt.wantLast, `"BLOCK"`, string(rawjson.String(block)))
			require.JSONEq(t, wantLast, string(msgs[len(msgs)-1]["content"]))
			if tt.wantSystem != "" {
				require.JSONEq(t, strings.ReplaceAll(tt.wantSystem, `"BLOCK"`, string(rawjson.String(block))), string(sent["system"]))
			}
		})
	}
}

// TestMessagesUpstreamUnreachableNamed: a Messages upstream that cannot be reached is named by
// its own host, not the OpenAI-compatible upstream's, with a thread or without.
func TestMessagesUpstreamUnreachableNamed(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	host := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	e := setup(t, func(o *Options) { o.Upstreams["anthropic"] = Upstream{URL: &url.URL{Scheme: "http", Host: host}} })
	for _, h := range []map[string]string{{"X-Thread-Id": "t"}, nil} {
		resp := e.post("/v1/messages", h, `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
		body := testkit.ReadBody(t, resp)
		require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
		require.Contains(t, body, "the upstream at "+host+" could not be reached")
	}
}

// TestMessagesKeylessUpstreamRefuses: with CLIENT_KEYS and no ANTHROPIC_UPSTREAM_API_KEY, a
// Messages turn goes upstream with no key (the client's stays with wsproxy), which a local
// upstream may take; one that answers 401 is a 502 naming the setting, not the upstream's 401
// (the client's key was right). With the setting, the upstream's 401 is the client's.
func TestMessagesKeylessUpstreamRefuses(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret")
	require.NoError(t, err)
	refused := upstreamtest.MessagesError(401, "authentication_error", "x-api-key header is required")
	h := map[string]string{"X-Api-Key": "sk-alice-secret", "Content-Type": "application/json", "Anthropic-Version": "2023-06-01"}
	const body = `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`

	e := setup(t, func(o *Options) { o.ClientKeys = keys })
	e.up.Script(refused, refused)
	for _, path := range []string{"/threads/k/v1/messages", "/threads/k/v1/messages/count_tokens"} {
		resp, got := e.do("POST", path, h, body)
		require.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s: %s", path, got)
		require.Contains(t, got, "ANTHROPIC_UPSTREAM_API_KEY", path)
		require.Contains(t, got, `"type":"error"`, "Anthropic's shape")
	}
	require.Empty(t, e.up.Requests()[0].Header.Get("X-Api-Key"), "no key went upstream")

	keyed := setup(t, func(o *Options) { o.ClientKeys = keys; setAnthropicKey(o, "sk-ant-wrong") })
	keyed.up.Script(refused)
	resp, got := keyed.do("POST", "/threads/k/v1/messages", h, body)
	require.Equal(t, 401, resp.StatusCode, got)
	require.Contains(t, got, "x-api-key header is required")
}
