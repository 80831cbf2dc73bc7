package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	openaigo "github.com/openai/openai-go/v3"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

var update = flag.Bool("update", false, "rewrite golden files")

// transcript is what a client got from a streamed turn, checked against docs/spec.md §7: every event
// `data: {chunk}\n\n`, then `data: [DONE]\n\n`, then EOF; every chunk a chat.completion.chunk
// with the same non-empty id; one role delta, at the start; one finish_reason, at the end.
type transcript struct {
	chunks  []map[string]any
	content string
	calls   map[int]map[string]string // client tool calls by index: id, name, arguments
	finish  string
	usage   map[string]any
}

func checkStream(t *testing.T, body string) transcript {
	t.Helper()
	require.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), "ends with [DONE]: %q", tail(body))
	events := strings.Split(strings.TrimSuffix(body, "data: [DONE]\n\n"), "\n\n")
	require.Equal(t, "", events[len(events)-1])
	events = events[:len(events)-1]
	tr := transcript{calls: map[int]map[string]string{}}
	var id string
	roles, finishes := 0, 0
	for i, ev := range events {
		data, ok := strings.CutPrefix(ev, "data: ")
		require.True(t, ok, "event %d: %q", i, ev)
		var c map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &c), data)
		tr.chunks = append(tr.chunks, c)
		require.Equal(t, "chat.completion.chunk", c["object"], data)
		cid, _ := c["id"].(string)
		require.NotEmpty(t, cid)
		if id == "" {
			id = cid
		}
		require.Equal(t, id, cid, "one id for the whole turn")
		if u, ok := c["usage"].(map[string]any); ok {
			require.Equal(t, len(events)-1, i, "the usage chunk is the last")
			require.Empty(t, c["choices"])
			tr.usage = u
			continue
		}
		choices := c["choices"].([]any)
		require.Len(t, choices, 1, data)
		ch := choices[0].(map[string]any)
		delta := ch["delta"].(map[string]any)
		if _, ok := delta["role"]; ok {
			roles++
			require.Equal(t, 0, i, "the role delta comes first")
			require.Equal(t, "assistant", delta["role"])
		}
		if s, ok := delta["content"].(string); ok {
			tr.content += s
		}
		if tcs, ok := delta["tool_calls"].([]any); ok {
			for _, tc := range tcs {
				m := tc.(map[string]any)
				idx := int(m["index"].(float64))
				acc := tr.calls[idx]
				if acc == nil {
					acc = map[string]string{}
					tr.calls[idx] = acc
				}
				if v, ok := m["id"].(string); ok {
					acc["id"] = v
				}
				if fn, ok := m["function"].(map[string]any); ok {
					if v, ok := fn["name"].(string); ok {
						acc["name"] += v
					}
					if v, ok := fn["arguments"].(string); ok {
						acc["arguments"] += v
					}
				}
			}
		}
		if fr, ok := ch["finish_reason"].(string); ok {
			finishes++
			tr.finish = fr
			require.True(t, i == len(events)-1 || (i == len(events)-2 && tr.usage == nil), "finish_reason comes last")
		}
	}
	require.Equal(t, 1, roles, "one role delta")
	require.Equal(t, 1, finishes, "one finish_reason")
	return tr
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}

func streamBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	return testkit.ReadBody(t, resp)
}

const weatherTool = `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`

func fixture(t *testing.T, name string) upstreamtest.Reply {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "upstream", name))
	require.NoError(t, err)
	return upstreamtest.StreamRaw([]string{string(b)})
}

// TestStreamDialects replays what real servers send for a workspace tool call, then an answer:
// the client gets one clean stream whatever the dialect, and the call is run.
func TestStreamDialects(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"openai.sse", "ollama.sse", "azure.sse", "vllm.sse", "no-index.sse", "llamacpp.sse"} {
		t.Run(strings.TrimSuffix(name, ".sse"), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.up.Script(fixture(t, name), upstreamtest.Stream(append(upstreamtest.ContentChunks("chatcmpl-r2", " Done", "."),
				upstreamtest.UsageChunk("chatcmpl-r2", 130, 5))...))
			resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "d"},
				`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Use Celsius."}],"tools":`+weatherTool+`}`)
			tr := checkStream(t, streamBody(t, resp))
			require.Equal(t, "Noting that. Done.", tr.content)
			require.Empty(t, tr.calls, "the workspace's calls are never shown")
			require.Equal(t, "stop", tr.finish)
			require.Equal(t, float64(230), tr.usage["prompt_tokens"])
			require.Equal(t, float64(25), tr.usage["completion_tokens"])
			require.Equal(t, float64(255), tr.usage["total_tokens"])
			require.Equal(t, "Celsius", e.workspace("d").Preferences[0].Title)
			// Round 2 got the assistant's content and call, and the tool's result.
			msgs := messages(e.upstreamRequest(1))
			a := msgs[len(msgs)-2]
			require.Equal(t, "Noting that.", a["content"])
			tc := a["tool_calls"].([]any)[0].(map[string]any)
			require.Equal(t, "add_preferences", tc["function"].(map[string]any)["name"])
			require.JSONEq(t, `{"items":[{"title":"Celsius"}]}`, tc["function"].(map[string]any)["arguments"].(string))
			require.Equal(t, tc["id"], msgs[len(msgs)-1]["tool_call_id"])
			require.NotEmpty(t, tc["id"])
			require.Equal(t, `{"ok":true,"result":"recorded 1 preference"}`, msgs[len(msgs)-1]["content"])
			if name == "vllm.sse" {
				require.Equal(t, "The user wants Celsius.", a["reasoning_content"])
			}
		})
	}
}

// TestStreamGolden compares what the client receives, byte for byte, with a golden transcript.
func TestStreamGolden(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(fixture(t, "openai.sse"), upstreamtest.Stream(append(upstreamtest.ContentChunks("chatcmpl-r2", " Done."),
		upstreamtest.UsageChunk("chatcmpl-r2", 130, 5))...))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "g"},
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Use Celsius."}]}`)
	got := streamBody(t, resp)
	checkStream(t, got)
	golden := filepath.Join("testdata", "stream_openai.golden")
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), got)
}

// TestStreamOfficialClient drives a streamed turn with openai-go's stream and accumulator.
func TestStreamOfficialClient(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(
		upstreamtest.Stream(upstreamtest.Join(
			upstreamtest.ContentChunks("chatcmpl-1", "Let me ", "note that.")[:3],
			upstreamtest.ToolCallChunks("chatcmpl-1", 7,
				call{ID: "c1", Name: "set_objective", Arguments: `{"text":"Plan a trip to Lisbon"}`},
				call{ID: "c2", Name: "add_preferences", Arguments: `{"items":[{"title":"Trains","kind":"hard"}]}`})[1:],
			[]string{upstreamtest.UsageChunk("chatcmpl-1", 50, 10)},
		)...),
		upstreamtest.Stream(append(upstreamtest.ContentChunks("chatcmpl-2", " All set."), upstreamtest.UsageChunk("chatcmpl-2", 70, 3))...),
	)
	client := e.officialClient("trip")
	stream := client.Chat.Completions.NewStreaming(context.Background(), openaigo.ChatCompletionNewParams{
		Model:         "gpt-test",
		Messages:      []openaigo.ChatCompletionMessageParamUnion{openaigo.UserMessage("Plan a trip to Lisbon, trains only.")},
		StreamOptions: openaigo.ChatCompletionStreamOptionsParam{IncludeUsage: openaigo.Bool(true)},
	})
	acc := openaigo.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	require.NoError(t, stream.Err())
	require.NoError(t, stream.Close())
	require.Equal(t, "Let me note that. All set.", acc.Choices[0].Message.Content)
	require.Empty(t, acc.Choices[0].Message.ToolCalls)
	require.Equal(t, "stop", acc.Choices[0].FinishReason)
	require.Equal(t, "chatcmpl-1", acc.ID)
	require.Equal(t, int64(120), acc.Usage.PromptTokens)
	require.Equal(t, int64(13), acc.Usage.CompletionTokens)
	d := e.workspace("trip")
	require.Equal(t, "Plan a trip to Lisbon", d.Objective.Text)
	require.Equal(t, "Trains", d.Preferences[0].Title)
}

// TestStreamMixedCalls: the client's call comes through re-indexed from 0 while the proxy's own
// call (index 0 upstream) is run and hidden; go-openai's stream reader accepts it.
func TestStreamMixedCalls(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(upstreamtest.Stream(upstreamtest.ToolCallChunks("chatcmpl-m", 4,
		call{ID: "p1", Name: "add_preferences", Arguments: `{"items":[{"title":"Celsius"}]}`},
		call{ID: "c1", Name: "get_weather", Arguments: `{"city":"Paris"}`})...))
	var tools []goopenai.Tool
	require.NoError(t, json.Unmarshal([]byte(weatherTool), &tools))
	stream, err := e.goClient("mx").CreateChatCompletionStream(context.Background(), goopenai.ChatCompletionRequest{
		Model: "gpt-test", Stream: true, Tools: tools,
		Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Weather in Paris, Celsius"}},
	})
	require.NoError(t, err)
	defer stream.Close()
	var name, argsGot, id string
	var finish goopenai.FinishReason
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Len(t, resp.Choices, 1)
		for _, tc := range resp.Choices[0].Delta.ToolCalls {
			require.NotNil(t, tc.Index)
			require.Equal(t, 0, *tc.Index, "re-indexed from 0")
			name += tc.Function.Name
			argsGot += tc.Function.Arguments
			if tc.ID != "" {
				id = tc.ID
			}
		}
		if resp.Choices[0].FinishReason != "" {
			finish = resp.Choices[0].FinishReason
		}
	}
	require.Equal(t, "get_weather", name)
	require.Equal(t, `{"city":"Paris"}`, argsGot)
	require.Equal(t, "c1", id)
	require.Equal(t, goopenai.FinishReasonToolCalls, finish)
	require.Equal(t, "Celsius", e.workspace("mx").Preferences[0].Title)
	require.Len(t, e.up.Requests(), 1)
}

func TestStreamErrors(t *testing.T) {
	t.Parallel()
	th := map[string]string{"X-Thread-Id": "s"}
	const req = `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`

	t.Run("BeforeTheFirstByteStatusAndBodyUnchanged", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.JSON(503, `{"error":{"message":"overloaded"}}`))
		resp := e.post("/v1/chat/completions", th, req)
		require.Equal(t, 503, resp.StatusCode)
		require.Equal(t, `{"error":{"message":"overloaded"}}`, testkit.ReadBody(t, resp))
	})

	t.Run("AfterTheFirstByteAnErrorEvent", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.StreamNoDone(upstreamtest.ContentChunks("chatcmpl-x", "partial")[:2]...))
		resp := e.post("/v1/chat/completions", th, req)
		body := streamBody(t, resp)
		events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
		require.Len(t, events, 2)
		testkit.RequireErrorBody(t, strings.TrimPrefix(events[1], "data: "), "server_error", "upstream_invalid_response")
		require.NotContains(t, body, "[DONE]")
	})

	t.Run("UpstreamErrorEventForwarded", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.up.Script(upstreamtest.Stream(upstreamtest.ContentChunks("chatcmpl-x", "partial")[1], `{"error":{"message":"model crashed","type":"server_error"}}`))
		body := streamBody(t, e.post("/v1/chat/completions", th, req))
		require.True(t, strings.HasSuffix(body, "data: {\"error\":{\"message\":\"model crashed\",\"type\":\"server_error\"}}\n\n"), body)
	})

	t.Run("StallPastTheTimeout", func(t *testing.T) {
		t.Parallel()
		e := setup(t, func(o *Options) { o.UpstreamTimeout = 300 * time.Millisecond })
		e.up.Script(func(w http.ResponseWriter, r *http.Request) {
			upstreamtest.StreamRaw([]string{"data: " + upstreamtest.ContentChunks("chatcmpl-x", "a")[1] + "\n\n"})(w, r)
			<-r.Context().Done()
		})
		body := streamBody(t, e.post("/v1/chat/completions", th, req))
		events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
		testkit.RequireErrorBody(t, strings.TrimPrefix(events[len(events)-1], "data: "), "server_error", "upstream_timeout")
	})
}

// TestStreamClientLeaves: a client that goes away mid-stream cancels the upstream request.
func TestStreamClientLeaves(t *testing.T) {
	t.Parallel()
	e := setup(t)
	gone := make(chan struct{})
	e.up.Script(func(w http.ResponseWriter, r *http.Request) {
		upstreamtest.StreamRaw([]string{"data: " + upstreamtest.ContentChunks("chatcmpl-x", "a")[1] + "\n\n"})(w, r)
		upstreamtest.Hang(gone)(w, r)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	require.NoError(t, err)
	hreq.Header.Set("X-Thread-Id", "leaver")
	resp, err := http.DefaultClient.Do(hreq)
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data: "), line)
	cancel()
	resp.Body.Close()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
}

// TestStreamFlushesWhenWaiting: an event reaches the client before the proxy waits for the
// upstream's next one (the upstream holds its second chunk until the client has the first).
func TestStreamFlushesWhenWaiting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	gotFirst := make(chan struct{})
	chunks := upstreamtest.ContentChunks("chatcmpl-f", "one", "two")
	e.up.Script(func(w http.ResponseWriter, r *http.Request) {
		upstreamtest.StreamRaw(upstreamtest.Events(chunks[:2]...))(w, r)
		select {
		case <-gotFirst:
		case <-time.After(10 * time.Second):
			return
		}
		upstreamtest.WriteRaw(w, upstreamtest.Events(chunks[2:]...)...)
		upstreamtest.WriteRaw(w, "data: [DONE]\n\n")
	})
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "f"}, `{"model":"m","stream":true,"messages":[]}`)
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, `"content":"one"`)
	close(gotFirst)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	tr := checkStream(t, line+string(rest))
	require.Equal(t, "onetwo", tr.content)
}
