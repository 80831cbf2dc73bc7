package workspace_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// TestContinuationOwesItsOwnTurnsOutput: an upstream that reuses call ids (a stateless server
// numbering each response's calls from call_1) gives two turns' workspace calls one id; a
// continuation of the first turn is owed the output of its own call, not the later turn's.
func TestContinuationOwesItsOwnTurnsOutput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	run := func(turn int, args string) string {
		res, err := tools.Run(ctx, f.ws, tools.Call{Turn: turn, Round: 1, ID: "call_1", Name: tools.SetObjective, Arguments: args})
		require.NoError(t, err)
		return res.Content
	}
	first := run(f.turn.Number, `{"text":"Plan a trip"}`)
	require.NoError(t, f.ws.RecordResponseTurn(ctx, f.turn.Number, "resp_a", "resp_a", []string{"call_1"}, nil, ""))
	next, err := f.ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	later := run(next.Number, `{"text":"Plan a longer trip"}`)
	require.NotEqual(t, first, later)
	require.NoError(t, f.ws.RecordResponseTurn(ctx, next.Number, "resp_b", "resp_b", []string{"call_1"}, nil, ""))

	for id, want := range map[string]string{"resp_a": first, "resp_b": later} {
		c, err := f.ws.Continuation(ctx, id)
		require.NoError(t, err)
		require.Equal(t, []OwedOutput{{CallID: "call_1", Output: want}}, c.Owed, "the continuation of %s", id)
	}
}
