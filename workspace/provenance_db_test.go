package workspace_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// TestUntrustedProposalsAreBounded: at most MaxPendingProposals wait per workspace; past that, a
// tainted turn's ungrounded write is told as a refused one and counted over the limit; a proposal
// equal to one that waits is not made again (docs/spec.md §19).
func TestUntrustedProposalsAreBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	view := tools.NewView(f.turn)
	view.SetReading(func() Reading {
		r := Reading{UserTexts: []string{"Read the page"}}
		r.Read(Part{Type: SourceToolResult, Tool: "fetch", CallID: "call_1"})
		return r
	})
	run := func(title string) tools.Result {
		t.Helper()
		res, err := tools.Run(ctx, f.ws, tools.Call{Turn: f.turn.Number, Round: 1, Name: tools.AddPreferences, View: view,
			Arguments: `{"items":[{"title":` + strconv.Quote(title) + `}]}`})
		require.NoError(t, err)
		require.True(t, res.OK, res.Text)
		return res
	}
	for i := range MaxPendingProposals {
		require.Equal(t, tools.OutcomeProposed, run("Mirror "+strconv.Itoa(i)).Untrusted)
	}
	res := run("Mirror 0")
	require.Equal(t, tools.OutcomeProposed, res.Untrusted)
	require.Contains(t, res.Text, "already proposed, for the user to review")
	res = run("One more mirror")
	require.Equal(t, tools.OutcomeOverLimit, res.Untrusted)
	require.True(t, strings.HasPrefix(res.Text, "not recorded: this turn read content the user did not write; the user can add it in the panel; "), res.Text)
	pending, err := f.ws.PendingProposals(ctx, 50)
	require.NoError(t, err)
	require.Len(t, pending, MaxPendingProposals)
	require.Empty(t, f.list(t))
	var c WriteContext
	require.NoError(t, json.Unmarshal(pending[1].Context, &c))
	require.Equal(t, tools.RuleAfterUngrounded, c.Rule, "every write after the turn's first ungrounded one")
}
