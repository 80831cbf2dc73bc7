package demo

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genai"
)

// TestGemini: the demo speaks the Gemini API to Google's Go SDK, JSON and streamed: a stated
// goal becomes a set_objective call when the tool is offered, a request for structured output
// gets JSON that fits its schema, and countTokens counts words.
func TestGemini(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)
	c, err := genai.NewClient(context.Background(), &genai.ClientConfig{APIKey: "sk-demo", Backend: genai.BackendGeminiAPI,
		HTTPOptions: genai.HTTPOptions{BaseURL: srv.URL}})
	require.NoError(t, err)
	ctx := context.Background()
	tools := &genai.GenerateContentConfig{Tools: []*genai.Tool{{FunctionDeclarations: []*genai.FunctionDeclaration{{Name: "set_objective"}}}}}

	r, err := c.Models.GenerateContent(ctx, ModelName, genai.Text("My goal is a tidy repository."), tools)
	require.NoError(t, err)
	require.Len(t, r.FunctionCalls(), 1)
	require.Equal(t, "set_objective", r.FunctionCalls()[0].Name)
	require.Equal(t, "A tidy repository", r.FunctionCalls()[0].Args["text"])

	var text strings.Builder
	chunks := 0
	for r, err := range c.Models.GenerateContentStream(ctx, ModelName, genai.Text("Hello there, demo."), nil) {
		require.NoError(t, err)
		text.WriteString(r.Text())
		chunks++
	}
	require.Greater(t, chunks, 1)
	require.True(t, strings.HasPrefix(text.String(), Prefix), text.String())

	schema := &genai.GenerateContentConfig{ResponseMIMEType: "application/json", ResponseJsonSchema: map[string]any{"type": "object",
		"properties": map[string]any{"model_choice": map[string]any{"type": "string", "enum": []any{"flash", "pro"}}, "complexity_score": map[string]any{"type": "integer"}}}}
	r, err = c.Models.GenerateContent(ctx, ModelName, genai.Text("route me"), schema)
	require.NoError(t, err)
	require.JSONEq(t, `{"model_choice":"flash","complexity_score":1}`, r.Text())

	n, err := c.Models.CountTokens(ctx, ModelName, genai.Text("four words in here"), nil)
	require.NoError(t, err)
	require.Equal(t, int32(4), n.TotalTokens)
}
