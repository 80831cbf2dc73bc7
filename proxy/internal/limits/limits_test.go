package limits

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/workspace"
)

func TestMain(m *testing.M) { dbtest.VerifyNoLeaks(m) }

// clock is a settable time.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// TestTwoReplicasShareTheCount: two counters on one database (two replicas) count one client
// together once each has synced: the requests of one fill the other's minute, the tokens of one
// its day; each window frees at its end (Retry-After counts down to it), and the minute's
// totals written before the window moved on are kept.
func TestTwoReplicasShareTheCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t, nil)
	store := workspace.NewStore(pool, workspace.Options{})
	// The windows are today's (old ones are pruned against Postgres's clock).
	start := time.Now().UTC().Truncate(time.Minute).Add(15 * time.Second)
	if start.Add(5*time.Minute).Day() != start.Day() { // the minute after stays in the same day
		start = start.Add(-10 * time.Minute)
	}
	clk := &clock{t: start}
	a, b := NewCounter(store, 0, nil), NewCounter(store, 0, nil)
	a.now, b.now = clk.now, clk.now
	lim := Limits{RequestsPerMinute: 3, TokensPerDay: 100}

	require.Nil(t, a.Admit("alice", lim))
	require.Nil(t, a.Admit("alice", lim))
	require.Nil(t, b.Admit("bob", lim), "another client's count is its own")
	require.NoError(t, a.Sync(ctx))
	require.NoError(t, b.Sync(ctx))
	require.Equal(t, Usage{RequestsThisMinute: 2, RequestsToday: 2}, b.Usage("alice"), "b reads a's count")

	require.Nil(t, b.Admit("alice", lim), "the third of the minute")
	ref := b.Admit("alice", lim)
	require.NotNil(t, ref, "the fourth: past requests_per_minute on either replica")
	require.Equal(t, RequestsPerMinute, ref.Limit)
	require.Equal(t, 45*time.Second, ref.RetryAfter, "until the minute ends")
	require.NoError(t, b.Sync(ctx))
	require.NoError(t, a.Sync(ctx))
	require.NotNil(t, a.Admit("alice", lim), "a reads b's count")
	require.Equal(t, Usage{RequestsThisMinute: 3, RequestsToday: 3}, a.Usage("alice"), "a refusal counts nothing")

	// The next minute frees the requests; tokens count for the day on every replica.
	clk.t = clk.t.Add(time.Minute)
	require.Nil(t, a.Admit("alice", lim))
	a.AddTokens("alice", 60)
	b.AddTokens("alice", 40)
	require.NoError(t, a.Sync(ctx))
	require.NoError(t, b.Sync(ctx))
	require.NoError(t, a.Sync(ctx))
	ref = a.Admit("alice", lim)
	require.NotNil(t, ref, "the day's tokens reached tokens_per_day")
	require.Equal(t, TokensPerDay, ref.Limit)
	require.Equal(t, start.Truncate(24*time.Hour).Add(24*time.Hour).Sub(clk.t), ref.RetryAfter, "until the day ends (UTC)")
	require.NotNil(t, b.Admit("alice", lim))
	require.Nil(t, b.Admit("bob", lim))
	require.Equal(t, Usage{RequestsThisMinute: 1, RequestsToday: 4, TokensToday: 100}, b.Usage("alice"))

	// A limit of zero is none; without limits the usage still counts.
	require.Nil(t, a.Admit("alice", Limits{}))

	// What was written per window stays in the table: the first minute's three requests.
	var first int64
	require.NoError(t, pool.QueryRow(ctx,
		`SELECT sum(requests) FROM client_usage WHERE client = 'alice' AND period = 'minute' AND starts_at = $1`,
		start.Truncate(time.Minute)).Scan(&first))
	require.Equal(t, int64(3), first)

	// The next day frees the tokens.
	clk.t = start.Truncate(24 * time.Hour).Add(24*time.Hour + time.Second)
	require.Nil(t, a.Admit("alice", lim))
	require.Equal(t, Usage{RequestsThisMinute: 1, RequestsToday: 1}, a.Usage("alice"))
}
