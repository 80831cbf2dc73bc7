package workspace_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// TestIDsNeverReusedForAThreadID: a thread deleted and created again (by its next turn, or by a
// user's edit) goes on numbering its events and preferences after the deleted thread's: a
// stream resuming with the last event id it saw misses none of the new thread's events, and a
// revert or an edit of an id an open panel still shows names nothing of the new thread.
func TestIDsNeverReusedForAThreadID(t *testing.T) {
	t.Parallel()
	for name, recreate := range map[string]func(t *testing.T, ws *Workspace){
		"ByATurn": func(t *testing.T, ws *Workspace) {
			_, err := ws.StartTurn(context.Background(), TurnOptions{})
			require.NoError(t, err)
		},
		"ByAUserEdit": func(t *testing.T, ws *Workspace) {
			_, err := ws.SetObjective(context.Background(), "A new goal")
			require.NoError(t, err)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}))
			f.ok(t, tools.SetObjective, map[string]any{"text": "A goal"})
			old := f.events(t)
			require.Len(t, old, 3)
			lastEvent, oldPref := old[2].ID, f.list(t)[1].ID
			require.NoError(t, f.ws.Delete(ctx))

			recreate(t, f.ws)
			p, err := f.ws.AddPreference(ctx, PreferenceInput{Title: "C"})
			require.NoError(t, err)
			require.Greater(t, p.ID, oldPref, "a preference id of the deleted thread")
			evs, err := f.ws.Events(ctx, EventQuery{After: lastEvent, Limit: 10})
			require.NoError(t, err)
			require.NotEmpty(t, evs, "a stream resuming after the deleted thread's last event misses the new thread's")
			for _, e := range evs {
				require.Greater(t, e.ID, lastEvent)
			}
			_, err = f.ws.RevertEvent(ctx, old[0].ID)
			require.ErrorIs(t, err, ErrNotFound, "a revert of the deleted thread's event")
			_, err = f.ws.UpdatePreference(ctx, old[0].Target.ID, PreferencePatch{Title: strPtr("Z")})
			require.ErrorIs(t, err, ErrNotFound, "an edit of the deleted thread's preference")
		})
	}
}

// TestATurnOfADeletedThreadWritesNothingToItsSuccessor: a turn whose thread was deleted and
// created again while it ran runs its remaining calls against nothing: the new thread is not
// the workspace its model was shown.
func TestATurnOfADeletedThreadWritesNothingToItsSuccessor(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	require.NoError(t, f.ws.Delete(ctx))
	_, err := f.ws.AddPreference(ctx, PreferenceInput{Title: "The new thread's"})
	require.NoError(t, err)

	view := tools.NewView(f.turn) // the old turn's
	for _, c := range []struct{ tool, args string }{
		{tools.RemovePreferences, `{"indices":[1]}`},
		{tools.AddPreferences, `{"items":[{"title":"From the old turn"}]}`},
		{tools.SetObjective, `{"text":"From the old turn"}`},
	} {
		res, err := tools.Run(ctx, f.ws, tools.Call{Turn: f.turn.Number, Round: 1, Name: c.tool, Arguments: c.args, View: view})
		require.NoError(t, err)
		require.Equal(t, `{"ok":false,"error":"this thread's workspace was deleted; nothing was recorded"}`, res.Content, "%s ran against the new thread", c.tool)
	}
	require.Equal(t, []string{"The new thread's"}, f.titles(t))
	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Nil(t, d.Objective)
	calls, err := f.ws.ToolCalls(ctx, 0, 10)
	require.NoError(t, err)
	require.Empty(t, calls, "the old turn's calls are not recorded on the new thread")
}

// TestIDsNeverReusedWhenCreatedDuringADelete: a thread created again while the DELETE of its id
// is under way (its creation waits for it) still numbers its ids past the deleted thread's.
func TestIDsNeverReusedWhenCreatedDuringADelete(t *testing.T) {
	t.Parallel()
	for name, create := range map[string]func(ws *Workspace) error{
		"ByATurn": func(ws *Workspace) error { _, err := ws.StartTurn(context.Background(), TurnOptions{}); return err },
		"ByAUserEdit": func(ws *Workspace) error {
			_, err := ws.AddPreference(context.Background(), PreferenceInput{Title: "C"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, cfg := dbtest.Schema(t)
			cfg.ConnConfig.RuntimeParams["application_name"] = "creator-" + strings.ToLower(name) + "-" + cfg.ConnConfig.RuntimeParams["search_path"]
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			require.NoError(t, db.Migrate(ctx, pool))
			f := setupOn(t, pool, Options{})
			f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}))

			deleting, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer deleting.Rollback(ctx)
			n, err := db.New().ThreadDelete(ctx, deleting, "t1")
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			created := make(chan error, 1)
			go func() { created <- create(f.ws) }()
			require.Eventually(t, func() bool {
				var waiting int
				require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE application_name = $1 AND wait_event_type = 'Lock'`, cfg.ConnConfig.RuntimeParams["application_name"]).Scan(&waiting))
				return waiting > 0
			}, time.Minute, 10*time.Millisecond, "the creation waits for the delete")
			require.NoError(t, deleting.Commit(ctx))
			require.NoError(t, <-created)

			last, err := f.ws.LastEventID(ctx)
			require.NoError(t, err)
			require.GreaterOrEqual(t, last, int64(2), "the new thread's event ids start past the deleted thread's")
			f.ok(t, tools.AddPreferences, add(item{Title: "D"}))
			list := f.list(t)
			require.Greater(t, list[len(list)-1].ID, int64(2), "a preference id of the deleted thread")
		})
	}
}

// TestGiveBackOfADeletedThreadsTurn: a turn whose thread was deleted and created again while it
// waited for its model names the thread it began on when it is given back (its first upstream
// round failed): it takes back nothing of the new thread — neither its turn 1 and snapshot, nor
// the thread itself.
func TestGiveBackOfADeletedThreadsTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, again := range map[string]func(t *testing.T, ws *Workspace){
		"ByATurn": func(*testing.T, *Workspace) {},
		"ByAnEditThenATurn": func(t *testing.T, ws *Workspace) {
			_, err := ws.SetObjective(ctx, "The new thread's")
			require.NoError(t, err)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			old := f.turn
			require.NoError(t, f.ws.Delete(ctx))
			again(t, f.ws)
			turn, err := f.ws.StartTurn(ctx, TurnOptions{})
			require.NoError(t, err)
			require.Equal(t, 1, turn.Number)

			require.NoError(t, f.ws.UndoTurn(ctx, old)) // the old turn's first round failed
			threads, err := f.store.Threads(ctx, "", "", ThreadFilter{}, 10)
			require.NoError(t, err)
			require.Len(t, threads, 1, "the new thread stays")
			require.Equal(t, 1, threads[0].Turns, "the new thread's turn 1 stays counted")
			snaps, err := f.ws.Snapshots(ctx, 0, 10)
			require.NoError(t, err)
			require.Len(t, snaps, 1, "the new thread's snapshot of turn 1 stays")
		})
	}
}
