package workspace_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// TestNoteCompaction: a client's compaction is an event of the thread's history — kind
// compaction, by the client via the proxy, target the thread, no turn, nothing before or after —
// numbered on from the thread's events; it changes nothing of the workspace, the next turn's
// block is the same, and reverting, applying or dismissing it is a *ValidationError.
func TestNoteCompaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "Trains", Kind: "hard"}))
	f.lock(t, 1)
	f.ok(t, tools.SetObjective, map[string]any{"text": "Lisbon"})
	before, err := f.ws.Get(ctx)
	require.NoError(t, err)

	require.NoError(t, f.ws.NoteCompaction(ctx))
	evs := f.events(t)
	require.Len(t, evs, 4)
	ev := evs[3]
	require.Equal(t, int64(4), ev.ID)
	require.Equal(t, Compaction, ev.Kind)
	require.Equal(t, ByClient, ev.Actor)
	require.Equal(t, ViaProxy, ev.Via)
	require.Equal(t, Target{Type: TargetThread}, ev.Target)
	require.Nil(t, ev.Turn, "a compaction is no turn of the loop")
	require.Nil(t, ev.Round)
	require.Nil(t, ev.ToolCallID)
	require.Nil(t, ev.Reason)
	require.JSONEq(t, "null", string(ev.Before))
	require.JSONEq(t, "null", string(ev.After))
	b, err := json.Marshal(ev)
	require.NoError(t, err)
	require.JSONEq(t, `{"id":4,"thread":"t1","at":"`+ev.At.Format(time.RFC3339Nano)+`","actor":"client","via":"proxy",
		"turn":null,"round":null,"tool_call_id":null,"reason":null,"kind":"compaction","target":{"type":"thread"},"before":null,"after":null}`, string(b))

	after, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Objective, after.Objective)
	require.Equal(t, before.Preferences, after.Preferences)
	require.Equal(t, before.Block, after.Block)
	summary, err := f.ws.Summary(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, summary.Turns, "no turn number taken")
	next, err := f.ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, f.turn.Number+1, next.Number)
	require.Equal(t, before.Block, next.Block(), "the locked item survives the compaction")

	for name, op := range map[string]func(context.Context, int64) (Event, error){
		"revert": f.ws.RevertEvent, "apply": f.ws.ApplyProposal, "dismiss": f.ws.DismissProposal,
	} {
		_, err := op(ctx, ev.ID)
		var verr *ValidationError
		require.ErrorAs(t, err, &verr, name)
	}
	_, err = f.ws.RevertEvent(ctx, ev.ID)
	require.ErrorContains(t, err, "changed nothing")
	require.Len(t, f.events(t), 4, "nothing written by the refusals")
}

// TestNoteCompactionCreatesTheThread: the compaction of a thread that does not exist creates it,
// with no turn, and numbers its event past the tombstone of a deleted thread of the same id.
func TestNoteCompactionCreatesTheThread(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()

	fresh := f.store.Workspace(ThreadID{Name: "compacted-first"})
	require.NoError(t, fresh.NoteCompaction(ctx))
	summary, err := fresh.Summary(ctx)
	require.NoError(t, err)
	require.Zero(t, summary.Turns)
	evs, err := fresh.Events(ctx, EventQuery{Limit: 10})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, int64(1), evs[0].ID)
	require.Equal(t, Compaction, evs[0].Kind)
	start, err := fresh.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, start.Number, "the thread's first turn")

	f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}))
	require.NoError(t, f.ws.Delete(ctx))
	require.NoError(t, f.ws.NoteCompaction(ctx))
	evs, err = f.ws.Events(ctx, EventQuery{Limit: 10})
	require.NoError(t, err)
	require.Len(t, evs, 1, "the deleted thread's history is gone")
	require.Equal(t, int64(3), evs[0].ID, "past the tombstone: ids are never reused")
	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Empty(t, d.Preferences)
}

// TestNoteCompactionsAtOnce: compactions of a new thread at once, beside a user's edits, create
// it once and take every event id once, in order.
func TestNoteCompactionsAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ws := f.store.Workspace(ThreadID{Name: "raced"})
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() { errs <- ws.NoteCompaction(ctx) })
		wg.Go(func() {
			_, err := ws.AddPreference(ctx, PreferenceInput{Title: "P" + string(rune('a'+i))})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	evs, err := ws.Events(ctx, EventQuery{Limit: 100})
	require.NoError(t, err)
	require.Len(t, evs, 2*n)
	compactions := 0
	for i, ev := range evs {
		require.Equal(t, int64(i+1), ev.ID)
		if ev.Kind == Compaction {
			compactions++
		}
	}
	require.Equal(t, n, compactions)
}
