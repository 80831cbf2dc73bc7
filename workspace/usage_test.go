package workspace_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	. "github.com/wsproxy/wsproxy/workspace"
)

// TestUsageBatchCountedOnce: each writer's batch adds to a thread once, however often it is sent
// and whatever other writers (replicas) sent in between; a writer's totals that no one moved for
// a week are folded into the thread's row by the first batch of a writer new to the thread (the
// only time the thread gains a row), and still count. A batch never updates the thread's row
// otherwise: a turn starting meanwhile finds the row free.
func TestUsageBatchCountedOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	send := func(writer string, n int64, tokens int64) {
		require.NoError(t, f.store.AddUsage(ctx, UsageBatch{Writer: writer, Number: n, Usage: map[ThreadID]Usage{
			f.ws.ThreadID(): {PromptTokens: tokens},
		}}))
	}
	prompt := func() int64 {
		d, err := f.ws.Get(ctx)
		require.NoError(t, err)
		return d.Usage.PromptTokens
	}
	send("a", 1, 5)
	send("a", 1, 5)
	send("b", 1, 7)
	send("a", 1, 5)
	send("b", 1, 7)
	require.Equal(t, int64(12), prompt())
	send("a", 2, 1)
	send("b", 2, 2)
	send("a", 1, 5) // an older batch of a: counted already
	require.Equal(t, int64(15), prompt())

	writers := func() (n int) {
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM thread_usage WHERE thread_id = 't1'`).Scan(&n))
		return n
	}
	require.Equal(t, 2, writers())
	_, err := f.pool.Exec(ctx, `UPDATE thread_usage SET at = at - interval '8 days' WHERE writer_id = 'a'`)
	require.NoError(t, err)
	send("b", 3, 1) // b has its row: it reads no other writer's
	require.Equal(t, 2, writers())
	require.Equal(t, int64(16), prompt())
	send("c", 1, 2) // a writer new to the thread (a replica started since)
	require.Equal(t, 2, writers(), "a's week-old totals are folded into the thread's row, and c has a row of its own")
	require.Equal(t, int64(18), prompt())
	send("a", 3, 4) // a again, after a week: a row of its own anew
	require.Equal(t, int64(22), prompt())

	// A batch while another transaction holds the thread's row as a tool call, an edit or a
	// turn's start does: it does not wait for the row (nor a turn's start for the batch).
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT FROM threads WHERE id = 't1' FOR NO KEY UPDATE`)
	require.NoError(t, err)
	held, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, f.store.AddUsage(held, UsageBatch{Writer: "b", Number: 4, Usage: map[ThreadID]Usage{f.ws.ThreadID(): {PromptTokens: 1}}}))
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, int64(23), prompt())
}

// TestUsageOfAWriterReadsOneRow: a writer's batch for a thread it has a row of reads that row,
// not every other writer's: every run of a replica is a writer, with a row in every thread it
// served, for a week, and a batch that read them all cost Postgres 135 µs a statement with 17
// writers a thread, against 101 µs reading its own (pgbench, medians).
func TestUsageOfAWriterReadsOneRow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	thread := f.ws.ThreadID().String()
	require.NoError(t, f.store.AddUsage(ctx, UsageBatch{Writer: "w", Number: 1, Usage: map[ThreadID]Usage{f.ws.ThreadID(): {PromptTokens: 5}}}))
	_, err := f.pool.Exec(ctx, `INSERT INTO thread_usage (thread_id, writer_id, batch, prompt_tokens)
		SELECT $1, 'gone-' || g, 1, 1 FROM generate_series(1, 30) g`, thread)
	require.NoError(t, err)

	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, db.New().ThreadUsageAdd(ctx, tx, db.ThreadUsageAddParams{ID: thread, WriterID: "w", Batch: 2, PromptTokens: 5}))
	var read int64 // the rows of thread_usage this transaction's scans returned
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_fetched('thread_usage'::regclass)
		+ pg_stat_get_xact_tuples_returned('thread_usage'::regclass)`).Scan(&read))
	require.NoError(t, tx.Commit(ctx))
	require.LessOrEqual(t, read, int64(2), "rows of thread_usage read by a batch of a writer that has its row")
	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5+30+5), d.Usage.PromptTokens)
}

// TestUsageSaturates: a thread's totals stop at the largest bigint instead of failing the batch,
// so the batch's other threads are counted and the writer does not send it again forever.
func TestUsageSaturates(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	other := f.store.Workspace(ThreadID{Name: "other"})
	_, err := other.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.NoError(t, f.store.AddUsage(ctx, UsageBatch{Writer: "w", Number: 1, Usage: map[ThreadID]Usage{
		f.ws.ThreadID(): {PromptTokens: math.MaxInt64 - 1, CachedPromptTokens: math.MaxInt64, CompletionTokens: 1},
	}}))
	require.NoError(t, f.store.AddUsage(ctx, UsageBatch{Writer: "w", Number: 2, Usage: map[ThreadID]Usage{
		f.ws.ThreadID():  {PromptTokens: 5, CachedPromptTokens: 5, CompletionTokens: 2},
		other.ThreadID(): {PromptTokens: 3},
	}}))
	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, Usage{PromptTokens: math.MaxInt64, CachedPromptTokens: math.MaxInt64, CompletionTokens: 3}, d.Usage)
	d, err = other.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, Usage{PromptTokens: 3}, d.Usage)
}

// TestUsageWaitsForNoHeldThread: a writer's first batch for a thread that holds another writer's
// row older than a week (which it would fold into the thread's row) does not wait for the
// thread's row while another transaction holds it (a tool call, an edit, a turn's start): it
// counts its usage at once and leaves the fold to a later writer's first batch, which makes it
// once the row is free. The thread's usage is the same all along.
func TestUsageWaitsForNoHeldThread(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	thread := f.ws.ThreadID()
	_, err := f.pool.Exec(ctx, `INSERT INTO thread_usage (thread_id, writer_id, batch, at, prompt_tokens)
		VALUES ($1, 'stale', 1, now() - interval '8 days', 7)`, thread.String())
	require.NoError(t, err)
	edit, err := f.pool.Begin(ctx) // an edit of the thread, under way: ThreadLockTouch
	require.NoError(t, err)
	defer edit.Rollback(ctx)
	var pid int32
	require.NoError(t, edit.QueryRow(ctx, `UPDATE threads SET updated_at = now() WHERE id = $1 RETURNING pg_backend_pid()`, thread.String()).Scan(&pid))

	send := func(writer string, tokens int64) <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- f.store.AddUsage(ctx, UsageBatch{Writer: writer, Number: 1, Usage: map[ThreadID]Usage{thread: {PromptTokens: tokens}}})
		}()
		return done
	}
	require.NoError(t, awaitUnblocked(ctx, t, f.pool, pid, send("new", 5), "the usage batch waits for the thread's row"))
	usage := func() (prompt int64, rows int) {
		d, err := f.ws.Get(ctx)
		require.NoError(t, err)
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM thread_usage WHERE thread_id = $1`, thread.String()).Scan(&rows))
		return d.Usage.PromptTokens, rows
	}
	prompt, rows := usage()
	require.Equal(t, int64(7+5), prompt, "counted at once")
	require.Equal(t, 2, rows, "the stale writer's row is not folded while the thread's row is held")

	require.NoError(t, edit.Rollback(ctx))
	require.NoError(t, <-send("later", 1))
	prompt, rows = usage()
	require.Equal(t, int64(7+5+1), prompt)
	require.Equal(t, 2, rows, "a later writer's first batch folds the stale row")
}
