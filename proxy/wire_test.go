package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// The wire-fidelity regressions (docs/spec.md §16): each is a real server's output that a thread
// turn refused or changed.

// TestNullWhereAnArrayWas: SGLang (and DeepSeek on Azure AI Foundry) send "tool_calls": null,
// "role": null and "reasoning_content": null in every delta and "prompt_tokens_details": null in
// usage. The turn is read as a client reads it straight.
func TestNullWhereAnArrayWas(t *testing.T) {
	t.Parallel()
	e := setup(t)
	chunk := func(delta, finish string) string {
		return `{"id":"cc6f1b","object":"chat.completion.chunk","created":1760000000,"model":"qwen3","choices":[{"index":0,"delta":` + delta +
			`,"logprobs":null,"finish_reason":` + finish + `,"matched_stop":null}],"usage":null}`
	}
	e.up.Script(upstreamtest.Stream(
		chunk(`{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null}`, "null"),
		chunk(`{"role":null,"content":"Hello","reasoning_content":null,"tool_calls":null}`, "null"),
		chunk(`{"role":null,"content":" there","reasoning_content":null,"tool_calls":null}`, "null"),
		chunk(`{"role":null,"content":null,"reasoning_content":null,"tool_calls":null}`, `"stop"`),
		`{"id":"cc6f1b","object":"chat.completion.chunk","created":1760000000,"model":"qwen3","choices":[],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3,"prompt_tokens_details":null,"reasoning_tokens":0}}`,
	))
	client := e.officialClient("sg")
	stream := client.Chat.Completions.NewStreaming(context.Background(), openaigo.ChatCompletionNewParams{
		Model:         "qwen3",
		Messages:      []openaigo.ChatCompletionMessageParamUnion{openaigo.UserMessage("hi")},
		StreamOptions: openaigo.ChatCompletionStreamOptionsParam{IncludeUsage: openaigo.Bool(true)},
	})
	acc := openaigo.ChatCompletionAccumulator{}
	var usage string
	for stream.Next() {
		acc.AddChunk(stream.Current())
		if u := stream.Current().Usage.RawJSON(); u != "" && u != "null" {
			usage = u
		}
	}
	require.NoError(t, stream.Err())
	require.Equal(t, "Hello there", acc.Choices[0].Message.Content)
	require.Equal(t, "stop", acc.Choices[0].FinishReason)
	require.Equal(t, int64(12), acc.Usage.PromptTokens)
	require.Equal(t, `{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3,"prompt_tokens_details":null,"reasoning_tokens":0}`, usage,
		"a one-round turn's usage as the upstream sent it")
}

// TestUnknownOutputItems: OpenAI's tool_search_call / tool_search_output items (whose arguments
// are an object) reach the client, streamed and not, like any item type the proxy does not know.
func TestUnknownOutputItems(t *testing.T) {
	t.Parallel()
	items := `[{"id":"ts_1","type":"tool_search_call","status":"completed","arguments":{"query":"weather tools"},"call_id":null,"execution":"server"},` +
		`{"id":"tso_1","type":"tool_search_output","status":"completed","call_id":null,"execution":"server","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]},` +
		`{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Sunny.","annotations":[],"logprobs":[]}]}]`
	response := `{"id":"resp_ts","object":"response","created_at":1760000000,"status":"completed","model":"gpt-5.4","output":` + items +
		`,"store":true,"usage":{"input_tokens":20,"input_tokens_details":{"cached_tokens":0},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":24}}`

	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(reply(response))
		resp := e.post("/v1/responses", map[string]string{"X-Thread-Id": "ts"}, `{"model":"gpt-5.4","input":"weather?"}`)
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, response, testkit.ReadBody(t, resp), "one round without workspace calls: the body as it came")
	})
	t.Run("SSE", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		var list []json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(items), &list))
		created := strings.Replace(strings.Replace(response, `"status":"completed"`, `"status":"in_progress"`, 1), `"output":`+items, `"output":[]`, 1)
		ev := []string{`{"type":"response.created","sequence_number":0,"response":` + created + `}`}
		for i, it := range list {
			ev = append(ev, `{"type":"response.output_item.added","sequence_number":`+strconv.Itoa(len(ev))+`,"output_index":`+strconv.Itoa(i)+`,"item":`+string(it)+`}`,
				`{"type":"response.output_item.done","sequence_number":`+strconv.Itoa(len(ev)+1)+`,"output_index":`+strconv.Itoa(i)+`,"item":`+string(it)+`}`)
		}
		ev = append(ev, `{"type":"response.completed","sequence_number":`+strconv.Itoa(len(ev))+`,"response":`+response+`}`)
		e.up.Script(upstreamtest.StreamRaw(responsesEvents(ev...)))
		client := e.officialClient("ts")
		stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
			Model: "gpt-5.4", Input: responses.ResponseNewParamsInputUnion{OfString: openaigo.String("weather?")},
		})
		var types []string
		var final responses.Response
		for stream.Next() {
			ev := stream.Current()
			types = append(types, ev.Type)
			if ev.Type == "response.completed" {
				final = ev.Response
			}
		}
		require.NoError(t, stream.Err())
		require.Equal(t, []string{"response.created", "response.output_item.added", "response.output_item.done", "response.output_item.added",
			"response.output_item.done", "response.output_item.added", "response.output_item.done", "response.completed"}, types)
		require.Len(t, final.Output, 3)
		require.Equal(t, "tool_search_call", final.Output[0].Type)
		require.JSONEq(t, string(list[0]), final.Output[0].RawJSON())
	})
}

// TestEmptyNameContinuation: a continuation delta that names nothing ("name":"", "id":"", as
// GLM models behind OpenAI-compatible servers send it) belongs to the call of its index; a
// workspace call's arguments never reach the client.
func TestEmptyNameContinuation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	chunk := func(delta, finish string) string {
		return `{"id":"chatcmpl-glm","object":"chat.completion.chunk","created":1760000000,"model":"glm-4.6","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
	}
	e.up.Script(
		upstreamtest.Stream(
			chunk(`{"role":"assistant","content":"Noting. "}`, "null"),
			chunk(`{"content":"\n","tool_calls":[{"index":0,"id":"call_glm1","type":"function","function":{"name":"add_preferences","arguments":""}}]}`, "null"),
			chunk(`{"content":"\n","tool_calls":[{"index":0,"id":"","type":"function","function":{"name":"","arguments":"{\"items\":[{\"title\":\"Tabs\"}]}"}}]}`, "null"),
			chunk(`{"role":"assistant","content":""}`, `"tool_calls"`),
		),
		upstreamtest.Stream(upstreamtest.ContentChunks("chatcmpl-glm2", "Done.")...),
	)
	body := streamBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "glm"},
		`{"model":"glm-4.6","stream":true,"messages":[{"role":"user","content":"I prefer tabs."}]}`))
	tr := checkStream(t, body)
	require.Empty(t, tr.calls, "nothing of the workspace call reaches the client: %s", body)
	require.NotContains(t, body, "Tabs")
	require.Equal(t, "Noting. \n\nDone.", tr.content)
	require.Equal(t, "Tabs", e.workspace("glm").Preferences[0].Title)
}

// TestResponsesErrorEventForwarded: OpenAI's failing stream sends `error`, then
// `response.failed`; the client gets both, as it would straight.
func TestResponsesErrorEventForwarded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	created := `{"id":"resp_q","object":"response","created_at":1760000000,"status":"in_progress","model":"gpt-5.4","output":[],"error":null}`
	failed := `{"id":"resp_q","object":"response","created_at":1760000000,"status":"failed","model":"gpt-5.4","output":[],` +
		`"error":{"code":"insufficient_quota","message":"You exceeded your current quota."}}`
	e.up.Script(upstreamtest.StreamRaw(responsesEvents(
		`{"type":"response.created","sequence_number":0,"response":`+created+`}`,
		`{"type":"response.in_progress","sequence_number":1,"response":`+created+`}`,
		`{"type":"error","sequence_number":2,"code":"insufficient_quota","message":"You exceeded your current quota.","param":null}`,
		`{"type":"response.failed","sequence_number":3,"response":`+failed+`}`,
	)))
	client := e.officialClient("q")
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
		Model: "gpt-5.4", Input: responses.ResponseNewParamsInputUnion{OfString: openaigo.String("hi")},
	})
	var types []string
	var errEvent responses.ResponseStreamEventUnion
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		if ev.Type == "error" {
			errEvent = ev
		}
	}
	require.NoError(t, stream.Err())
	require.Equal(t, []string{"response.created", "response.in_progress", "error", "response.failed"}, types)
	require.Equal(t, "insufficient_quota", errEvent.Code)
	require.Equal(t, "You exceeded your current quota.", errEvent.Message)
}

// responsesEvents renders Responses API events as OpenAI sends them: `event:` and `data:` lines.
func responsesEvents(data ...string) []string {
	out := make([]string, len(data))
	for i, d := range data {
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal([]byte(d), &ev)
		out[i] = "event: " + ev.Type + "\ndata: " + d + "\n\n"
	}
	return out
}

// TestTwoWholeCallsInOneChunk: two entries of one chunk's tool_calls with neither index nor id
// are two calls (a name begins a call), not one call named get_weatherget_time.
func TestTwoWholeCallsInOneChunk(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(upstreamtest.Stream(
		upstreamtest.Chunk("chatcmpl-w", `{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},`+
			`{"type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]}`, "tool_calls")))
	tr := checkStream(t, streamBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "w2"},
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"tools":[`+
			`{"type":"function","function":{"name":"get_weather"}},{"type":"function","function":{"name":"get_time"}}]}`)))
	require.Equal(t, map[int]map[string]string{
		0: {"name": "get_weather", "arguments": `{"city":"Paris"}`},
		1: {"name": "get_time", "arguments": `{"tz":"CET"}`},
	}, tr.calls)
	require.Equal(t, "tool_calls", tr.finish)
}

// TestClientCallIDAfterItsName: a client call whose id comes after its name gets the
// upstream's id alone, never one made up first.
func TestClientCallIDAfterItsName(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(upstreamtest.Stream(
		upstreamtest.Chunk("chatcmpl-i", `{"role":"assistant","tool_calls":[{"index":0,"type":"function","function":{"name":"get_weather","arguments":""}}]}`, ""),
		upstreamtest.Chunk("chatcmpl-i", `{"tool_calls":[{"index":0,"id":"call_late","function":{"arguments":"{}"}}]}`, ""),
		upstreamtest.Chunk("chatcmpl-i", `{}`, "tool_calls")))
	body := streamBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "late"},
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"tools":`+weatherTool+`}`))
	tr := checkStream(t, body)
	require.Equal(t, "call_late", tr.calls[0]["id"])
	require.Equal(t, 1, strings.Count(body, `"id":"call_`), "one id, the upstream's: %s", body)
}

// TestResponsesCallNamedOnlyWhenDone: a function call whose name comes only in its
// output_item.done is held until then: the client's call reaches the client with all of its
// events, the workspace's is run and hidden.
func TestResponsesCallNamedOnlyWhenDone(t *testing.T) {
	t.Parallel()
	events := func(name string) []string {
		added := `{"id":"fc_1","type":"function_call","status":"in_progress","call_id":"call_1","name":"","arguments":""}`
		done := `{"id":"fc_1","type":"function_call","status":"completed","call_id":"call_1","name":"` + name + `","arguments":"{}"}`
		created := `{"id":"resp_n","object":"response","created_at":1,"status":"in_progress","model":"m","output":[],"store":false}`
		final := `{"id":"resp_n","object":"response","created_at":1,"status":"completed","model":"m","output":[` + done + `],"store":false,` +
			`"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}`
		return responsesEvents(
			`{"type":"response.created","sequence_number":0,"response":`+created+`}`,
			`{"type":"response.in_progress","sequence_number":1,"response":`+created+`}`,
			`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":`+added+`}`,
			`{"type":"response.function_call_arguments.delta","sequence_number":3,"item_id":"fc_1","output_index":0,"delta":"{}"}`,
			`{"type":"response.function_call_arguments.done","sequence_number":4,"item_id":"fc_1","output_index":0,"arguments":"{}"}`,
			`{"type":"response.output_item.done","sequence_number":5,"output_index":0,"item":`+done+`}`,
			`{"type":"response.completed","sequence_number":6,"response":`+final+`}`)
	}
	t.Run("TheClients", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.StreamRaw(events("get_weather")))
		resp := e.post("/v1/responses", map[string]string{"X-Thread-Id": "nd"},
			`{"model":"m","input":"x","stream":true,"tools":[{"type":"function","name":"get_weather"}]}`)
		got := readResponsesStream(t, resp.Body)
		var types []string
		for _, ev := range got {
			types = append(types, ev.name)
		}
		require.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added", "response.function_call_arguments.delta",
			"response.function_call_arguments.done", "response.output_item.done", "response.completed"}, types)
	})
	t.Run("TheWorkspaces", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.StreamRaw(events("list_preferences")), rspec{ID: "r2", Flavor: upstreamtest.VLLM, Items: []upstreamtest.Item{msgItem("m", "None yet.")}}.Stream())
		resp := e.post("/v1/responses", map[string]string{"X-Thread-Id": "nd"}, `{"model":"m","input":"x","stream":true}`)
		got := readResponsesStream(t, resp.Body)
		noWorkspaceEvents(t, got)
		require.Len(t, e.toolCalls("nd"), 1)
	})
}

// TestResponsesStoreOmitted: a Responses server whose response does not say "store": true is
// not taken to have stored it: the next round resends everything instead of naming a response
// the server may not know.
func TestResponsesStoreOmitted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	call := `{"id":"resp_s1","object":"response","status":"completed","model":"m","output":[` +
		`{"id":"fc_1","type":"function_call","status":"completed","call_id":"call_1","name":"list_preferences","arguments":"{}"}]}`
	e.up.Script(reply(call), reply(`{"id":"resp_s2","object":"response","status":"completed","model":"m","output":[`+
		`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"output_text","text":"None."}]}]}`))
	resp := e.post("/v1/responses", map[string]string{"X-Thread-Id": "so"}, `{"model":"m","input":"what do I prefer?"}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	round2 := e.upstreamRequest(1)
	require.NotContains(t, round2, "previous_response_id")
	require.Len(t, round2["input"], 3, "the user's message, the call and its output")
}

// TestLaterNullUsageDetail: a later round's null usage detail leaves the earlier rounds' sum of
// it as it was; every member of every round is kept, in the last round's order.
func TestLaterNullUsageDetail(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(
		reply(`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[`+
			`{"id":"a","type":"function","function":{"name":"list_preferences","arguments":"{}"}}]},"finish_reason":"tool_calls"}],`+
			`"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4},"queue_time":0.25}}`),
		reply(`{"id":"c2","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
			`"usage":{"total_tokens":23,"prompt_tokens":20,"completion_tokens":3,"prompt_tokens_details":null,"x_vendor":"v2"}}`))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "nu"}, `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	var got struct {
		Usage json.RawMessage `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(testkit.ReadBody(t, resp)), &got))
	require.Equal(t, `{"total_tokens":35,"prompt_tokens":30,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4},"x_vendor":"v2","queue_time":0.25}`,
		string(got.Usage))
}

// TestHostileUsageSaturates: usage counts past the int64 bounds saturate, in the client's sum
// and in the thread's totals.
func TestHostileUsageSaturates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	huge := `"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":1e308,"total_tokens":9223372036854775807}`
	e.up.Script(
		reply(`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[`+
			`{"id":"a","type":"function","function":{"name":"list_preferences","arguments":"{}"}}]},"finish_reason":"tool_calls"}],`+huge+`}`),
		reply(`{"id":"c2","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+huge+`}`))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "hu"}, `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	var got struct {
		Usage json.RawMessage `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(testkit.ReadBody(t, resp)), &got))
	require.Equal(t, `{"prompt_tokens":9223372036854775807,"completion_tokens":1.7976931348623157e+308,"total_tokens":9223372036854775807}`, string(got.Usage))
	require.Eventually(t, func() bool { return e.workspace("hu").Usage.PromptTokens == 9223372036854775807 }, 10*time.Second, 20*time.Millisecond)
}

// TestKeepaliveDuringAHiddenRound: while the proxy runs a round the client cannot see, the
// client gets a keepalive comment every StreamKeepalive; the upstream's second round waits
// until the client has one.
func TestKeepaliveDuringAHiddenRound(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.StreamKeepalive = 20 * time.Millisecond })
	sawKeepalive := make(chan struct{})
	e.up.Script(
		upstreamtest.Stream(upstreamtest.ToolCallChunks("chatcmpl-k", 100, call{ID: "a", Name: "list_preferences", Arguments: `{}`})...),
		func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-sawKeepalive:
			case <-time.After(10 * time.Second):
			}
			upstreamtest.Stream(upstreamtest.ContentChunks("chatcmpl-k2", "None yet.")...)(w, r)
		})
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "ka"}, `{"model":"m","stream":true,"messages":[]}`)
	require.Equal(t, 200, resp.StatusCode)
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, ": keepalive\n", line, "the first bytes are a keepalive, before any content")
	close(sawKeepalive)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	tr := checkStream(t, strings.ReplaceAll(string(rest), ": keepalive\n\n", "")[1:])
	require.Equal(t, "None yet.", tr.content)
}

// TestNoKeepaliveBeforeTheUpstreamAnswers: before the upstream's first answer the client waits
// as it would straight, so an upstream's error status still reaches it as a status.
func TestNoKeepaliveBeforeTheUpstreamAnswers(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.StreamKeepalive = 10 * time.Millisecond })
	e.up.Script(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		upstreamtest.JSON(429, `{"error":{"message":"slow down"}}`)(w, r)
	})
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "nk"}, `{"model":"m","stream":true,"messages":[]}`)
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, `{"error":{"message":"slow down"}}`, testkit.ReadBody(t, resp))
}

// TestChatErrorEventFirst: a chat stream that fails with its first event reaches the client as
// that stream: status 200 and the upstream's error event as it was sent.
func TestChatErrorEventFirst(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(upstreamtest.StreamRaw([]string{"data: {\"error\":{\"message\":\"model overloaded\",\"type\":\"server_error\",\"code\":503}}\n\n"}))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "ef"}, `{"model":"m","stream":true,"messages":[]}`)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "data: {\"error\":{\"message\":\"model overloaded\",\"type\":\"server_error\",\"code\":503}}\n\n", testkit.ReadBody(t, resp))
}

// wrapperArgs are the arguments of OpenAI's parallel wrapper calling recipients (name, parameters JSON).
func wrapperArgs(recipients ...[2]string) string {
	var uses []string
	for _, r := range recipients {
		uses = append(uses, `{"recipient_name":"functions.`+r[0]+`","parameters":`+r[1]+`}`)
	}
	return `{"tool_uses":[` + strings.Join(uses, ",") + `]}`
}

// TestParallelWrapper: a multi_tool_use.parallel call naming workspace tools is run as the
// calls it holds; the client's calls in it reach the client as calls of their own.
func TestParallelWrapper(t *testing.T) {
	t.Parallel()
	add := [2]string{"add_preferences", `{"items":[{"title":"Celsius"}],"action_and_reasoning":"unit"}`}
	weather := [2]string{"get_weather", `{"city":"Paris"}`}
	t.Run("WorkspaceOnly", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(reply(cmpl("", call{ID: "w", Name: "multi_tool_use.parallel", Arguments: wrapperArgs(add,
			[2]string{"set_objective", `{"text":"Know the weather"}`})})), reply(cmpl("Noted.")))
		resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "pw"}, `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
		require.Contains(t, testkit.ReadBody(t, resp), "Noted.")
		d := e.workspace("pw")
		require.Equal(t, "Celsius", d.Preferences[0].Title)
		require.Equal(t, "Know the weather", d.Objective.Text)
		msgs := messages(e.upstreamRequest(1))
		tcs := msgs[len(msgs)-3]["tool_calls"].([]any)
		require.Len(t, tcs, 2, "the round sent back holds the calls the wrapper held")
		require.Equal(t, "w_1", tcs[0].(map[string]any)["id"])
		require.Equal(t, "w_2", msgs[len(msgs)-1]["tool_call_id"])
	})
	t.Run("MixedStreamed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.Stream(upstreamtest.ToolCallChunks("chatcmpl-p", 9, call{ID: "w", Name: "multi_tool_use.parallel", Arguments: wrapperArgs(add, weather)})...))
		tr := checkStream(t, streamBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "pm"},
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"tools":`+weatherTool+`}`)))
		require.Equal(t, map[int]map[string]string{0: {"id": "w_2", "name": "get_weather", "arguments": `{"city":"Paris"}`}}, tr.calls)
		require.Equal(t, "tool_calls", tr.finish)
		require.Equal(t, "Celsius", e.workspace("pm").Preferences[0].Title)
	})
	t.Run("ClientsOnlyAsTheModelMadeIt", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		body := cmpl("", call{ID: "w", Name: "multi_tool_use.parallel", Arguments: wrapperArgs(weather)})
		e.up.Script(reply(body))
		resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "pc"}, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":`+weatherTool+`}`)
		require.Equal(t, body, testkit.ReadBody(t, resp))
	})
	t.Run("ResponsesOneOutput", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(rspec{ID: "r1", Flavor: upstreamtest.VLLM, Items: []upstreamtest.Item{callItem("f", "c", "multi_tool_use.parallel", wrapperArgs(add))}}.Reply(),
			rspec{ID: "r2", Flavor: upstreamtest.VLLM, Items: []upstreamtest.Item{msgItem("m", "Noted.")}}.Reply())
		resp := e.post("/v1/responses", map[string]string{"X-Thread-Id": "pr"}, `{"model":"m","input":"x"}`)
		require.Contains(t, testkit.ReadBody(t, resp), "Noted.")
		input := e.upstreamRequest(1)["input"].([]any)
		out := input[len(input)-1].(map[string]any)
		require.Equal(t, "c", out["call_id"])
		require.JSONEq(t, `[{"recipient_name":"functions.add_preferences","output":{"ok":true,"result":"recorded 1 preference"}}]`, out["output"].(string))
		require.Equal(t, "Celsius", e.workspace("pr").Preferences[0].Title)
	})
}

// TestRoundTextCapNonStreamed: a non-streamed round's content over the cap is sent back cut to
// it, as a streamed round's is; the client gets the answer whole.
func TestRoundTextCapNonStreamed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const maxRoundText = 1 << 20              // docs/spec.md §7: 1 MiB
	long := strings.Repeat("é", maxRoundText) // 2 bytes each: twice the cap
	e.up.Script(reply(cmpl(long, call{ID: "a", Name: "list_preferences", Arguments: `{}`})), reply(cmpl("ok")))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "cap"}, `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	require.Contains(t, testkit.ReadBody(t, resp), `"ok"`)
	msgs := messages(e.upstreamRequest(1))
	sent := msgs[len(msgs)-2]["content"].(string)
	require.Equal(t, maxRoundText, len(sent))
	require.True(t, strings.HasPrefix(long, sent))
}

// TestUsageTheClientDidNotAskFor: the proxy asks a streamed turn's upstream for its usage (to
// count the turn); a client that did not ask gets none of it, wherever the upstream put it.
func TestUsageTheClientDidNotAskFor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	finish := `{"id":"c-u","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	e.up.Script(upstreamtest.Stream(append(upstreamtest.ContentChunks("c-u", "Hi")[:2], finish, upstreamtest.UsageChunk("c-u", 3, 1))...))
	body := streamBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "nu"}, `{"model":"m","stream":true,"messages":[]}`))
	tr := checkStream(t, body)
	require.Nil(t, tr.usage)
	require.NotContains(t, body, `"usage":{`)
	require.Equal(t, "Hi", tr.content)
	require.Eventually(t, func() bool { return e.workspace("nu").Usage.PromptTokens == 3 }, 10*time.Second, 20*time.Millisecond, "the turn is counted")
}
