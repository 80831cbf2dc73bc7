package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genai"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
)

// withGemini points the Gemini API's upstream at the scripted upstream's root (key: the
// operator's key there, "" for none).
func withGemini(key string) func(*Options) {
	return func(o *Options) {
		up := o.Upstreams["anthropic"]
		o.Upstreams["gemini"] = Upstream{URL: up.URL, APIKey: key}
	}
}

// geminiClient is Google's Go SDK toward base (the proxy, a thread's path form of it, or the
// upstream straight).
func geminiClient(t *testing.T, base, key string, header http.Header) *genai.Client {
	t.Helper()
	c, err := genai.NewClient(context.Background(), &genai.ClientConfig{APIKey: key, Backend: genai.BackendGeminiAPI,
		HTTPOptions: genai.HTTPOptions{BaseURL: base, Headers: header}})
	require.NoError(t, err)
	return c
}

// runGemini runs a request through the SDK, streamed or not, and returns the text the client
// read, the function calls, and the last usage.
func runGemini(t *testing.T, c *genai.Client, text string, config *genai.GenerateContentConfig, streamed bool) (string, []*genai.FunctionCall, *genai.GenerateContentResponseUsageMetadata, error) {
	t.Helper()
	ctx := context.Background()
	contents := genai.Text(text)
	if !streamed {
		r, err := c.Models.GenerateContent(ctx, "gemini-2.5-pro", contents, config)
		if err != nil {
			return "", nil, nil, err
		}
		return r.Text(), r.FunctionCalls(), r.UsageMetadata, nil
	}
	var b strings.Builder
	var calls []*genai.FunctionCall
	var usage *genai.GenerateContentResponseUsageMetadata
	for r, err := range c.Models.GenerateContentStream(ctx, "gemini-2.5-pro", contents, config) {
		if err != nil {
			return "", nil, nil, err
		}
		b.WriteString(r.Text())
		calls = append(calls, r.FunctionCalls()...)
		if r.UsageMetadata != nil {
			usage = r.UsageMetadata
		}
	}
	return b.String(), calls, usage, nil
}

// clientFunctions is a config declaring the client's function read_file.
func clientFunctions() *genai.GenerateContentConfig {
	return &genai.GenerateContentConfig{Tools: []*genai.Tool{{FunctionDeclarations: []*genai.FunctionDeclaration{{
		Name: "read_file", Description: "Reads a file.",
		Parameters: &genai.Schema{Type: genai.TypeObject, Properties: map[string]*genai.Schema{"path": {Type: genai.TypeString}}}}}}}}
}

// TestGeminiTurnWithAWorkspaceCall: a Gemini turn whose first round thinks and calls a workspace
// tool, and whose second answers, reads through Google's Go SDK as the answer alone with the
// usage of both rounds; the tool ran, the model's content went back with its signature (the
// fake refuses it otherwise), and the upstream got the five tools after the client's.
func TestGeminiTurnWithAWorkspaceCall(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, streamed bool) {
		e := setup(t, withGemini(""))
		e.up.Script(
			upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r1", Parts: []upstreamtest.GeminiPart{
				upstreamtest.GeminiThought("The user states a goal; record it."),
				upstreamtest.GeminiCall("", tools.SetObjective, `{"text":"A tidy repository","action_and_reasoning":"The user stated their goal."}`)}}),
			upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r2", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiText("Noted: a tidy repository.")},
				Usage: map[string]int{"promptTokenCount": 30, "cachedContentTokenCount": 20, "candidatesTokenCount": 7, "totalTokenCount": 37}}),
		)
		text, calls, usage, err := runGemini(t, geminiClient(t, e.srv.URL+"/threads/gt", "AIza-client", nil), "My goal is a tidy repository.", clientFunctions(), streamed)
		require.NoError(t, err)
		require.Equal(t, "Noted: a tidy repository.", text)
		require.Empty(t, calls)
		require.Equal(t, int32(40), usage.PromptTokenCount)
		require.Equal(t, int32(24), usage.CachedContentTokenCount)
		require.Equal(t, int32(12), usage.CandidatesTokenCount)
		require.Equal(t, int32(2), usage.ThoughtsTokenCount)
		require.Equal(t, "A tidy repository", e.workspace("gt").Objective.Text)

		reqs := e.up.Requests()
		require.Len(t, reqs, 2)
		method := ":generateContent"
		if streamed {
			method = ":streamGenerateContent?alt=sse"
		}
		require.Equal(t, "/v1beta/models/gemini-2.5-pro"+method, reqs[0].Path)
		require.Equal(t, "AIza-client", reqs[0].Header.Get("X-Goog-Api-Key"))
		var body struct {
			Tools []struct {
				FunctionDeclarations []struct{ Name string } `json:"functionDeclarations"`
			} `json:"tools"`
		}
		require.NoError(t, json.Unmarshal(reqs[0].Body, &body))
		var names []string
		for _, d := range body.Tools[0].FunctionDeclarations {
			names = append(names, d.Name)
		}
		require.Equal(t, append([]string{"read_file"}, tools.Names...), names)
		require.Contains(t, string(reqs[1].Body), `"thoughtSignature":"`+upstreamtest.GeminiSignature("call:"+tools.SetObjective)+`"`)
	})
}

// TestGeminiClientCallsReturned: the client's own calls reach it through the SDK; a workspace
// call beside them runs and is never shown.
func TestGeminiClientCallsReturned(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, streamed bool) {
		e := setup(t, withGemini(""))
		e.up.Script(upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r1", Parts: []upstreamtest.GeminiPart{
			upstreamtest.GeminiText("Reading."),
			upstreamtest.GeminiCall("", tools.AddPreferences, `{"items":[{"title":"Tabs over spaces"}],"action_and_reasoning":"pref"}`),
			{Call: "read_file", Args: `{"path":"a.go"}`}, {Call: "read_file", Args: `{"path":"b.go"}`}}}))
		text, calls, _, err := runGemini(t, geminiClient(t, e.srv.URL+"/threads/gc", "AIza-client", nil), "I prefer tabs over spaces. Read a.go and b.go.", clientFunctions(), streamed)
		require.NoError(t, err)
		require.Equal(t, "Reading.", text)
		require.Len(t, calls, 2)
		require.Equal(t, "read_file", calls[0].Name)
		require.Equal(t, map[string]any{"path": "b.go"}, calls[1].Args)
		require.Equal(t, "Tabs over spaces", e.workspace("gc").Preferences[0].Title)
	})
}

// TestGeminiSDKStraightAndThroughATurn: a one-round answer reads the same through the SDK
// straight from the upstream and through a thread turn, JSON and streamed.
func TestGeminiSDKStraightAndThroughATurn(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, streamed bool) {
		e := setup(t, withGemini(""))
		r := upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiThought("Hm."), upstreamtest.GeminiText("Hello there.")}})
		e.up.Script(r, r)
		t1, c1, u1, err := runGemini(t, geminiClient(t, e.up.Server.URL, "AIza", nil), "hi", nil, streamed)
		require.NoError(t, err)
		t2, c2, u2, err := runGemini(t, geminiClient(t, e.srv.URL+"/threads/gs", "AIza", nil), "hi", nil, streamed)
		require.NoError(t, err)
		require.Equal(t, "Hello there.", t1)
		require.Equal(t, t1, t2)
		require.Equal(t, c1, c2)
		require.Equal(t, u1, u2)
	})
}

// TestGeminiClientKeys: with CLIENT_KEYS a client's key comes in x-goog-api-key or ?key=; it
// never reaches the upstream, which gets the operator's key in x-goog-api-key and the client's
// query without the key; a wrong key is refused in Google's shape.
func TestGeminiClientKeys(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=sk-alice-secret")
	require.NoError(t, err)
	e := setup(t, withGemini("AIza-operator"), func(o *Options) { o.ClientKeys = keys })
	answer := upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiText("Hi.")}})
	e.up.Script(answer, answer)
	body := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`

	resp := e.post("/threads/k/v1beta/models/gemini-2.5-flash:generateContent", map[string]string{"X-Goog-Api-Key": "sk-alice-secret"}, body)
	require.Equal(t, http.StatusOK, resp.StatusCode, testkit.ReadBody(t, resp))
	resp = e.post("/threads/k/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key=sk-alice-secret", nil, body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, testkit.ReadBody(t, resp), `"finishReason":"STOP"`)
	for _, r := range e.up.Requests() {
		require.Equal(t, "AIza-operator", r.Header.Get("X-Goog-Api-Key"))
		require.NotContains(t, r.Path, "sk-alice")
		require.NotContains(t, r.Path, "key=")
	}
	require.Equal(t, "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", e.up.Requests()[1].Path)
	require.Equal(t, 2, e.turns("alice~k"))

	resp = e.post("/threads/k/v1beta/models/gemini-2.5-flash:generateContent", map[string]string{"X-Goog-Api-Key": "sk-wrong"}, body)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	var gerr struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Status  string `json:"status"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(testkit.ReadBody(t, resp)), &gerr))
	require.Equal(t, 401, gerr.Error.Code)
	require.Equal(t, "UNAUTHENTICATED", gerr.Error.Status)

	_, _, _, err = runGemini(t, geminiClient(t, e.srv.URL+"/threads/k", "sk-wrong", nil), "hi", nil, false)
	var apiErr genai.APIError
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, 401, apiErr.Code)
}

// TestGeminiErrors: the proxy's errors on the Gemini routes are in Google's shape (a reserved
// function name: 400 INVALID_ARGUMENT, read by the SDK), and an upstream's error reaches the
// client as the upstream sent it, streamed or not.
func TestGeminiErrors(t *testing.T) {
	t.Parallel()
	e := setup(t, withGemini(""))
	config := &genai.GenerateContentConfig{Tools: []*genai.Tool{{FunctionDeclarations: []*genai.FunctionDeclaration{{Name: tools.SetObjective}}}}}
	_, _, _, err := runGemini(t, geminiClient(t, e.srv.URL+"/threads/ge", "AIza", nil), "hi", config, false)
	var apiErr genai.APIError
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, 400, apiErr.Code)
	require.Equal(t, "INVALID_ARGUMENT", apiErr.Status)
	require.Contains(t, apiErr.Message, "reserved")

	quota := `{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}`
	e.up.Script(upstreamtest.JSON(429, quota), upstreamtest.JSON(429, quota))
	for _, method := range []string{"generateContent", "streamGenerateContent?alt=sse"} {
		resp := e.post("/threads/ge/v1beta/models/gemini-2.5-pro:"+method, nil, `{"contents":[{"parts":[{"text":"hi"}]}]}`)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, quota, testkit.ReadBody(t, resp))
	}

	// An error chunk inside the stream reaches the client as it came.
	chunk := `{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}`
	e.up.Script(upstreamtest.StreamRaw([]string{`data: {"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]}}]}` + "\r\n\r\n", "data: " + chunk + "\r\n\r\n"}))
	resp := e.post("/threads/ge/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", nil, `{"contents":[{"parts":[{"text":"hi"}]}]}`)
	require.Equal(t, 200, resp.StatusCode)
	got := testkit.ReadBody(t, resp)
	require.True(t, strings.HasSuffix(got, "data: "+chunk+"\n\n"), got)
}

// TestGeminiSideRequest: a request for structured output (Gemini CLI's routing classifier) is
// forwarded byte for byte as a side request of the thread: no tools, no block, no loop.
func TestGeminiSideRequest(t *testing.T) {
	t.Parallel()
	e := setup(t, withGemini(""))
	e.up.Script(upstreamtest.JSON(200, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"model_choice\":\"flash\"}"}]}}]}`))
	body := `{"contents":[{"role":"user","parts":[{"text":"route this"}]}],  "generationConfig":{"responseMimeType":"application/json","responseJsonSchema":{"type":"object"}},"systemInstruction":{"parts":[{"text":"You are a router."}]}}`
	resp := e.post("/threads/side/v1beta/models/gemini-2.5-flash-lite:generateContent", nil, body)
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, testkit.ReadBody(t, resp), "model_choice")
	require.Equal(t, body, string(e.up.Requests()[0].Body))
	require.Equal(t, 1.0, counterValue(t, e, "side"))
}

// counterValue is wsproxy_turns_total of kind.
func counterValue(t *testing.T, e *env, kind string) float64 {
	t.Helper()
	families, err := e.reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "wsproxy_turns_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestGeminiCountTokens: with a thread, countTokens counts what the model will see (the
// workspace and the five tools, as a generateContentRequest); without one, and for any other
// method, the request passes through as it came.
func TestGeminiCountTokens(t *testing.T) {
	t.Parallel()
	e := setup(t, withGemini(""))
	e.up.Script(upstreamtest.JSON(200, `{"totalTokens":1234}`), upstreamtest.JSON(200, `{"totalTokens":5}`), upstreamtest.JSON(200, `{"embedding":{"values":[0.1]}}`))
	c := geminiClient(t, e.srv.URL+"/threads/count", "AIza", nil)
	n, err := c.Models.CountTokens(context.Background(), "gemini-2.5-pro", genai.Text("How many?"), nil)
	require.NoError(t, err)
	require.Equal(t, int32(1234), n.TotalTokens)
	got := e.up.Requests()[0]
	require.Equal(t, "/v1beta/models/gemini-2.5-pro:countTokens", got.Path)
	var body struct {
		Request struct {
			Model    string `json:"model"`
			Contents []struct {
				Parts []struct{ Text string } `json:"parts"`
			} `json:"contents"`
			Tools []struct {
				FunctionDeclarations []struct{ Name string } `json:"functionDeclarations"`
			} `json:"tools"`
		} `json:"generateContentRequest"`
	}
	require.NoError(t, json.Unmarshal(got.Body, &body), string(got.Body))
	require.Equal(t, "models/gemini-2.5-pro", body.Request.Model)
	require.Len(t, body.Request.Contents[0].Parts, 2)
	require.Contains(t, body.Request.Contents[0].Parts[1].Text, "<workspace>")
	require.Len(t, body.Request.Tools[0].FunctionDeclarations, 5)

	plain := `{"contents": [{"parts": [{"text": "How many?"}]}]}`
	resp := e.post("/v1beta/models/gemini-2.5-pro:countTokens", nil, plain)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, plain, string(e.up.Requests()[1].Body))
	embed := `{"content": {"parts": [{"text": "embed me"}]}}`
	resp = e.post("/threads/count/v1beta/models/text-embedding-004:embedContent", nil, embed)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, embed, string(e.up.Requests()[2].Body))
	require.Equal(t, "/v1beta/models/text-embedding-004:embedContent", e.up.Requests()[2].Path)
}

// TestGeminiKeepalive: while the proxy runs a round the client cannot see, the client gets an
// empty event (two line ends) every StreamKeepalive (the upstream's second round waits until it has one), and
// Google's Go SDK reads the whole stream, keepalives and all, as the answer.
func TestGeminiKeepalive(t *testing.T) {
	t.Parallel()
	e := setup(t, withGemini(""), func(o *Options) { o.StreamKeepalive = 20 * time.Millisecond })
	sawKeepalive := make(chan struct{})
	second := upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r2", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiText("None yet.")}})
	e.up.Script(
		upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r1", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiCall("", tools.ListPreferences, `{}`)}}),
		func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-sawKeepalive:
			case <-time.After(10 * time.Second):
			}
			second(w, r)
		})
	resp := e.post("/threads/gk/v1beta/models/m:streamGenerateContent?alt=sse", nil, `{"contents":[{"parts":[{"text":"What are my preferences?"}]}]}`)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	rd := bufio.NewReader(resp.Body)
	first := make([]byte, 2)
	_, err := io.ReadFull(rd, first)
	require.NoError(t, err)
	require.Equal(t, "\n\n", string(first), "an empty event before any other")
	close(sawKeepalive)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	body := string(first) + string(rest)
	require.Contains(t, body, `"text":"None"`)
	require.NotContains(t, body, tools.ListPreferences)

	replay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(replay.Close)
	text, _, usage, err := runGemini(t, geminiClient(t, replay.URL, "AIza", nil), "x", nil, true)
	require.NoError(t, err)
	require.Equal(t, "None yet.", text)
	require.Equal(t, int32(20), usage.PromptTokenCount)
}

// TestGeminiProtoNamesThroughATurn: a client that writes Google's REST examples' names
// (system_instruction, tool_config.function_calling_config, generation_config.candidate_count)
// gets them read as their lowerCamelCase twins: the upstream gets its system instruction once,
// with the block; mode ANY names the client's own functions; two candidates are refused.
func TestGeminiProtoNamesThroughATurn(t *testing.T) {
	t.Parallel()
	e := setup(t, withGemini(""))
	e.up.Script(upstreamtest.Gemini(upstreamtest.GeminiReply{ID: "r", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiText("Hi.")}}))
	body := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"system_instruction":{"parts":[{"text":"Be brief."}]},` +
		`"tools":[{"function_declarations":[{"name":"read_file"}]}],"tool_config":{"function_calling_config":{"mode":"ANY"}}}`
	resp := e.post("/threads/proto/v1beta/models/gemini-2.5-pro:generateContent", map[string]string{"X-Workspace-Placement": "system"}, body)
	require.Equal(t, http.StatusOK, resp.StatusCode, testkit.ReadBody(t, resp))
	sent := e.up.Requests()[0].JSON(t)
	require.NotContains(t, sent, "systemInstruction", "one system instruction")
	require.NotContains(t, sent, "toolConfig", "one tool config")
	system, _ := json.Marshal(sent["system_instruction"])
	require.Contains(t, string(system), `{"text":"Be brief."},{"text":"INSTR`)
	config, _ := json.Marshal(sent["tool_config"])
	require.JSONEq(t, `{"function_calling_config":{"mode":"ANY","allowed_function_names":["read_file"]}}`, string(config))

	for _, gc := range []string{`"generation_config":{"candidate_count":2}`, `"generationConfig":{"candidateCount":"2"}`, `"generationConfig":{"candidateCount":2.0}`} {
		resp := e.post("/threads/proto/v1beta/models/gemini-2.5-pro:generateContent", nil, `{"contents":[{"parts":[{"text":"hi"}]}],`+gc+`}`)
		got := testkit.ReadBody(t, resp)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", gc, got)
		require.Contains(t, got, "candidateCount", gc)
	}
	require.Len(t, e.up.Requests(), 1)
}
