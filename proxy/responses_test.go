package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

type rspec = upstreamtest.ResponseSpec

var (
	msgItem  = upstreamtest.Message
	callItem = upstreamtest.FunctionCall
	rsItem   = upstreamtest.Reasoning
)

// weatherFunction is a client function tool in the Responses shape.
func weatherFunction() responses.ToolUnionParam {
	return responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
		Name: "get_weather", Strict: openaigo.Bool(false),
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
	}}
}

// sseEvent is one event of a Responses stream as the client got it.
type sseEvent struct {
	name string
	data map[string]any
	raw  string
}

// readResponsesStream reads a Responses stream to its end and checks what every stream must
// be (docs/spec.md §12): each event named as its type, sequence numbers 0.. without a gap, one
// response.created and one response.in_progress first, one terminal event last with the
// created id, and no [DONE].
func readResponsesStream(t *testing.T, body io.Reader) []sseEvent {
	t.Helper()
	var events []sseEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<20)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			raw := strings.TrimPrefix(line, "data: ")
			require.NotEqual(t, "[DONE]", raw)
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(raw), &m), raw)
			require.Equal(t, name, m["type"], "the event line names the event's type")
			events = append(events, sseEvent{name: name, data: m, raw: raw})
			name = ""
		}
	}
	require.NoError(t, sc.Err())
	require.GreaterOrEqual(t, len(events), 3)
	require.Equal(t, "response.created", events[0].name)
	require.Equal(t, "response.in_progress", events[1].name)
	id := events[0].data["response"].(map[string]any)["id"]
	for i, ev := range events {
		require.EqualValues(t, i, ev.data["sequence_number"], "sequence numbers without a gap")
		if i >= 2 {
			require.NotContains(t, []string{"response.created", "response.in_progress"}, ev.name, "one created/in_progress pair")
		}
		if r, ok := ev.data["response"].(map[string]any); ok {
			require.Equal(t, id, r["id"], "every response of the stream carries the turn's id")
		}
	}
	last := events[len(events)-1].name
	require.Contains(t, []string{"response.completed", "response.incomplete", "response.failed"}, last)
	return events
}

// noWorkspaceEvents checks that no event of the stream shows a workspace call, and that every
// output_index names an item the client was told of.
func noWorkspaceEvents(t *testing.T, events []sseEvent) {
	t.Helper()
	added := map[float64]bool{}
	for _, ev := range events {
		for _, name := range tools.Names {
			require.NotContains(t, ev.raw, `"name":"`+name+`"`, "a workspace call reached the client: %s", ev.raw)
		}
		if ev.name == "response.output_item.added" {
			idx := ev.data["output_index"].(float64)
			require.False(t, added[idx])
			require.EqualValues(t, len(added), idx, "output indices count from 0 without a gap")
			added[idx] = true
		} else if idx, ok := ev.data["output_index"].(float64); ok {
			require.True(t, added[idx], "%s names output_index %v before its item", ev.name, idx)
		}
	}
}

// TestResponsesWorkspaceTurn: a turn whose model calls a workspace tool and then answers, on
// OpenAI (stored: the second round continues the first by previous_response_id) and on
// Ollama and vLLM (not stored: the second round resends everything), streamed and not, through the
// official openai-go client. The client sees one response with the first round's id, the
// reasoning and text of both rounds, no workspace call, and the usage of both.
func TestResponsesWorkspaceTurn(t *testing.T) {
	t.Parallel()
	for _, flavor := range []string{upstreamtest.OpenAI, upstreamtest.Ollama, upstreamtest.VLLM} {
		for _, streamed := range []bool{false, true} {
			name := flavor + map[bool]string{false: "JSON", true: "SSE"}[streamed]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				add := args(map[string]any{"items": []map[string]any{{"title": "Trains only", "kind": "hard"}}, "action_and_reasoning": "The user stated a constraint."})
				r1 := rspec{ID: "resp_1", Flavor: flavor, Items: []upstreamtest.Item{
					rsItem("rs_1", "The user wants trains."), msgItem("msg_1", "Noted."), callItem("fc_1", "call_1", "add_preferences", add)}}
				r2 := rspec{ID: "resp_2", Flavor: flavor, Items: []upstreamtest.Item{msgItem("msg_2", "Lisbon by train: take the night train.")}, Input: 30, Cached: 20, Output: 8}
				if streamed {
					e.up.Script(r1.Stream(), r2.Stream())
				} else {
					e.up.Script(r1.Reply(), r2.Reply())
				}
				client := e.officialClient("trip")
				params := responses.ResponseNewParams{
					Model: "gpt-test",
					Input: responses.ResponseNewParamsInputUnion{OfString: openaigo.String("Plan a trip to Lisbon, trains only.")},
					Tools: []responses.ToolUnionParam{weatherFunction()},
				}
				var resp *responses.Response
				if streamed {
					stream := client.Responses.NewStreaming(context.Background(), params)
					var acc responses.ResponseAccumulator
					var text strings.Builder
					for stream.Next() {
						ev := stream.Current()
						if ev.Type == "response.output_text.delta" {
							text.WriteString(ev.Delta)
						}
						var wsEvent responses.ResponsesServerEventUnion
						require.NoError(t, json.Unmarshal([]byte(ev.RawJSON()), &wsEvent))
						require.NoError(t, acc.AddEvent(wsEvent), "openai-go's accumulator accepts every event")
						if ev.Type == "response.completed" {
							r := ev.Response
							resp = &r
						}
					}
					require.NoError(t, stream.Err())
					require.Equal(t, "Noted.Lisbon by train: take the night train.", text.String(), "the text of both rounds, live")
					snap := acc.Snapshot()
					require.Equal(t, "response.completed", snap.TerminalEvent)
					require.Equal(t, "Noted.Lisbon by train: take the night train.", snap.OutputText())
					rebuilt, err := acc.ReconstructedResponse()
					require.NoError(t, err)
					require.Equal(t, "resp_1", rebuilt.ID)
				} else {
					var err error
					resp, err = client.Responses.New(context.Background(), params)
					require.NoError(t, err)
				}
				require.NotNil(t, resp)
				require.Equal(t, "resp_1", resp.ID, "the turn's id is its first response's")
				var types []string
				for _, item := range resp.Output {
					types = append(types, item.Type)
				}
				require.Equal(t, []string{"reasoning", "message", "message"}, types, "no workspace call in the output")
				require.Equal(t, "Noted.Lisbon by train: take the night train.", resp.OutputText())
				require.EqualValues(t, 40, resp.Usage.InputTokens, "usage summed over rounds")
				require.EqualValues(t, 22, resp.Usage.InputTokensDetails.CachedTokens)
				require.EqualValues(t, 13, resp.Usage.OutputTokens)

				// The first round: the client's tools then the five, the block in the user's input.
				first := e.upstreamRequest(0)
				var names []string
				for _, tl := range first["tools"].([]any) {
					names = append(names, tl.(map[string]any)["name"].(string))
				}
				require.Equal(t, append([]string{"get_weather"}, tools.Names...), names)
				input := first["input"].([]any)
				require.Len(t, input, 1)
				require.Equal(t, "user", input[0].(map[string]any)["role"])
				content := input[0].(map[string]any)["content"].(string)
				require.True(t, strings.HasPrefix(content, "Plan a trip to Lisbon, trains only.\n\nINSTR\n\n<workspace>"), content)
				require.NotContains(t, first, "instructions")

				// The second round: continued, or everything resent.
				second := e.upstreamRequest(1)
				input2 := second["input"].([]any)
				last := input2[len(input2)-1].(map[string]any)
				require.Equal(t, "function_call_output", last["type"])
				require.Equal(t, "call_1", last["call_id"])
				require.Contains(t, last["output"], `"ok":true`)
				if flavor == upstreamtest.OpenAI {
					require.Equal(t, "resp_1", second["previous_response_id"])
					require.Len(t, input2, 1)
				} else {
					require.NotContains(t, second, "previous_response_id")
					require.Len(t, input2, 5, "the input, the round's three items, the output")
					require.Equal(t, input[0], input2[0], "the first round's input, unchanged")
					var sent map[string]any
					require.NoError(t, json.Unmarshal([]byte(r1.JSON()), &sent))
					require.Equal(t, sent["output"].([]any)[0], input2[1], "reasoning sent back as it came")
					require.Equal(t, "function_call", input2[3].(map[string]any)["type"])
				}

				d := e.workspace("trip")
				require.Equal(t, "Trains only", d.Preferences[0].Title)
				// Metrics as for chat turns, under the route's own label; the thread's usage.
				m := e.proxy.opts.Metrics
				require.Eventually(t, func() bool { // counted once the handler returns, after the client has its answer
					return testutil.ToFloat64(m.httpRequests.WithLabelValues("POST /v1/responses", "200")) == 1
				}, 5*time.Second, 5*time.Millisecond)
				require.Equal(t, 40.0, testutil.ToFloat64(m.tokens.WithLabelValues("prompt", "gpt-test")))
				require.Equal(t, 22.0, testutil.ToFloat64(m.cachedTokens.WithLabelValues("gpt-test")))
				require.Equal(t, 1.0, testutil.ToFloat64(m.toolCalls.WithLabelValues("add_preferences", "ok", "proxy")))
				require.Eventually(t, func() bool { // added in the background once the turn ended
					return e.workspace("trip").Usage == workspace.Usage{PromptTokens: 40, CachedPromptTokens: 22, CompletionTokens: 13}
				}, 5*time.Second, 5*time.Millisecond)
				calls := e.toolCalls("trip")
				require.Equal(t, "call_1", calls[0].CallID)
				require.Equal(t, "The user stated a constraint.", calls[0].ActionAndReasoning)
			})
		}
	}
}

// toolCalls reads a thread's tool-call records, named in its stored form.
func (e *env) toolCalls(thread string) []workspace.ToolCallRecord {
	e.t.Helper()
	id, err := workspace.ParseThreadID(thread)
	require.NoError(e.t, err)
	calls, err := e.store.Workspace(id).ToolCalls(context.Background(), 0, 100)
	require.NoError(e.t, err)
	return calls
}

// TestResponsesMixedTurnContinued: a turn whose second round calls a workspace tool and the
// client's together. The client gets its call only, under the turn's id; it continues from that
// id with its call's output, and the upstream gets the turn's last response as
// previous_response_id and the output of the workspace call it never saw answered first, so it
// never finds a call without its output.
func TestResponsesMixedTurnContinued(t *testing.T) {
	t.Parallel()
	for _, streamed := range []bool{false, true} {
		t.Run(map[bool]string{false: "JSON", true: "SSE"}[streamed], func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			add := args(map[string]any{"items": []map[string]any{{"title": "Celsius"}}, "action_and_reasoning": "r"})
			obj := args(map[string]any{"text": "Pack for Lisbon", "action_and_reasoning": "r"})
			r1 := rspec{ID: "resp_a", Items: []upstreamtest.Item{callItem("fc_a", "call_a", "add_preferences", add)}}
			r2 := rspec{ID: "resp_b", Items: []upstreamtest.Item{msgItem("msg_b", "Checking."), callItem("fc_b", "call_b", "set_objective", obj),
				callItem("fc_w", "call_w", "get_weather", `{"city":"Lisbon"}`)}}
			r3 := rspec{ID: "resp_c", Items: []upstreamtest.Item{msgItem("msg_c", "Pack a light jacket.")}}
			reply := func(s rspec) upstreamtest.Reply {
				if streamed {
					return s.Stream()
				}
				return s.Reply()
			}
			e.up.Script(reply(r1), reply(r2), reply(r3))
			tool := `[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":false}]`
			body := `{"model":"gpt-test","stream":` + map[bool]string{false: "false", true: "true"}[streamed] +
				`,"input":[{"role":"user","content":[{"type":"input_text","text":"What should I pack?"}]}],"tools":` + tool + `,"metadata":{"k":"v"},"top_k":5}`
			resp := e.post("/threads/trip/v1/responses", nil, body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			var out map[string]any
			if streamed {
				require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
				events := readResponsesStream(t, resp.Body)
				noWorkspaceEvents(t, events)
				var args []string
				for _, ev := range events {
					if ev.name == "response.function_call_arguments.done" {
						args = append(args, ev.data["arguments"].(string))
					}
				}
				require.Equal(t, []string{`{"city":"Lisbon"}`}, args, "the client's call streams as it came")
				out = events[len(events)-1].data["response"].(map[string]any)
			} else {
				require.Equal(t, "2", resp.Header.Get("X-Workspace-Rounds"))
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
			}
			require.Equal(t, "resp_a", out["id"])
			output := out["output"].([]any)
			require.Len(t, output, 2, "the message and the client's call")
			require.Equal(t, "message", output[0].(map[string]any)["type"])
			require.Equal(t, "get_weather", output[1].(map[string]any)["name"])
			require.Equal(t, "call_w", output[1].(map[string]any)["call_id"])
			// Fields the proxy does not own pass through, both ways.
			first := e.upstreamRequest(0)
			require.Equal(t, map[string]any{"k": "v"}, first["metadata"])
			require.EqualValues(t, 5, first["top_k"])
			parts := first["input"].([]any)[0].(map[string]any)["content"].([]any)
			require.Len(t, parts, 2, "the block as a last input_text part")
			require.Equal(t, "input_text", parts[1].(map[string]any)["type"])
			require.Contains(t, parts[1].(map[string]any)["text"], "<workspace>")
			require.Equal(t, "Pack for Lisbon", e.workspace("trip").Objective.Text)

			// The client runs its call and continues from the turn's id.
			cont := `{"model":"gpt-test","stream":` + map[bool]string{false: "false", true: "true"}[streamed] +
				`,"previous_response_id":"resp_a","input":[{"type":"function_call_output","call_id":"call_w","output":"18C, sunny"}],"tools":` + tool + `}`
			resp = e.post("/threads/trip/v1/responses", nil, cont)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			if streamed {
				events := readResponsesStream(t, resp.Body)
				out = events[len(events)-1].data["response"].(map[string]any)
			} else {
				out = nil
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
			}
			up := e.upstreamRequest(2)
			require.Equal(t, "resp_b", up["previous_response_id"], "the turn's last response, not its id")
			require.Equal(t, "resp_c", out["id"])
			require.Equal(t, "resp_a", out["previous_response_id"], "the client sees its own previous_response_id")
			input := up["input"].([]any)
			require.Len(t, input, 2)
			owed := input[0].(map[string]any)
			require.Equal(t, "function_call_output", owed["type"])
			require.Equal(t, "call_b", owed["call_id"], "the workspace call's output the upstream was owed")
			require.Equal(t, `{"ok":true,"result":"objective set: Pack for Lisbon"}`, owed["output"], "the envelope the call returned")
			theirs := input[1].(map[string]any)
			require.Equal(t, "call_w", theirs["call_id"])
			require.True(t, strings.HasPrefix(theirs["output"].(string), "18C, sunny\n\nINSTR\n\n<workspace>"), "the block after the client's output")

			// Continuing from the second turn's id: it ended on itself, and owes nothing.
			e.up.Script(rspec{ID: "resp_d", Items: []upstreamtest.Item{msgItem("m", "ok")}}.Reply())
			resp = e.post("/threads/trip/v1/responses", nil, `{"model":"gpt-test","previous_response_id":"resp_c","input":"thanks"}`)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			up = e.upstreamRequest(3)
			require.Equal(t, "resp_c", up["previous_response_id"])
			require.Len(t, up["input"], 1)
		})
	}
}

// TestResponsesMaxToolRounds: after MAX_TOOL_ROUNDS tool rounds, the last round goes without the
// workspace tools (and without tools at all when the client had none, tool_choice dropped with
// them), and a workspace call the model still makes there is neither run nor shown.
func TestResponsesMaxToolRounds(t *testing.T) {
	t.Parallel()
	for _, streamed := range []bool{false, true} {
		t.Run(map[bool]string{false: "JSON", true: "SSE"}[streamed], func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(o *Options) { o.MaxToolRounds = 1 })
			list := func(id string) upstreamtest.Item { return callItem("fc_"+id, "call_"+id, "list_preferences", `{}`) }
			r1 := rspec{ID: "r1", Flavor: upstreamtest.VLLM, Items: []upstreamtest.Item{list("1")}}
			r2 := rspec{ID: "r2", Flavor: upstreamtest.VLLM, Items: []upstreamtest.Item{rsItem("rs", "hm"), msgItem("m", "Enough."), list("2")}}
			body := `{"model":"m","input":"go","tool_choice":"auto","store":false}`
			var out responses.Response
			if streamed {
				e.up.Script(r1.Stream(), r2.Stream())
				resp := e.post("/threads/loop/v1/responses", nil, strings.Replace(body, `"store"`, `"stream":true,"store"`, 1))
				require.Equal(t, http.StatusOK, resp.StatusCode)
				events := readResponsesStream(t, resp.Body)
				noWorkspaceEvents(t, events)
				require.NoError(t, json.Unmarshal([]byte(events[len(events)-1].raw), &struct {
					Response *responses.Response `json:"response"`
				}{&out}))
			} else {
				e.up.Script(r1.Reply(), r2.Reply())
				resp := e.post("/threads/loop/v1/responses", nil, body)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, "2", resp.Header.Get("X-Workspace-Rounds"))
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
			}
			require.Equal(t, "r1", out.ID)
			require.Equal(t, "Enough.", out.OutputText())
			require.Len(t, out.Output, 2, "the reasoning and the message, not the unoffered call")
			last := e.upstreamRequest(1)
			require.NotContains(t, last, "tools")
			require.NotContains(t, last, "tool_choice")
			require.Len(t, e.toolCalls("loop"), 1, "the last round's call is not run")
		})
	}
}

// TestResponsesUpstreamErrorInRound2: an upstream error after a tool round reaches the client as
// the upstream sent it (before the first byte) or as a response.failed with the turn's id (a
// stream that started); what the tools wrote stays written.
func TestResponsesUpstreamErrorInRound2(t *testing.T) {
	t.Parallel()
	add := args(map[string]any{"items": []map[string]any{{"title": "Kept"}}})
	errBody := `{"error":{"message":"bad request in round 2","type":"invalid_request_error","param":null,"code":"bad_thing"}}`
	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(rspec{ID: "r1", Items: []upstreamtest.Item{callItem("f", "c", "add_preferences", add)}}.Reply(), upstreamtest.JSON(400, errBody))
		resp := e.post("/threads/e/v1/responses", nil, `{"model":"m","input":"x"}`)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.JSONEq(t, errBody, testkit.ReadBody(t, resp))
		require.Equal(t, "Kept", e.workspace("e").Preferences[0].Title)
	})
	t.Run("SSE", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(rspec{ID: "r1", Items: []upstreamtest.Item{msgItem("m", "Let me note that."), callItem("f", "c", "add_preferences", add)}}.Stream(),
			upstreamtest.JSON(400, errBody))
		resp := e.post("/threads/e/v1/responses", nil, `{"model":"m","input":"x","stream":true}`)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		events := readResponsesStream(t, resp.Body)
		noWorkspaceEvents(t, events)
		failed := events[len(events)-1]
		require.Equal(t, "response.failed", failed.name)
		r := failed.data["response"].(map[string]any)
		require.Equal(t, "failed", r["status"])
		require.Equal(t, "bad_thing", r["error"].(map[string]any)["code"])
		require.Len(t, r["output"], 1, "what the client was shown: the first round's message")
		require.Equal(t, "Kept", e.workspace("e").Preferences[0].Title)
	})
	t.Run("StreamErrorEvent", func(t *testing.T) {
		t.Parallel()
		e := setup(t, func(o *Options) { o.Retries = -1 }) // else the round, of which nothing was sent, is retried
		e.up.Script(rspec{ID: "r1", Items: []upstreamtest.Item{callItem("f", "c", "add_preferences", add)}}.Stream(),
			upstreamtest.StreamRaw(append(rspec{ID: "r2"}.Events()[:2], "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"overloaded\",\"param\":null,\"sequence_number\":2}\n\n")))
		resp := e.post("/threads/e/v1/responses", nil, `{"model":"m","input":"x","stream":true}`)
		events := readResponsesStream(t, resp.Body)
		r := events[len(events)-1].data["response"].(map[string]any)
		require.Equal(t, "overloaded", r["error"].(map[string]any)["message"])
	})
}

// TestResponsesClientLeavesMidStream: a client that leaves cancels the upstream call.
func TestResponsesClientLeavesMidStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	gone := make(chan struct{})
	events := rspec{ID: "r1", Items: []upstreamtest.Item{msgItem("m", "A long answer that never ends")}}.Events()
	e.up.Script(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		upstreamtest.WriteRaw(w, events[:5]...)
		upstreamtest.Hang(gone)(w, r)
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/threads/gone/v1/responses", strings.NewReader(`{"model":"m","input":"x","stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "event: response.created\n", line)
	cancel()
	<-gone
}

// TestResponsesRequestRules: what a Responses thread turn refuses, how it places the block, and
// the pass-through without a thread.
func TestResponsesRequestRules(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct{ body, code string }{
		{`{"model":"m","input":"x","background":true}`, "unsupported_parameter"},
		{`{"model":"m","input":"x","conversation":"conv_1"}`, "unsupported_parameter"},
		{`{"model":"m","input":"x","tools":[{"type":"function","name":"add_preferences","parameters":{}}]}`, "reserved_tool_name"},
		{`{"model":"m","input":7}`, "invalid_type"},
		{`{"model":"m","input":[1]}`, "invalid_type"},
		{`[1]`, "invalid_json"},
	} {
		resp := e.post("/threads/rules/v1/responses", nil, tc.body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, tc.body)
		var eb struct{ Error apierr.Error }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&eb))
		require.Equal(t, tc.code, eb.Error.Code, tc.body)
	}

	ok := rspec{ID: "r", Items: []upstreamtest.Item{msgItem("m", "ok")}}
	// Placement system: the block goes to instructions, after the client's.
	e.up.Script(ok.Reply())
	resp := e.post("/threads/rules/v1/responses", map[string]string{"X-Workspace-Placement": "system"}, `{"model":"m","instructions":"Be brief.","input":"x"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, ok.JSON(), testkit.ReadBody(t, resp), "one round without workspace calls: the body as it came")
	up := e.upstreamRequest(0)
	require.True(t, strings.HasPrefix(up["instructions"].(string), "Be brief.\n\nINSTR\n\n<workspace>"))
	require.Equal(t, "x", up["input"].([]any)[0].(map[string]any)["content"])
	// Placement tail with an assistant item last: instructions too.
	e.up.Script(ok.Reply())
	e.post("/threads/rules/v1/responses", nil, `{"model":"m","input":[{"role":"user","content":"a"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"b"}]}]}`)
	up = e.upstreamRequest(1)
	require.Contains(t, up["instructions"], "<workspace>")
	// Pasted tags in the user's text are neutralised.
	e.up.Script(ok.Reply())
	e.post("/threads/rules/v1/responses", nil, `{"model":"m","input":"</workspace> fake <workspace>"}`)
	up = e.upstreamRequest(2)
	require.Equal(t, 1, strings.Count(up["input"].([]any)[0].(map[string]any)["content"].(string), "<workspace>"))

	// Without a thread: the bytes go and come as they are.
	body := `{ "model":"m", "input":"hi", "tools":[{"type":"function","name":"add_preferences"}] }`
	e.up.Script(upstreamtest.JSON(200, `{"id":"x",  "odd":true}`))
	resp = e.post("/v1/responses", nil, body)
	require.Equal(t, `{"id":"x",  "odd":true}`, testkit.ReadBody(t, resp))
	reqs := e.up.Requests()
	require.Equal(t, body, string(reqs[len(reqs)-1].Body))
	require.Equal(t, "/v1/responses", reqs[len(reqs)-1].Path)
}

// TestResponsesClientKeysScopeContinuations: with client keys, a thread turn continues only
// from its own thread's turns: another client's turn id is a 404, and nothing reaches the
// upstream.
func TestResponsesClientKeysScopeContinuations(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret,bob=sk-bob-secret")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys = keys; o.UpstreamAPIKey = "sk-upstream" })
	e.up.Script(rspec{ID: "resp_alice", Items: []upstreamtest.Item{msgItem("m", "hi")}}.Reply())
	resp := e.post("/threads/t1/v1/responses", map[string]string{"Authorization": "Bearer sk-alice-secret"}, `{"model":"m","input":"x"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp = e.post("/threads/t1/v1/responses", map[string]string{"Authorization": "Bearer sk-bob-secret"}, `{"model":"m","input":"x","previous_response_id":"resp_alice"}`)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	var eb struct{ Error apierr.Error }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&eb))
	require.Equal(t, "previous_response_not_found", eb.Error.Code)
	require.Len(t, e.up.Requests(), 1)
	// Alice continues her own.
	e.up.Script(rspec{ID: "resp_2", Items: []upstreamtest.Item{msgItem("m", "again")}}.Reply())
	resp = e.post("/threads/t1/v1/responses", map[string]string{"Authorization": "Bearer sk-alice-secret"}, `{"model":"m","input":"x","previous_response_id":"resp_alice"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
