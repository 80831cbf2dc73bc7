package db

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TurnStarts begins a turn of each of threadIDs (TurnStartUnlessHeld) on conn in one round trip:
// one call of turn_start_unless_held per id, pipelined in one implicit transaction that does not
// wait for the disk. It returns the rows in the order of threadIDs (an id given twice begins two
// turns of its thread); a thread whose row another transaction holds gets turn 0, and no turn
// begins, so that no start of the batch waits for another transaction. The threads are locked
// in id order: two batches that create the same new threads never deadlock. A failure fails
// every turn start of the batch.
func TurnStarts(ctx context.Context, conn *pgxpool.Conn, threadIDs []string) ([]TurnStartRow, error) {
	if len(threadIDs) == 1 { // a turn starting alone: one statement, as a batch would send it
		row, err := New().TurnStartUnlessHeld(ctx, conn, threadIDs[0])
		if err != nil {
			return nil, err
		}
		return []TurnStartRow{TurnStartRow(row)}, nil
	}
	order := make([]int, len(threadIDs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(threadIDs[a], threadIDs[b]) })
	rows := make([]TurnStartRow, len(threadIDs))
	b := &pgx.Batch{}
	for _, i := range order {
		b.Queue(turnStartUnlessHeld, threadIDs[i]).QueryRow(scanTurnStart(&rows[i]))
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return rows, nil
}

// heldAnswerGrace is how long TurnStartWaiting waits for Postgres's answer past its deadline
// (Postgres gives up the wait at the deadline, and answers at once).
const heldAnswerGrace = time.Second

// TurnStartWaiting is TurnStart for a thread whose row another transaction holds: it waits for
// the row, on the server, until ctx's deadline at most (queueDeadline: then 55P03, and no turn
// begins), and waits for Postgres's answer even when ctx ends first. So a start that failed never
// begins its turn later, as a statement left behind by its client would (it goes on waiting, and
// begins the turn when the row is released), and one that began its turn says so.
func TurnStartWaiting(ctx context.Context, pool *pgxpool.Pool, threadID string) (TurnStartRow, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return New().TurnStart(ctx, pool, threadID)
	}
	b := &pgx.Batch{}
	queueDeadline(ctx, b)
	var r TurnStartRow
	b.Queue(turnStart, threadID).QueryRow(scanTurnStart(&r))
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(heldAnswerGrace))
	defer cancel()
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return TurnStartRow{}, err
	}
	return r, nil
}

// scanTurnStart scans a turn start's row into r.
func scanTurnStart(r *TurnStartRow) func(pgx.Row) error {
	return func(row pgx.Row) error { return row.Scan(&r.Turn, &r.Objective, &r.Preferences, &r.CreatedAt) }
}
