package proxy

import (
	"context"
	"testing"

	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/require"
)

// TestOfficialClientNonStreamed: openai-go, not streamed, with a client tool and the workspace
// tools in the loop.
func TestOfficialClientNonStreamed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Script(
		reply(cmpl("", call{ID: "a", Name: "set_objective", Arguments: `{"text":"Know the weather","action_and_reasoning":"goal"}`})),
		reply(cmpl("", call{ID: "w", Name: "get_weather", Arguments: `{"city":"Oslo"}`})),
	)
	client := e.officialClient("official")
	resp, err := client.Chat.Completions.New(context.Background(), openaigo.ChatCompletionNewParams{
		Model:    "gpt-test",
		Messages: []openaigo.ChatCompletionMessageParamUnion{openaigo.SystemMessage("Be terse."), openaigo.UserMessage("Weather in Oslo?")},
		Tools: []openaigo.ChatCompletionToolUnionParam{openaigo.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "get_weather", Parameters: shared.FunctionParameters{"type": "object"},
		})},
	})
	require.NoError(t, err)
	require.Equal(t, "tool_calls", resp.Choices[0].FinishReason)
	require.Len(t, resp.Choices[0].Message.ToolCalls, 1)
	require.Equal(t, "get_weather", resp.Choices[0].Message.ToolCalls[0].Function.Name)
	require.Equal(t, int64(30), resp.Usage.TotalTokens)
	require.Equal(t, "Know the weather", e.workspace("official").Objective.Text)
	require.Equal(t, []string{"get_weather", "add_preferences", "list_preferences", "update_preferences", "remove_preferences", "set_objective"},
		toolNames(e.upstreamRequest(1)))
	require.Equal(t, "Be terse.", messages(e.upstreamRequest(0))[0]["content"])
	require.Equal(t, "Weather in Oslo?\n\nINSTR\n\n<workspace>\nObjective: (none yet)\nPreferences: (none yet)\n</workspace>",
		messages(e.upstreamRequest(0))[1]["content"])
}
