package workspace

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wsproxy/wsproxy/db"
)

// Periods of a client's usage windows (docs/spec.md §20).
const (
	PeriodMinute = "minute"
	PeriodDay    = "day"
)

// ClientWindow is what a client used in one window (a UTC calendar minute or day): its requests
// and its tokens (prompt plus completion).
type ClientWindow struct {
	Client   string
	Period   string // PeriodMinute or PeriodDay
	Start    time.Time
	Requests int64
	Tokens   int64
}

// SyncClientUsage writes writer's own totals of its clients' windows (absolute values: sent
// again, they change nothing) and returns the other writers' sums of the windows that start at
// minute and day, per client and period, in one round trip.
func (s *Store) SyncClientUsage(ctx context.Context, writer string, minute, day time.Time, own []ClientWindow) (_ []ClientWindow, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	p := db.ClientUsageSyncParams{WriterID: writer, Minute: pgtype.Timestamptz{Time: minute, Valid: true}, Day: pgtype.Timestamptz{Time: day, Valid: true},
		Clients: make([]string, len(own)), Periods: make([]string, len(own)), Starts: make([]pgtype.Timestamptz, len(own)),
		Requests: make([]int64, len(own)), Tokens: make([]int64, len(own))}
	for i, w := range own {
		p.Clients[i], p.Periods[i], p.Starts[i] = w.Client, w.Period, pgtype.Timestamptz{Time: w.Start, Valid: true}
		p.Requests[i], p.Tokens[i] = w.Requests, w.Tokens
	}
	rows, err := s.q.ClientUsageSync(ctx, s.pool, p)
	if err != nil {
		return nil, fmt.Errorf("sync client usage: %w", err)
	}
	out := make([]ClientWindow, len(rows))
	for i, r := range rows {
		start := day
		if r.Period == PeriodMinute {
			start = minute
		}
		out[i] = ClientWindow{Client: r.Client, Period: r.Period, Start: start, Requests: r.Requests, Tokens: r.Tokens}
	}
	return out, nil
}

// PruneClientUsage deletes the usage windows nothing reads any more (minutes past an hour, days
// past 400 days).
func (s *Store) PruneClientUsage(ctx context.Context) (err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	if err := s.q.ClientUsagePrune(ctx, s.pool); err != nil {
		return fmt.Errorf("prune client usage: %w", err)
	}
	return nil
}

// ClientThreads is how many threads client's namespace holds, and whether thread (a thread of
// it) is among them: what max_threads is checked against (docs/spec.md §20).
func (s *Store) ClientThreads(ctx context.Context, thread ThreadID) (n int64, exists bool, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	row, err := s.q.ClientThreadCount(ctx, s.pool, db.ClientThreadCountParams{ThreadID: thread.String(), Prefix: ThreadID{Client: thread.Client}.String()})
	if err != nil {
		return 0, false, fmt.Errorf("count client threads: %w", err)
	}
	return row.Threads, row.Exists, nil
}
