package fake_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

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
	for range 2 {
		code, body := post(t, up.URL+"/chat/completions", chat)
		require.Equal(t, 200, code)
		require.JSONEq(t, `{"id":"chatcmpl-model","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,`+
			`"tool_calls":[{"id":"call_load","type":"function","function":{"name":"update_preferences","arguments":`+jsonString(fake.ToolArguments)+`}}]},"finish_reason":"tool_calls"}],`+
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
	require.JSONEq(t, fake.ToolArguments, string(msg.Content[0].Input))
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
	require.JSONEq(t, `{"error":{"message":"overloaded","type":"overloaded"}}`, body)
	require.Equal(t, map[string]int{fake.FaultStatus: 1}, m.Injected())
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
