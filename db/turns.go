package db

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TurnStarts begins a turn of each of threadIDs (TurnStart) in one round trip: one call of
// turn_start per id, pipelined in one implicit transaction that does not wait for the disk. It
// returns the rows in the order of threadIDs (an id given twice begins two turns of its thread).
// The threads are locked in id order, so two batches of turn starts, or one and a batch of usage
// (AddUsage), never deadlock. A failure fails every turn start of the batch.
func TurnStarts(ctx context.Context, pool *pgxpool.Pool, threadIDs []string) ([]TurnStartRow, error) {
	if len(threadIDs) == 1 { // a turn starting alone: one statement, as a batch would send it
		row, err := New().TurnStart(ctx, pool, threadIDs[0])
		if err != nil {
			return nil, err
		}
		return []TurnStartRow{row}, nil
	}
	order := make([]int, len(threadIDs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(threadIDs[a], threadIDs[b]) })
	rows := make([]TurnStartRow, len(threadIDs))
	b := &pgx.Batch{}
	for _, i := range order {
		b.Queue(turnStart, threadIDs[i]).QueryRow(func(row pgx.Row) error {
			r := &rows[i]
			return row.Scan(&r.Turn, &r.Objective, &r.Preferences, &r.CreatedAt)
		})
	}
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return rows, nil
}
