package fake_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	oaoption "github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestFakeAPIs: one fake speaks chat completions and the Messages API (by path), with the
// tool round of its options in both, the same answers encoded again for every request.
func TestFakeAPIs(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Fake(t, fake.Options{ToolRound: true, Timing: fake.Timing{Chunks: 3}})
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for n := range int64(2) { // each call another subtitle: every tool round writes
		code, body := post(t, up.URL+"/chat/completions", chat)
		require.Equal(t, 200, code)
		require.JSONEq(t, `{"id":"chatcmpl-model","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"annotations":[],`+
			`"tool_calls":[{"id":"call_load","type":"function","function":{"name":"update_preferences","arguments":`+jsonString(fake.ToolArguments(n+1))+`}}]},"logprobs":null,"finish_reason":"tool_calls"}],`+
			`"usage":{"prompt_tokens":300,"completion_tokens":40,"total_tokens":340}}`, body)
	}
	code, body := post(t, up.URL+"/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"call_load","content":"ok"}]}`)
	require.Equal(t, 200, code)
	require.Contains(t, body, `"content":"Soil word word"`)

	code, body = post(t, up.URL+"/messages", `{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 200, code)
	var msg struct {
		Content []struct {
			Type, Name string
			Input      json.RawMessage
		}
		StopReason string `json:"stop_reason"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &msg))
	require.Equal(t, "tool_use", msg.StopReason)
	require.Equal(t, "update_preferences", msg.Content[0].Name)
	require.JSONEq(t, fake.ToolArguments(3), string(msg.Content[0].Input))
	require.Len(t, up.Requests(), 4)
}

// TestFakeScriptAndCache: a script decides the answers; with PromptCache the usage is the
// provider's cache rule's (a repeated long prompt is served from the cache).
func TestFakeScriptAndCache(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Fake(t, fake.Options{PromptCache: true, Script: func(r *fake.Request) fake.Answer {
		return fake.Answer{Text: "you said " + r.Messages[len(r.Messages)-1].Text()}
	}})
	body := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("x", 8000) + `"},{"role":"user","content":"hi"}]}`
	var usage []int
	for range 2 {
		code, out := post(t, up.URL+"/chat/completions", body)
		require.Equal(t, 200, code)
		require.Contains(t, out, `"content":"you said hi"`)
		var c struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &c))
		usage = append(usage, c.Usage.Details.Cached)
	}
	require.Equal(t, []int{0, 1920}, usage)
}

// TestFakeFaults: every request gets the fault its share says, counted.
func TestFakeFaults(t *testing.T) {
	t.Parallel()
	m := fake.New(fake.Options{Faults: fake.Faults{Status: 1}})
	up := upstreamtest.Fake(t, fake.Options{})
	up.Fallback = m.ServeHTTP
	code, body := post(t, up.URL+"/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 503, code)
	require.JSONEq(t, `{"error":{"message":"overloaded","type":"overloaded","param":null,"code":null}}`, body)
	require.Equal(t, map[string]int{fake.FaultStatus: 1}, m.Injected())
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestFakeReadBySDKs: the official SDKs read the fake's answers, JSON and streamed, in both
// APIs: a tool round's workspace call whose arguments come in pieces, then the text.
func TestFakeReadBySDKs(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Fake(t, fake.Options{Timing: fake.Timing{Chunks: 4}})
	header := option.WithHeader(fake.ToolRoundHeader, "1")

	chat := openai.NewClient(oaoption.WithBaseURL(up.URL), oaoption.WithAPIKey("k"), oaoption.WithMaxRetries(0), oaoption.WithHeader(fake.ToolRoundHeader, "1"))
	params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	calls := int64(0) // the fake's workspace calls so far
	for _, streamed := range []bool{false, true} {
		var c openai.ChatCompletion
		if streamed {
			var acc openai.ChatCompletionAccumulator
			stream := chat.Chat.Completions.NewStreaming(context.Background(), params)
			for stream.Next() {
				acc.AddChunk(stream.Current())
			}
			require.NoError(t, stream.Err())
			c = acc.ChatCompletion
		} else {
			got, err := chat.Chat.Completions.New(context.Background(), params)
			require.NoError(t, err)
			c = *got
		}
		require.Len(t, c.Choices[0].Message.ToolCalls, 1, "streamed %v", streamed)
		call := c.Choices[0].Message.ToolCalls[0]
		calls++
		require.Equal(t, fake.WorkspaceCall(calls).Name, call.Function.Name)
		require.Equal(t, fake.ToolArguments(calls), call.Function.Arguments)
		next := params
		next.Messages = append(append([]openai.ChatCompletionMessageParamUnion(nil), params.Messages...), c.Choices[0].Message.ToParam(),
			openai.ToolMessage(`{"ok":true}`, call.ID))
		answer, err := chat.Chat.Completions.New(context.Background(), next)
		require.NoError(t, err)
		require.Equal(t, "Soil word word word", answer.Choices[0].Message.Content)
	}

	client := anthropic.NewClient(option.WithBaseURL(strings.TrimSuffix(up.URL, "/v1")), option.WithAPIKey("k"), option.WithMaxRetries(0), header)
	mp := anthropic.MessageNewParams{Model: "claude", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	for _, streamed := range []bool{false, true} {
		var m anthropic.Message
		if streamed {
			stream := client.Messages.NewStreaming(context.Background(), mp)
			for stream.Next() {
				require.NoError(t, m.Accumulate(stream.Current()))
			}
			require.NoError(t, stream.Err())
		} else {
			got, err := client.Messages.New(context.Background(), mp)
			require.NoError(t, err)
			m = *got
		}
		require.Equal(t, anthropic.StopReasonToolUse, m.StopReason, "streamed %v", streamed)
		require.Len(t, m.Content, 1)
		calls++
		require.Equal(t, fake.WorkspaceCall(calls).Name, m.Content[0].Name)
		require.JSONEq(t, fake.ToolArguments(calls), string(m.Content[0].Input))
		next := mp
		next.Messages = append(append([]anthropic.MessageParam(nil), mp.Messages...), m.ToParam(),
			anthropic.NewUserMessage(anthropic.NewToolResultBlock(m.Content[0].ID, `{"ok":true}`, false)))
		if streamed {
			var answer anthropic.Message
			stream := client.Messages.NewStreaming(context.Background(), next)
			for stream.Next() {
				require.NoError(t, answer.Accumulate(stream.Current()))
			}
			require.NoError(t, stream.Err())
			require.Equal(t, "Soil word word word", answer.Content[0].Text)
			require.Equal(t, anthropic.StopReasonEndTurn, answer.StopReason)
		}
	}
}
