package fake_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genai"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// TestFakeGeminiReadBySDK: Google's Go SDK reads the fake's Gemini API, JSON and streamed: a tool
// round's workspace call as a functionCall part, then, after its functionResponse, the text in
// pieces; with PromptCache, a repeated long prompt's prefix is reported as
// cachedContentTokenCount.
func TestFakeGeminiReadBySDK(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Fake(t, fake.Options{Timing: fake.Timing{Chunks: 4}})
	c, err := genai.NewClient(context.Background(), &genai.ClientConfig{APIKey: "k", Backend: genai.BackendGeminiAPI,
		HTTPOptions: genai.HTTPOptions{BaseURL: strings.TrimSuffix(up.URL, "/v1"), Headers: map[string][]string{fake.ToolRoundHeader: {"1"}}}})
	require.NoError(t, err)
	ctx := context.Background()
	text := func(r *genai.GenerateContentResponse) string { // the text parts (r.Text warns of calls)
		var b strings.Builder
		for _, p := range r.Candidates[0].Content.Parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	run := func(contents []*genai.Content, streamed bool) (string, []*genai.FunctionCall, *genai.GenerateContentResponseUsageMetadata) {
		if !streamed {
			r, err := c.Models.GenerateContent(ctx, "gemini-2.5-flash", contents, nil)
			require.NoError(t, err)
			return text(r), r.FunctionCalls(), r.UsageMetadata
		}
		var b strings.Builder
		var calls []*genai.FunctionCall
		var usage *genai.GenerateContentResponseUsageMetadata
		for r, err := range c.Models.GenerateContentStream(ctx, "gemini-2.5-flash", contents, nil) {
			require.NoError(t, err)
			b.WriteString(text(r))
			calls = append(calls, r.FunctionCalls()...)
			usage = r.UsageMetadata
		}
		return b.String(), calls, usage
	}
	for n, streamed := range []bool{false, true} {
		contents := genai.Text("hi")
		got, calls, usage := run(contents, streamed)
		require.Empty(t, got, "streamed %v", streamed)
		require.Len(t, calls, 1)
		want := fake.WorkspaceCall(int64(n + 1))
		require.Equal(t, want.Name, calls[0].Name)
		require.Equal(t, want.ID, calls[0].ID)
		args, _ := json.Marshal(calls[0].Args)
		require.JSONEq(t, want.Arguments, string(args))
		require.EqualValues(t, 300, usage.PromptTokenCount)
		require.EqualValues(t, 40, usage.CandidatesTokenCount)
		contents = append(contents, &genai.Content{Role: genai.RoleModel, Parts: []*genai.Part{{FunctionCall: calls[0]}}},
			&genai.Content{Role: genai.RoleUser, Parts: []*genai.Part{genai.NewPartFromFunctionResponse(calls[0].Name, map[string]any{"ok": true})}})
		got, calls, _ = run(contents, streamed)
		require.Equal(t, "Soil word word word", got)
		require.Empty(t, calls)
	}
	require.Len(t, up.Requests(), 4)
	require.Equal(t, "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", up.Requests()[3].Path)

	cached := upstreamtest.Fake(t, fake.Options{PromptCache: true})
	cc, err := genai.NewClient(ctx, &genai.ClientConfig{APIKey: "k", Backend: genai.BackendGeminiAPI, HTTPOptions: genai.HTTPOptions{BaseURL: strings.TrimSuffix(cached.URL, "/v1")}})
	require.NoError(t, err)
	config := &genai.GenerateContentConfig{SystemInstruction: genai.NewContentFromText(strings.Repeat("x", 8000), genai.RoleUser)}
	var got []int32
	for _, q := range []string{"a", "b"} {
		r, err := cc.Models.GenerateContent(ctx, "gemini-2.5-flash", genai.Text(q), config)
		require.NoError(t, err)
		got = append(got, r.UsageMetadata.CachedContentTokenCount)
	}
	require.Equal(t, int32(0), got[0])
	require.Greater(t, got[1], int32(2000), "the system instruction and more, no 128-token step")
}
