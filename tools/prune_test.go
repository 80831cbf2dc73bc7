package tools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
)

// TestPruneNeverDeadlocksADelete: the history prune and DELETE of a thread lock the thread's
// event rows in their own orders — the cascade by id, a prune of a large table (a sequential
// scan) in the rows' physical order — yet neither fails on a deadlock: the prune waits for no
// row another holds (it leaves those to its next run).
func TestPruneNeverDeadlocksADelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, cfg := dbtest.Schema(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	poolAs := func(app string, params map[string]string) *pgxpool.Pool {
		c := cfg.Copy()
		c.ConnConfig.RuntimeParams["application_name"] = app + "-" + tag
		for k, v := range params {
			c.ConnConfig.RuntimeParams[k] = v
		}
		p, err := pgxpool.NewWithConfig(ctx, c)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	pool := poolAs("holder", nil)
	require.NoError(t, db.Migrate(ctx, pool))
	f := setupOn(t, pool, Limits{})
	// Two old events whose physical order is the reverse of their ids'.
	_, err := pool.Exec(ctx, `INSERT INTO events (thread_id, id, at, actor, via, kind, target_type)
		VALUES ('t1', 2, now() - interval '2 days', 'user', 'admin', 'objective_set', 'objective'),
		       ('t1', 1, now() - interval '2 days', 'user', 'admin', 'objective_set', 'objective')`)
	require.NoError(t, err)
	deleter := NewStore(poolAs("deleter", nil), Options{Timeout: time.Minute}).Workspace(f.ws.ThreadID())
	// The plan of a prune of many rows: a sequential scan.
	pruner := NewStore(poolAs("pruner", map[string]string{"enable_indexscan": "off", "enable_bitmapscan": "off"}), Options{Timeout: time.Minute})

	// A reader holds event 1: the delete's cascade queues on it first, then the prune, which
	// already holds event 2.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT 1 FROM events WHERE thread_id = 't1' AND id = 1 FOR SHARE`)
	require.NoError(t, err)
	waiting := func(app string) bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
			app+"-"+tag).Scan(&n))
		return n > 0
	}
	deleted := make(chan error, 1)
	go func() { deleted <- deleter.Delete(ctx) }()
	require.Eventually(t, func() bool { return waiting("deleter") }, time.Minute, 10*time.Millisecond)
	pruned := make(chan error, 1)
	go func() { _, err := pruner.PruneHistory(ctx, time.Now().Add(-24*time.Hour)); pruned <- err }()
	require.Eventually(t, func() bool { return waiting("pruner") || len(pruned) > 0 }, time.Minute, 10*time.Millisecond)
	require.NoError(t, holder.Commit(ctx))

	require.NoError(t, <-deleted, "the delete")
	require.NoError(t, <-pruned, "the prune")
	_, err = f.ws.Get(ctx)
	require.ErrorIs(t, err, ErrNotFound)
}
