package main

import (
	"context"
	"strings"
	"testing"

	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/demo"
)

// TestDemoResponses runs the program against the demo model on the Responses API, as Codex CLI
// and the Agents SDK call it (the thread in the base URL's path): a non-streamed turn records a
// preference, a streamed one shows it, and the admin REST holds it.
func TestDemoResponses(t *testing.T) {
	t.Parallel()
	m, _ := MustRunMain(t, nil)
	client := openaigo.NewClient(option.WithBaseURL(m.URL+"/threads/codex/v1/"), option.WithAPIKey("any"), option.WithMaxRetries(0))
	ctx := context.Background()

	r1, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: demo.ModelName,
		Input: responses.ResponseNewParamsInputUnion{OfString: openaigo.String("I prefer tabs over spaces.")},
	})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(r1.OutputText(), demo.Prefix), r1.OutputText())
	require.Contains(t, r1.OutputText(), "recorded 1 preference")
	require.Len(t, r1.Output, 1, "the workspace call is not shown")

	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: demo.ModelName,
		Input: responses.ResponseNewParamsInputUnion{OfString: openaigo.String("What are my preferences?")},
	})
	var text strings.Builder
	var done *responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			r := ev.Response
			done = &r
		}
	}
	require.NoError(t, stream.Err())
	require.NotNil(t, done)
	require.Contains(t, text.String(), "#1 [soft] Tabs over spaces")
	require.Equal(t, text.String(), done.OutputText())

	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/codex", "", &ws))
	require.Len(t, ws.Preferences, 1)
	require.Equal(t, "Tabs over spaces", ws.Preferences[0].Title)
}
