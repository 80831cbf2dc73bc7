package workspace_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	. "github.com/wsproxy/wsproxy/workspace"
)

// hookTracer runs hook once, before the first statement of its pool whose SQL contains match,
// once armed.
type hookTracer struct {
	armed atomic.Bool
	match string
	hook  func()
}

func (h *hookTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, h.match) && h.armed.CompareAndSwap(true, false) {
		h.hook()
	}
	return ctx
}
func (h *hookTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestGetReadsOneSnapshot: Get reads the thread, its objective and its preferences as they stood
// at one moment: two edits that commit while it reads (the objective changed, then a preference
// added) are both seen or both not, never a new list beside the old objective.
func TestGetReadsOneSnapshot(t *testing.T) {
	t.Parallel()
	hook := &hookTracer{match: "FROM preferences WHERE thread_id"}
	pool := dbtest.NewPool(t, &dbtest.Options{Tracer: hook})
	f := setupOn(t, pool, Options{})
	ctx := context.Background()
	_, err := f.ws.SetObjective(ctx, "Old goal")
	require.NoError(t, err)

	cfg := pool.Config().Copy()
	cfg.ConnConfig.Tracer = nil
	other, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(other.Close)
	editor := NewStore(other, Options{}).Workspace(f.ws.ThreadID())
	hook.hook = func() { // between Get's read of the objective and of the preferences
		_, err := editor.SetObjective(ctx, "New goal")
		require.NoError(t, err)
		_, err = editor.AddPreference(ctx, PreferenceInput{Title: "Added with the new goal"})
		require.NoError(t, err)
	}
	hook.armed.Store(true)
	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.False(t, hook.armed.Load(), "the edits ran while Get read")
	if d.Objective.Text == "Old goal" {
		require.Empty(t, d.Preferences, "the old objective beside the new list: a workspace that never was")
	} else {
		require.Len(t, d.Preferences, 1)
	}
	require.Equal(t, RenderBlock(d.Objective.Text, d.Preferences, nil), d.Block)
}

// TestBlockAsATurnStarts: Block is the block a turn of the thread would start with — the
// workspace as it stands, or the empty workspace's for a thread that does not exist (nothing is
// made).
func TestBlockAsATurnStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	_, err := f.ws.SetObjective(ctx, "Plan a trip")
	require.NoError(t, err)
	block, err := f.ws.Block(ctx)
	require.NoError(t, err)
	next, err := f.ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, next.Block(), block)
	require.Contains(t, block, "Plan a trip")

	none := f.store.Workspace(ThreadID{Name: "none"})
	block, err = none.Block(ctx)
	require.NoError(t, err)
	require.Equal(t, RenderBlock("", nil, nil), block)
	_, err = none.Get(ctx)
	require.ErrorIs(t, err, ErrNotFound, "no thread is made")
}
