package db

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TurnStarts begins a turn of each of starts (TurnStartUnlessHeld) on conn in one round trip:
// one call of turn_start_unless_held per start, pipelined in one implicit transaction that does
// not wait for the disk. It returns the rows in the order of starts (a thread given twice begins
// two turns of it); a thread whose row another transaction holds gets turn 0, and no turn
// begins, so that no start of the batch waits for another transaction. The threads are locked
// in id order: two batches that create the same new threads never deadlock. A failure fails
// every turn start of the batch.
func TurnStarts(ctx context.Context, conn *pgxpool.Conn, starts []TurnStartParams) ([]TurnStartRow, error) {
	if len(starts) == 1 { // a turn starting alone: one statement, as a batch would send it
		row, err := New().TurnStartUnlessHeld(ctx, conn, TurnStartUnlessHeldParams(starts[0]))
		if err != nil {
			return nil, err
		}
		return []TurnStartRow{TurnStartRow(row)}, nil
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
		b.Queue(turnStartUnlessHeld, s.ThreadID, s.Parents, s.ParentsIfNew).QueryRow(scanTurnStart(&rows[i]))
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
func TurnStartWaiting(ctx context.Context, pool *pgxpool.Pool, arg TurnStartParams) (TurnStartRow, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return New().TurnStart(ctx, pool, arg)
	}
	b := &pgx.Batch{}
	queueDeadline(ctx, b)
	var r TurnStartRow
	b.Queue(turnStart, arg.ThreadID, arg.Parents, arg.ParentsIfNew).QueryRow(scanTurnStart(&r))
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(heldAnswerGrace))
	defer cancel()
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return TurnStartRow{}, err
	}
	return r, nil
}

// scanTurnStart scans a turn start's row into r.
func scanTurnStart(r *TurnStartRow) func(pgx.Row) error {
	return func(row pgx.Row) error {
		return row.Scan(&r.Turn, &r.Objective, &r.Preferences, &r.CreatedAt, &r.Inherited, &r.AgentWrites, &r.Refused,
			&r.Version, &r.NextPreferenceID)
	}
}
