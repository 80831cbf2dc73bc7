package tools

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCallsNameTheViewShown: on a real thread, a round's calls name the list of the turn's start
// whatever the user and the round's earlier calls did since; list_preferences shows the list
// anew for the calls after it; the next round names the list as the round left it.
func TestCallsNameTheViewShown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, AddPreferences, add(item{Title: "A"}, item{Title: "B"}, item{Title: "C"}, item{Title: "D"}))
	start, err := f.ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	view := NewView(start)
	run := func(tool string, args any) string {
		t.Helper()
		b, _ := json.Marshal(args)
		res, err := f.ws.Run(ctx, Call{Turn: start.Number, Round: 1, Name: tool, Arguments: string(b), View: view})
		require.NoError(t, err)
		var env Envelope
		require.NoError(t, json.Unmarshal([]byte(res.Content), &env))
		require.True(t, env.OK, env.Error)
		return env.Result
	}
	// The user, in the panel, removes A and locks C while the model works.
	list := f.list(t)
	require.NoError(t, f.ws.DeletePreference(ctx, list[0].ID))
	_, err = f.ws.UpdatePreference(ctx, list[2].ID, PreferencePatch{Locked: boolPtr(true)})
	require.NoError(t, err)

	require.Equal(t, `updated #2 "B2"`, run(UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 2, "title": "B2"}}}))
	require.Equal(t, `updated #2 "B2"`, run(UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 2, "kind": "hard"}}}),
		"the round's own change is no change since the model was shown B")
	require.Equal(t, `removed #4 "D"; locked, ask the user to unlock first: #3 "C"; changed since it was shown; call list_preferences: #1 "A"`,
		run(RemovePreferences, map[string]any{"indices": []int{4, 3, 1}}))
	require.Equal(t, "recorded 1 preference; already recorded: #1 \"B2\"", run(AddPreferences, add(item{Title: "E"}, item{Title: "b2"})))
	require.Equal(t, []string{"B2", "C", "E"}, f.titles(t))

	// The next round names the list as this one left it: B2, C, E.
	view.NextRound()
	require.Equal(t, `updated #3 "E2"`, run(UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 3, "title": "E2"}}}))
	// A user's addition, then list_preferences: the calls after it name the list it showed.
	_, err = f.ws.AddPreference(ctx, PreferenceInput{Title: "F"})
	require.NoError(t, err)
	require.Equal(t, `no matching preferences found; out of range: #4`, run(RemovePreferences, map[string]any{"indices": []int{4}}))
	require.Equal(t, "#1 [hard] B2\n#2 [soft] C (locked)\n#3 [soft] E2\n#4 [soft] F", run(ListPreferences, map[string]any{}))
	require.Equal(t, `removed #4 "F"`, run(RemovePreferences, map[string]any{"indices": []int{4}}))
	require.Equal(t, []string{"B2", "C", "E2"}, f.titles(t))
}
