package workspace_test

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
	. "github.com/wsproxy/wsproxy/workspace"
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
	f := setupOn(t, pool, Options{})
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

// TestPruneWaitsForNoHeldRow: of every table it prunes, the history prune leaves the rows
// another transaction holds (a thread's DELETE, whose cascade locks them in its own order) to
// its next run, rather than waiting for them: it prunes the rest and returns.
func TestPruneWaitsForNoHeldRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, cfg := dbtest.Schema(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	app := "pruner-" + hex.EncodeToString(b[:])
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, db.Migrate(ctx, pool))
	setupOn(t, pool, Options{})
	_, err = pool.Exec(ctx, `INSERT INTO response_turns (thread_id, response_id, turn, last_response_id, created_at)
		VALUES ('t1', 'resp_held', 1, 'resp_held', now() - interval '2 days'), ('t1', 'resp_free', 1, 'resp_free', now() - interval '2 days')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO client_responses (client, id, created_at)
		VALUES ('alice', 'resp_held', now() - interval '2 days'), ('alice', 'resp_free', now() - interval '2 days')`)
	require.NoError(t, err)
	pc := cfg.Copy()
	pc.ConnConfig.RuntimeParams["application_name"] = app
	prunerPool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(prunerPool.Close)
	pruner := NewStore(prunerPool, Options{Timeout: time.Minute})

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT 1 FROM response_turns WHERE response_id = 'resp_held' FOR SHARE`)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `SELECT 1 FROM client_responses WHERE id = 'resp_held' FOR SHARE`)
	require.NoError(t, err)
	type result struct {
		p   Pruned
		err error
	}
	pruned := make(chan result, 1)
	go func() { p, err := pruner.PruneHistory(ctx, time.Now().Add(-24*time.Hour)); pruned <- result{p, err} }()
	waiting := func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n))
		return n > 0
	}
	require.Eventually(t, func() bool { return waiting() || len(pruned) > 0 }, time.Minute, 10*time.Millisecond)
	require.False(t, waiting(), "the prune waits for a row another transaction holds")
	r := <-pruned
	require.NoError(t, r.err)
	require.Equal(t, Pruned{ResponseTurns: 1, ClientResponses: 1}, r.p, "the rows no one holds")
	require.NoError(t, holder.Commit(ctx))
	p, err := pruner.PruneHistory(ctx, time.Now().Add(-24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, Pruned{ResponseTurns: 1, ClientResponses: 1}, p, "the next run prunes them")
}
