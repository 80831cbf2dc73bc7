package workspace_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

func (f *fixture) events(t *testing.T) []Event {
	t.Helper()
	evs, err := f.ws.Events(context.Background(), EventQuery{Limit: 500})
	require.NoError(t, err)
	return evs
}

// eventLine is an event as one line: kind, actor, target, before → after.
func eventLine(e Event) string {
	target := e.Target.Type
	if e.Target.ID != 0 {
		target += fmt.Sprintf(":%d", e.Target.ID)
	}
	return fmt.Sprintf("%s %s %s %s → %s", e.Kind, e.Actor, target, e.Before, e.After)
}

func lines(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = eventLine(e)
	}
	return out
}

// TestEventsOfEveryChange: every kind of change writes its events — one per preference a batch
// changes, none for a call or an edit that changes nothing — with ids counting from 1, and the
// agent's carry the turn, round, tool call and reason.
func TestEventsOfEveryChange(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B", Kind: "hard"}, item{Title: "C"}))
	f.ok(t, tools.SetObjective, map[string]any{"text": "Goal", "action_and_reasoning": "The user said so."})
	f.ok(t, tools.SetObjective, map[string]any{"text": "Goal"}) // unchanged: no event
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 1, "title": "A2"}, map[string]any{"index": 2, "kind": "hard"}}})
	f.lock(t, 3)
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{3, 2}, "action_and_reasoning": "Dropping two."})
	f.fails(t, tools.AddPreferences, `{"items":[]}`) // refused: no event
	list := f.list(t)
	_, err := f.ws.UpdatePreference(ctx, list[0].ID, PreferencePatch{Title: strPtr("A3"), Locked: boolPtr(true)})
	require.NoError(t, err)
	_, err = f.ws.UpdatePreference(ctx, list[0].ID, PreferencePatch{Locked: boolPtr(false)})
	require.NoError(t, err)
	_, err = f.ws.UpdatePreference(ctx, list[0].ID, PreferencePatch{Title: strPtr("A3")}) // unchanged
	require.NoError(t, err)
	_, err = f.ws.SetObjective(ctx, "User goal")
	require.NoError(t, err)
	p, err := f.ws.AddPreference(ctx, PreferenceInput{Title: "D"})
	require.NoError(t, err)
	require.NoError(t, f.ws.DeletePreference(ctx, p.ID))

	evs := f.events(t)
	require.Equal(t, []string{
		`preference_added agent preference:1 null → {"title":"A","subtitle":"","kind":"soft","locked":false,"source":"agent"}`,
		`preference_added agent preference:2 null → {"title":"B","subtitle":"","kind":"hard","locked":false,"source":"agent"}`,
		`preference_added agent preference:3 null → {"title":"C","subtitle":"","kind":"soft","locked":false,"source":"agent"}`,
		`objective_set agent objective null → {"text":"Goal","source":"agent"}`,
		`preference_updated agent preference:1 {"title":"A","subtitle":"","kind":"soft","locked":false,"source":"agent"} → {"title":"A2","subtitle":"","kind":"soft","locked":false,"source":"agent"}`,
		`preference_locked user preference:3 {"title":"C","subtitle":"","kind":"soft","locked":false,"source":"agent"} → {"title":"C","subtitle":"","kind":"soft","locked":true,"source":"confirmed"}`,
		`preference_removed agent preference:2 {"title":"B","subtitle":"","kind":"hard","locked":false,"source":"agent"} → null`,
		`locked_skip agent preference:3 {"title":"C","subtitle":"","kind":"soft","locked":true,"source":"confirmed"} → {"title":"C","subtitle":"","kind":"soft","locked":true,"source":"confirmed"}`,
		`preference_updated user preference:1 {"title":"A2","subtitle":"","kind":"soft","locked":false,"source":"agent"} → {"title":"A3","subtitle":"","kind":"soft","locked":true,"source":"user"}`,
		`preference_unlocked user preference:1 {"title":"A3","subtitle":"","kind":"soft","locked":true,"source":"user"} → {"title":"A3","subtitle":"","kind":"soft","locked":false,"source":"user"}`,
		`objective_set user objective {"text":"Goal","source":"agent"} → {"text":"User goal","source":"user"}`,
		`preference_added user preference:4 null → {"title":"D","subtitle":"","kind":"soft","locked":false,"source":"user"}`,
		`preference_removed user preference:4 {"title":"D","subtitle":"","kind":"soft","locked":false,"source":"user"} → null`,
	}, lines(evs))
	for i, e := range evs {
		require.Equal(t, int64(i+1), e.ID)
		require.Equal(t, "t1", e.Thread)
		if e.Actor == ByAgent {
			require.NotNil(t, e.ToolCallID)
			require.Equal(t, f.turn.Number, *e.Turn)
			require.Equal(t, 1, *e.Round)
			require.NotNil(t, e.Reason)
		} else {
			require.Nil(t, e.Turn)
			require.Nil(t, e.ToolCallID)
			require.Nil(t, e.Reason)
		}
	}
	require.Equal(t, "The user said so.", *evs[3].Reason)
	// The three events of one batch share its tool call; the removal's two theirs.
	require.Equal(t, *evs[0].ToolCallID, *evs[2].ToolCallID)
	require.Equal(t, *evs[6].ToolCallID, *evs[7].ToolCallID)
	require.NotEqual(t, *evs[0].ToolCallID, *evs[6].ToolCallID)
	calls, err := f.ws.ToolCalls(ctx, 0, 100)
	require.NoError(t, err)
	byID := map[int64]ToolCallRecord{}
	for _, c := range calls {
		byID[c.ID] = c
	}
	require.Equal(t, tools.RemovePreferences, byID[*evs[6].ToolCallID].Tool)
	require.Equal(t, "Dropping two.", *evs[6].Reason)

	// Filters and order.
	obj := Target{Type: TargetObjective}
	got, err := f.ws.Events(ctx, EventQuery{Target: &obj, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []int64{4, 11}, ids(got))
	got, err = f.ws.Events(ctx, EventQuery{Descending: true, Limit: 3})
	require.NoError(t, err)
	require.Equal(t, []int64{13, 12, 11}, ids(got))
	got, err = f.ws.Events(ctx, EventQuery{Descending: true, After: 11, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{10, 9}, ids(got))
	last, err := f.ws.LastEventID(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(13), last)
}

// TestReasonKeptToMaxReason: a reason is kept up to 1,000 characters.
func TestReasonKeptToMaxReason(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.ok(t, tools.SetObjective, map[string]any{"text": "Goal", "action_and_reasoning": strings.Repeat("é", 1500)})
	require.Equal(t, MaxReason, len([]rune(*f.events(t)[0].Reason)))
}

func ids(evs []Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

func strPtr(s string) *string { return &s }
func boolPtr(b bool) *bool    { return &b }

// TestRevert: each kind of change reverts to its before state as a user change; a change whose
// target changed again since is a 409 naming the later event; a locked_skip reverts nothing.
func TestRevert(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "Trains"}, item{Title: "Hotels"}))                                        // 1, 2
	f.ok(t, tools.SetObjective, map[string]any{"text": "Lisbon"})                                                           // 3
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 2, "title": "Small hotels"}}}) // 4
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{1}})                                                   // 5

	// The removal of "Trains" comes back with its old id and place.
	ev, err := f.ws.RevertEvent(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, Revert, ev.Kind)
	require.Equal(t, int64(5), *ev.Reverts)
	require.Equal(t, ByUser, ev.Actor)
	require.Equal(t, "null", string(ev.Before))
	// It comes back with the source it had: the agent's (docs/spec.md §19).
	require.JSONEq(t, `{"title":"Trains","subtitle":"","kind":"soft","locked":false,"source":"agent"}`, string(ev.After))
	list := f.list(t)
	require.Equal(t, int64(1), list[0].ID)
	require.Equal(t, []string{"Trains", "Small hotels"}, f.titles(t))

	// The rename goes back.
	_, err = f.ws.RevertEvent(ctx, 4)
	require.NoError(t, err)
	require.Equal(t, []string{"Trains", "Hotels"}, f.titles(t))
	// The objective goes back to none.
	_, err = f.ws.RevertEvent(ctx, 3)
	require.NoError(t, err)
	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Nil(t, d.Objective)

	// "Trains" changed after its addition (removed, restored): 409 naming the first later event.
	_, err = f.ws.RevertEvent(ctx, 1)
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int64(5), ce.Later)
	require.Equal(t, int64(6), ce.Latest)
	require.Contains(t, err.Error(), "latest: event 6", "the latest change, the one that can be reverted now")

	// A lock, then its revert; a locked_skip reverts nothing; an unknown event is not found.
	f.lock(t, 2)
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{2}})
	evs := f.events(t)
	skip := evs[len(evs)-1]
	require.Equal(t, LockedSkip, skip.Kind)
	var ve *ValidationError
	_, err = f.ws.RevertEvent(ctx, skip.ID)
	require.ErrorAs(t, err, &ve)
	_, err = f.ws.RevertEvent(ctx, evs[len(evs)-2].ID) // the lock: a locked_skip since does not count
	require.NoError(t, err)
	require.False(t, f.list(t)[1].Locked)
	_, err = f.ws.RevertEvent(ctx, 999)
	require.ErrorIs(t, err, ErrNotFound)

	// An added preference is removed by its revert; the revert of that revert brings it back.
	p, err := f.ws.AddPreference(ctx, PreferenceInput{Title: "Museums"})
	require.NoError(t, err)
	last, err := f.ws.LastEventID(ctx)
	require.NoError(t, err)
	r, err := f.ws.RevertEvent(ctx, last)
	require.NoError(t, err)
	require.NotContains(t, f.titles(t), "Museums")
	_, err = f.ws.RevertEvent(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, p.ID, f.list(t)[2].ID)

	// A revert that would duplicate a title: the user path's 409.
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 3, "title": "Gardens"}}})
	renamed, err := f.ws.LastEventID(ctx)
	require.NoError(t, err)
	_, err = f.ws.AddPreference(ctx, PreferenceInput{Title: "Museums"})
	require.NoError(t, err)
	_, err = f.ws.RevertEvent(ctx, renamed)
	var de *DuplicateError
	require.ErrorAs(t, err, &de)
}

// TestRevertThrough: a revert back to before a change, in one step: each later change of its
// target reverted newest first, then that change, each a revert event by the user, in one
// transaction — refused whole (nothing written) when a step cannot be made, or when the target's
// latest change is not the one the caller saw.
func TestRevertThrough(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "Gardens"}, item{Title: "Museums"}))                                           // 1, 2
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 1, "title": "Botanical gardens"}}}) // 3
	f.lock(t, 1)                                                                                                                 // 4
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{1}})                                                        // 5: locked_skip
	gardens := f.list(t)[0].ID
	_, err := f.ws.UpdatePreference(ctx, gardens, PreferencePatch{Subtitle: strPtr("Kew")}) // 6
	require.NoError(t, err)
	lastID := func() int64 {
		id, err := f.ws.LastEventID(ctx)
		require.NoError(t, err)
		return id
	}
	require.Equal(t, int64(6), lastID())

	// The plain revert names the latest change in its way (the locked_skip changed nothing).
	_, err = f.ws.RevertEvent(ctx, 1)
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int64(3), ce.Later)
	require.Equal(t, int64(6), ce.Latest)

	// A caller who saw event 3 as the latest: refused, naming 6; nothing written.
	_, err = f.ws.RevertThrough(ctx, 1, 3)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int64(6), ce.Latest)
	require.Equal(t, int64(6), lastID())
	var ve *ValidationError
	_, err = f.ws.RevertThrough(ctx, 2, 5) // no later change of "Museums": 5 is no latest of its
	require.ErrorAs(t, err, &ve)

	// Through the latest: 6, 4, 3, then 1, each its revert, in id order.
	evs, err := f.ws.RevertThrough(ctx, 1, 6)
	require.NoError(t, err)
	require.Equal(t, []int64{7, 8, 9, 10}, ids(evs))
	var undid []int64
	for _, e := range evs {
		require.Equal(t, Revert, e.Kind)
		require.Equal(t, ByUser, e.Actor)
		require.Equal(t, ViaAdmin, e.Via)
		undid = append(undid, *e.Reverts)
	}
	require.Equal(t, []int64{6, 4, 3, 1}, undid)
	require.Equal(t, []string{
		`revert user preference:1 {"title":"Botanical gardens","subtitle":"Kew","kind":"soft","locked":true,"source":"user"} → {"title":"Botanical gardens","subtitle":"","kind":"soft","locked":true,"source":"confirmed"}`,
		`revert user preference:1 {"title":"Botanical gardens","subtitle":"","kind":"soft","locked":true,"source":"confirmed"} → {"title":"Botanical gardens","subtitle":"","kind":"soft","locked":false,"source":"agent"}`,
		`revert user preference:1 {"title":"Botanical gardens","subtitle":"","kind":"soft","locked":false,"source":"agent"} → {"title":"Gardens","subtitle":"","kind":"soft","locked":false,"source":"agent"}`,
		`revert user preference:1 {"title":"Gardens","subtitle":"","kind":"soft","locked":false,"source":"agent"} → null`,
	}, lines(evs))
	require.Equal(t, []string{"Museums"}, f.titles(t))
	require.Equal(t, evs, f.events(t)[6:], "as listed")

	// Nothing later: the one revert (through=latest is 0).
	evs, err = f.ws.RevertThrough(ctx, 2, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{11}, ids(evs))
	require.Empty(t, f.titles(t))

	// All or nothing: a step whose restored title is taken refuses the whole.
	f.ok(t, tools.AddPreferences, add(item{Title: "Parks"})) // 12
	parks := f.list(t)[0].ID
	_, err = f.ws.UpdatePreference(ctx, parks, PreferencePatch{Title: strPtr("City parks")}) // 13
	require.NoError(t, err)
	_, err = f.ws.AddPreference(ctx, PreferenceInput{Title: "Parks"}) // 14
	require.NoError(t, err)
	_, err = f.ws.RevertThrough(ctx, 12, 0)
	var de *DuplicateError
	require.ErrorAs(t, err, &de)
	require.Equal(t, int64(14), lastID())
	require.Equal(t, []string{"City parks", "Parks"}, f.titles(t))

	// The objective: back to none through two later changes.
	f.ok(t, tools.SetObjective, map[string]any{"text": "Lisbon"}) // 15
	_, err = f.ws.SetObjective(ctx, "Porto")                      // 16
	require.NoError(t, err)
	_, err = f.ws.SetObjective(ctx, "Faro") // 17
	require.NoError(t, err)
	evs, err = f.ws.RevertThrough(ctx, 15, 0)
	require.NoError(t, err)
	require.Equal(t, []string{
		`revert user objective {"text":"Faro","source":"user"} → {"text":"Porto","source":"user"}`,
		`revert user objective {"text":"Porto","source":"user"} → {"text":"Lisbon","source":"agent"}`,
		`revert user objective {"text":"Lisbon","source":"agent"} → null`,
	}, lines(evs))
	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Nil(t, d.Objective)

	// What a revert cannot undo, through cannot either.
	f.lock(t, 1)
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{1}})
	_, err = f.ws.RevertThrough(ctx, lastID(), 0)
	require.ErrorAs(t, err, &ve)
	_, err = f.ws.RevertThrough(ctx, 999, 0)
	require.ErrorIs(t, err, ErrNotFound)
}

// TestEventsUnderConcurrency: agents and users editing one thread at once write exactly one event
// per change, with ids 1..n without a gap, committed in id order.
func TestEventsUnderConcurrency(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	const n = 30
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := tools.Run(ctx, f.ws, tools.Call{Turn: 1, Round: 1, Name: tools.AddPreferences, Arguments: fmt.Sprintf(`{"items":[{"title":"Agent %d"}]}`, i)})
			if err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if _, err := f.ws.AddPreference(ctx, PreferenceInput{Title: fmt.Sprintf("User %d", i)}); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if _, err := f.ws.SetObjective(ctx, fmt.Sprintf("Goal %d", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	evs := f.events(t)
	require.Len(t, evs, 3*n)
	added := map[int64]bool{}
	for i, e := range evs {
		require.Equal(t, int64(i+1), e.ID)
		if e.Kind == PreferenceAdded {
			require.False(t, added[e.Target.ID], "one event per preference")
			added[e.Target.ID] = true
		}
		if i > 0 {
			require.False(t, e.At.Before(evs[i-1].At), "committed in id order")
		}
	}
	require.Len(t, added, 2*n)
	require.Len(t, f.list(t), 2*n)
	var objectives int
	for _, e := range evs {
		if e.Kind == ObjectiveSet {
			objectives++
			var after struct{ Text string }
			require.NoError(t, json.Unmarshal(e.After, &after))
		}
	}
	require.Equal(t, n, objectives)
}

// TestEventsInTheChangesTransaction: a change whose transaction fails leaves no event, and an
// event never outlives its change (a deleted thread takes its history).
func TestEventsInTheChangesTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}))
	// A duplicate title refused by the user path: nothing written, no event.
	_, err := f.ws.AddPreference(ctx, PreferenceInput{Title: "a"})
	require.Error(t, err)
	require.Len(t, f.events(t), 1)
	// A cancelled edit writes neither the change nor its event.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = f.ws.AddPreference(cctx, PreferenceInput{Title: "B"})
	require.Error(t, err)
	require.Len(t, f.events(t), 1)
	require.Equal(t, []string{"A"}, f.titles(t))
	var n int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM events e LEFT JOIN preferences p ON p.thread_id = e.thread_id AND p.id = e.target_id WHERE e.thread_id = 't1' AND p.id IS NULL`).Scan(&n))
	require.Zero(t, n)
	require.NoError(t, f.ws.Delete(ctx))
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE thread_id = 't1'`).Scan(&n))
	require.Zero(t, n)
}

// TestPruneHistory: HISTORY_RETENTION removes events, snapshots and tool-call records older than
// the cutoff, but each thread's last snapshot (the workspace of its later turns).
func TestPruneHistory(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "Old"}))
	_, err := f.ws.StartTurn(ctx, TurnOptions{}) // a second snapshot: the workspace changed
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE events SET at = at - interval '2 days'; UPDATE tool_calls SET created_at = created_at - interval '2 days';
		UPDATE workspace_snapshots SET created_at = created_at - interval '2 days'`)
	require.NoError(t, err)
	_, err = f.ws.AddPreference(ctx, PreferenceInput{Title: "New"})
	require.NoError(t, err)
	p, err := f.store.PruneHistory(ctx, time.Now().Add(-24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, Pruned{Events: 1, Snapshots: 1, ToolCalls: 1}, p)
	require.Equal(t, []string{"preference_added user preference:2 null → " + `{"title":"New","subtitle":"","kind":"soft","locked":false,"source":"user"}`}, lines(f.events(t)))
	snaps, err := f.ws.Snapshots(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, snaps, 1, "the last snapshot stays")
	require.Equal(t, "Old", snaps[0].Preferences[0].Title)
}

// TestLockedSkipKeepsProposal: a locked_skip keeps what the agent asked for — the fields its
// update would have left, or null for a removal — and the other events keep none.
func TestLockedSkipKeepsProposal(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.ok(t, tools.AddPreferences, add(item{Title: "Formal tone", Subtitle: "No slang", Kind: "hard"}, item{Title: "Trains"}))
	f.lock(t, 1)
	f.lock(t, 2)
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 1, "title": "Casual tone"}, map[string]any{"index": 1, "kind": "soft"}}})
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{2}})
	evs := f.events(t)
	var got []string
	for _, e := range evs {
		got = append(got, e.Kind+" "+string(e.Proposed))
	}
	require.Equal(t, []string{
		"preference_added ", "preference_added ", "preference_locked ", "preference_locked ",
		`locked_skip {"title":"Casual tone","subtitle":"No slang","kind":"soft"}`,
		"locked_skip null",
	}, got)
	b, err := json.Marshal(evs[5])
	require.NoError(t, err)
	require.Contains(t, string(b), `"proposed":null`)
	b, err = json.Marshal(evs[0])
	require.NoError(t, err)
	require.NotContains(t, string(b), `"proposed"`)
}

// TestApplyProposal: a locked_skip's proposal applies as a user change — an update's fields with
// the lock kept, a removal removes the item — once: 409 when the item changed since, 400 for an
// event of another kind or a proposal that changes nothing, 404 for an unknown event.
func TestApplyProposal(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "Formal tone", Kind: "hard"}, item{Title: "Trains"}, item{Title: "Museums"}))                    // 1-3
	f.lock(t, 1)                                                                                                                                   // 4
	f.lock(t, 2)                                                                                                                                   // 5
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 1, "title": "Casual tone", "subtitle": "Friendly"}}}) // 6
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{2}})                                                                          // 7

	ev, err := f.ws.ApplyProposal(ctx, 6)
	require.NoError(t, err)
	require.Equal(t, `preference_updated user preference:1 {"title":"Formal tone","subtitle":"","kind":"hard","locked":true,"source":"confirmed"} → {"title":"Casual tone","subtitle":"Friendly","kind":"hard","locked":true,"source":"confirmed"}`, eventLine(ev))
	require.Equal(t, int64(8), ev.ID)
	require.True(t, f.list(t)[0].Locked, "the lock stays")

	// Applied once: event 8 answered it.
	_, err = f.ws.ApplyProposal(ctx, 6)
	var ae *AnsweredError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, int64(8), ae.By)
	require.Contains(t, err.Error(), "event 8")

	// A removal's proposal removes the locked item.
	ev, err = f.ws.ApplyProposal(ctx, 7)
	require.NoError(t, err)
	require.Equal(t, PreferenceRemoved, ev.Kind)
	require.Equal(t, ByUser, ev.Actor)
	require.Equal(t, []string{"Casual tone", "Museums"}, f.titles(t))

	var ve *ValidationError
	_, err = f.ws.ApplyProposal(ctx, 1) // not a locked_skip
	require.ErrorAs(t, err, &ve)
	_, err = f.ws.ApplyProposal(ctx, 999)
	require.ErrorIs(t, err, ErrNotFound)

	// A proposal equal to the item as it stands changes nothing.
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 1, "kind": "hard"}}})
	last, err := f.ws.LastEventID(ctx)
	require.NoError(t, err)
	_, err = f.ws.ApplyProposal(ctx, last)
	require.ErrorAs(t, err, &ve)

	// A proposal whose title another item took since: the user path's 409.
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 1, "title": "Gardens"}}})
	last, err = f.ws.LastEventID(ctx)
	require.NoError(t, err)
	_, err = f.ws.UpdatePreference(ctx, f.list(t)[1].ID, PreferencePatch{Title: strPtr("Gardens")})
	require.NoError(t, err)
	_, err = f.ws.ApplyProposal(ctx, last)
	var de *DuplicateError
	require.ErrorAs(t, err, &de)
}
