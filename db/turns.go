package db

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TurnStarts begins a turn of each of starts (TurnStart) in one round trip: one call of
// turn_start per start, pipelined in one implicit transaction that does not wait for the disk. It
// returns the rows in the order of starts (a thread given twice begins two turns of it).
// The threads are locked in id order, so two batches of turn starts, or one and a batch of usage
// (AddUsage), never deadlock. A failure fails every turn start of the batch.
func TurnStarts(ctx context.Context, pool *pgxpool.Pool, starts []TurnStartParams) ([]TurnStartRow, error) {
	if len(starts) == 1 { // a turn starting alone: one statement, as a batch would send it
		row, err := New().TurnStart(ctx, pool, starts[0])
		if err != nil {
			return nil, err
		}
		return []TurnStartRow{row}, nil
	}
	order := make([]int, len(starts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(starts[a].ThreadID, starts[b].ThreadID) })
	rows := make([]TurnStartRow, len(starts))
	b := &pgx.Batch{}
	for _, i := range order {
		s := starts[i]
		b.Queue(turnStart, s.ThreadID, s.Parents, s.ParentsIfNew).QueryRow(func(row pgx.Row) error {
			r := &rows[i]
			return row.Scan(&r.Turn, &r.Objective, &r.Preferences, &r.CreatedAt, &r.Inherited, &r.AgentWrites, &r.Refused)
		})
	}
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return rows, nil
}
