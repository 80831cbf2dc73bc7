package db

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TurnStart is the start of a thread's turn: its number and the workspace as it stood.
type TurnStart struct {
	Turn        int32
	Objective   pgtype.Text
	Preferences []byte // the snapshot's jsonb
}

// StartTurn begins a turn in one round trip: ThreadTurnNext and SnapshotTake go out as one
// pipeline, one implicit transaction. It commits without waiting for the disk (ThreadTurnNext
// sets synchronous_commit off for it): a crash may lose a turn start, and with it only a turn
// number and a snapshot of a workspace that the last stored one already holds; any later durable
// commit of the thread (a tool call, an edit) flushes the WAL past it, so nothing durable can
// refer to a lost turn.
func StartTurn(ctx context.Context, pool *pgxpool.Pool, threadID string) (TurnStart, error) {
	var t TurnStart
	b := &pgx.Batch{}
	b.Queue(threadTurnNext, threadID)
	b.Queue(snapshotTake, threadID).QueryRow(func(row pgx.Row) error {
		return row.Scan(&t.Turn, &t.Objective, &t.Preferences)
	})
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return TurnStart{}, err
	}
	return t, nil
}

// AddUsage adds turns' usage to their threads' totals in one round trip: one ThreadUsageAdd per
// thread, pipelined in one implicit transaction that does not wait for the disk. The threads are
// updated in id order, so two replicas adding usage of the same threads at once never deadlock.
func AddUsage(ctx context.Context, pool *pgxpool.Pool, usage []ThreadUsageAddParams) error {
	usage = slices.Clone(usage)
	slices.SortFunc(usage, func(a, b ThreadUsageAddParams) int { return strings.Compare(a.ID, b.ID) })
	b := &pgx.Batch{}
	for _, u := range usage {
		b.Queue(threadUsageAdd, u.PromptTokens, u.CachedPromptTokens, u.CompletionTokens, u.ID)
	}
	return pool.SendBatch(ctx, b).Close()
}
