package db

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TurnStarts begins a turn of each of starts on conn in one round trip and one implicit
// transaction that does not wait for the disk: one statement for the first start of each
// thread, one more for the second start of each thread given twice, and so on (a thread given
// twice begins two turns of it); a statement for one thread is TurnStartUnlessHeld, for more
// TurnStartsUnlessHeld. It returns the rows in the order of starts; a thread whose row another
// transaction holds gets turn 0, and no turn begins, so that no start of the batch waits for
// another transaction. The threads are locked in id order: two batches that create the same new
// threads never deadlock. A failure fails every turn start of the batch.
func TurnStarts(ctx context.Context, conn interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, starts []TurnStartParams) ([]TurnStartRow, error) {
	order := make([]int, len(starts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(starts[a].ThreadID, starts[b].ThreadID) })
	var rounds [][]int // indices in starts: each thread's first start, second start, …
	n := 0             // the starts of order[k]'s thread before it
	for k, i := range order {
		if n++; k == 0 || starts[order[k-1]].ThreadID != starts[i].ThreadID {
			n = 0
		}
		if n == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[n] = append(rounds[n], i)
	}
	rows := make([]TurnStartRow, len(starts))
	b := &pgx.Batch{}
	for _, round := range rounds {
		if len(round) == 1 {
			st := starts[round[0]]
			b.Queue(turnStartUnlessHeld, st.ThreadID, st.ReadsUntrusted, st.HasClientTools, st.Parents, st.ParentsIfNew).
				QueryRow(scanTurnStart(&rows[round[0]]))
			continue
		}
		batch := make([]turnStartJSON, len(round))
		for k, i := range round {
			batch[k] = turnStartJSON(starts[i])
		}
		arg, err := json.Marshal(batch)
		if err != nil {
			return nil, fmt.Errorf("turn starts: %w", err)
		}
		b.Queue(turnStartsUnlessHeld, arg).Query(func(rs pgx.Rows) error {
			got := 0
			for rs.Next() {
				var ord int32
				var r TurnStartRow
				if err := rs.Scan(&ord, &r.Turn, &r.Objective, &r.Preferences, &r.CreatedAt, &r.Inherited, &r.AgentWrites,
					&r.Refused, &r.Version, &r.NextPreferenceID, &r.ObjectiveSource, &r.Tainted, &r.ClientTools); err != nil {
					return err
				}
				if ord < 1 || int(ord) > len(round) {
					return fmt.Errorf("turn starts: a row for thread %d of %d", ord, len(round))
				}
				rows[round[ord-1]] = r
				got++
			}
			if err := rs.Err(); err != nil {
				return err
			}
			if got != len(round) {
				return fmt.Errorf("turn starts: %d rows for %d threads", got, len(round))
			}
			return nil
		})
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return rows, nil
}

// turnStartJSON is a turn start as TurnStartsUnlessHeld reads it (Parents nil: null, none given).
type turnStartJSON struct {
	ThreadID       string   `json:"id"`
	Parents        []string `json:"parents"`
	ParentsIfNew   bool     `json:"parents_if_new"`
	ReadsUntrusted bool     `json:"reads_untrusted,omitempty"`
	HasClientTools bool     `json:"has_client_tools,omitempty"`
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
	b.Queue(turnStart, arg.ThreadID, arg.Parents, arg.ParentsIfNew, arg.ReadsUntrusted, arg.HasClientTools).QueryRow(scanTurnStart(&r))
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
			&r.Version, &r.NextPreferenceID, &r.ObjectiveSource, &r.Tainted, &r.ClientTools)
	}
}

// TurnUndos gives back turns (TurnUndo each) in one round trip, each thread's later turns first
// (a turn is given back only while it is its thread's latest).
func TurnUndos(ctx context.Context, pool *pgxpool.Pool, undos []TurnUndoParams) error {
	slices.SortFunc(undos, func(a, b TurnUndoParams) int {
		if c := strings.Compare(a.ThreadID, b.ThreadID); c != 0 {
			return c
		}
		return cmp.Compare(b.Turn, a.Turn)
	})
	b := &pgx.Batch{}
	for _, u := range undos {
		b.Queue(turnUndo, u.ThreadID, u.Turn, u.CreatedAt)
	}
	return pool.SendBatch(ctx, b).Close()
}
