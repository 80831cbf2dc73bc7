package workspace_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// TestCallsNameTheViewShown: on a real thread, a round's calls name the list of the turn's start
// whatever the user and the round's earlier calls did since; list_preferences shows the list
// anew for the calls after it; the next round names the round's view with its own calls applied.
func TestCallsNameTheViewShown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}, item{Title: "C"}, item{Title: "D"}))
	start, err := f.ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	view := tools.NewView(start)
	run := func(tool string, args any) string {
		t.Helper()
		b, _ := json.Marshal(args)
		res, err := tools.Run(ctx, f.ws, tools.Call{Turn: start.Number, Round: 1, Name: tool, Arguments: string(b), View: view})
		require.NoError(t, err)
		var env tools.Envelope
		require.NoError(t, json.Unmarshal([]byte(res.Content), &env))
		require.True(t, env.OK, env.Error)
		return env.Result
	}
	// The user, in the panel, removes A and locks C while the model works.
	list := f.list(t)
	require.NoError(t, f.ws.DeletePreference(ctx, list[0].ID))
	_, err = f.ws.UpdatePreference(ctx, list[2].ID, PreferencePatch{Locked: boolPtr(true)})
	require.NoError(t, err)

	require.Equal(t, `updated #2 "B2"`, run(tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 2, "title": "B2"}}}))
	require.Equal(t, `updated #2 "B2"`, run(tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 2, "kind": "hard"}}}),
		"the round's own change is no change since the model was shown B")
	require.Equal(t, `removed #4 "D"; locked, ask the user to unlock first: #3 "C"; changed since it was shown; call list_preferences: #1 "A"`,
		run(tools.RemovePreferences, map[string]any{"indices": []int{4, 3, 1}}))
	require.Equal(t, "recorded 1 preference; already recorded: #1 \"B2\"", run(tools.AddPreferences, add(item{Title: "E"}, item{Title: "b2"})))
	require.Equal(t, []string{"B2", "C", "E"}, f.titles(t))

	// The next round names the list as the model knows it: the round's view with its own calls
	// applied (the user's removal of A was never shown it): A, B2, C, E.
	view.NextRound()
	require.Equal(t, `updated #4 "E2"`, run(tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 4, "title": "E2"}}}))
	// A user's addition, then list_preferences: the calls after it name the list it showed.
	_, err = f.ws.AddPreference(ctx, PreferenceInput{Title: "F"})
	require.NoError(t, err)
	require.Equal(t, `no matching preferences found; out of range: #5`, run(tools.RemovePreferences, map[string]any{"indices": []int{5}}))
	require.Equal(t, "#1 [hard] B2\n#2 [soft] C (locked)\n#3 [soft] E2\n#4 [soft] F", run(tools.ListPreferences, map[string]any{}))
	require.Equal(t, `removed #4 "F"`, run(tools.RemovePreferences, map[string]any{"indices": []int{4}}))
	require.Equal(t, []string{"B2", "C", "E2"}, f.titles(t))
}

// TestALaterRoundNamesWhatTheModelSaw: a later round's indices name the previous round's view
// with that round's own calls applied, never a user's edit that committed during the round (the
// model never saw it): with A, B, C shown, round 2's "#1" after round 1 removed A is B as the
// model knows it. A user's removal or rewrite of B during round 1 is reported in round 2, never
// redirected onto C or overwritten; a refused call moves the view on to nothing new either.
func TestALaterRoundNamesWhatTheModelSaw(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		user      func(f *fixture, b Preference) error
		round1    []tools.Call // the round's calls (Name, Arguments)
		round2    tools.Call
		wantText  string
		wantAfter []string
	}{
		"UserRemovesB": {
			user:      func(f *fixture, b Preference) error { return f.ws.DeletePreference(context.Background(), b.ID) },
			round1:    []tools.Call{{Name: tools.RemovePreferences, Arguments: `{"indices":[1]}`}},
			round2:    tools.Call{Name: tools.UpdatePreferences, Arguments: `{"updates":[{"index":1,"title":"Renamed"}]}`},
			wantText:  `changed since it was shown; call list_preferences: #1 "B"`,
			wantAfter: []string{"C"},
		},
		"UserRewritesB": {
			user: func(f *fixture, b Preference) error {
				_, err := f.ws.UpdatePreference(context.Background(), b.ID, PreferencePatch{Title: strPtr("B, the user's")})
				return err
			},
			round1:    []tools.Call{{Name: tools.RemovePreferences, Arguments: `{"indices":[1]}`}},
			round2:    tools.Call{Name: tools.UpdatePreferences, Arguments: `{"updates":[{"index":1,"title":"Renamed"}]}`},
			wantText:  `changed since it was shown; call list_preferences: #1 "B"`,
			wantAfter: []string{"B, the user's", "C"},
		},
		"RefusedCall": {
			user:      func(f *fixture, b Preference) error { return f.ws.DeletePreference(context.Background(), b.ID) },
			round1:    []tools.Call{{Name: tools.UpdatePreferences, Arguments: `{"updates":[]}`}},
			round2:    tools.Call{Name: tools.RemovePreferences, Arguments: `{"indices":[2]}`},
			wantText:  `changed since it was shown; call list_preferences: #2 "B"`,
			wantAfter: []string{"A", "C"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}, item{Title: "C"}))
			start, err := f.ws.StartTurn(ctx, TurnOptions{})
			require.NoError(t, err)
			view := tools.NewView(start) // A, B, C
			require.NoError(t, tt.user(f, f.list(t)[1]), "the user's edit of B during round 1")
			for _, c := range tt.round1 {
				c.Turn, c.Round, c.View = start.Number, 1, view
				_, err := tools.Run(ctx, f.ws, c)
				require.NoError(t, err)
			}
			view.NextRound()
			c := tt.round2
			c.Turn, c.Round, c.View = start.Number, 2, view
			res, err := tools.Run(ctx, f.ws, c)
			require.NoError(t, err)
			require.Contains(t, res.Text, tt.wantText, "round 2's index names B as the model was shown it")
			require.Equal(t, tt.wantAfter, f.titles(t), "nothing but what the model named is touched")
		})
	}
}

// TestAsOfRebuildsTheListOfThatChange: an MCP call's as_of names the list as it stood after that
// event, rebuilt from the events since: a preference added since has no index in it, one
// rewritten or removed since is reported; once the events after it are pruned, as_of is refused.
func TestAsOfRebuildsTheListOfThatChange(t *testing.T) {
	t.Parallel()
	f := setupOn(t, dbtest.NewPool(t, nil), Options{UntrustedWrites: UntrustedApply}) // MCP's writes apply (docs/spec.md §19)
	ctx := context.Background()
	mcp := func(tool, args string) tools.Result {
		t.Helper()
		res, err := tools.Run(ctx, f.ws, tools.Call{Name: tool, Arguments: args, Via: ViaMCP})
		require.NoError(t, err)
		return res
	}
	mcp(tools.AddPreferences, `{"items":[{"title":"A"},{"title":"B"},{"title":"C"}]}`)
	listed := mcp(tools.ListPreferences, `{}`).Text
	n, err := f.ws.LastEventID(ctx)
	require.NoError(t, err)
	// Applied under apply, from calls no user message vouches for: unconfirmed (docs/spec.md §19).
	require.Equal(t, tools.AsOfChange("#1 [soft] A (unconfirmed)\n#2 [soft] B (unconfirmed)\n#3 [soft] C (unconfirmed)", n), listed)
	// Since then: the user adds Z before A's removal and rewrites C; the agent adds D.
	list := f.list(t)
	_, err = f.ws.AddPreference(ctx, PreferenceInput{Title: "Z"})
	require.NoError(t, err)
	require.NoError(t, f.ws.DeletePreference(ctx, list[0].ID))
	_, err = f.ws.UpdatePreference(ctx, list[2].ID, PreferencePatch{Title: strPtr("C, the user's")})
	require.NoError(t, err)
	mcp(tools.AddPreferences, `{"items":[{"title":"D"}]}`)

	asOf := func(args string) string { return `{"as_of":` + strconv.FormatInt(n, 10) + `,` + args[1:] }
	res := mcp(tools.RemovePreferences, asOf(`{"indices":[1,3,4]}`))
	require.True(t, res.OK, res.Text)
	require.Equal(t, `changed since it was shown; call list_preferences: #1 "A", #3 "C"; out of range: #4`, res.Text)
	res = mcp(tools.UpdatePreferences, asOf(`{"updates":[{"index":2,"kind":"hard"}]}`))
	require.Equal(t, `updated #2 "B"`, res.Text)
	require.Equal(t, []string{"B", "C, the user's", "Z", "D"}, f.titles(t))

	_, err = f.store.PruneHistory(ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	res = mcp(tools.RemovePreferences, asOf(`{"indices":[2]}`))
	require.False(t, res.OK)
	require.Contains(t, res.Text, "as_of")
	require.Equal(t, []string{"B", "C, the user's", "Z", "D"}, f.titles(t), "nothing written")
}
