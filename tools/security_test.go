package tools

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoneSurrogates: a lone surrogate escape (which Postgres refuses in jsonb) anywhere in a
// call's arguments never fails the call: its strings get U+FFFD for it, in the workspace and in
// the call's record, and a call the tool refuses is still recorded.
func TestLoneSurrogates(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.Equal(t, "recorded 1 preference",
		f.ok(t, AddPreferences, `{"items":[{"title":"Tea \ud800 time","subtitle":"\udfff"}],"action_and_reasoning":"\uD83D","x":{"\udc00":["\ud800"]}}`))
	require.Equal(t, "Tea \uFFFD time", f.list(t)[0].Title)
	require.Contains(t, f.fails(t, SetObjective, `{"text":"","note":"\ud800"}`), "text: must not be empty")
	require.Equal(t, "objective set: \uFFFD", f.ok(t, SetObjective, `{"text":"\ud800"}`))
	calls, err := f.ws.ToolCalls(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, calls, 3)
	require.Equal(t, "\uFFFD", calls[0].ActionAndReasoning)
	require.False(t, strings.Contains(string(calls[0].Arguments), `\ud800`), "%s", calls[0].Arguments)
	require.Contains(t, string(calls[0].Arguments), "Tea \uFFFD time")
}
