package tools

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

// TestConcurrentTurnStartsShareRoundTrips: turns that start while the pool is busy wait for a
// round trip together instead of one connection each: 50 turn starts of 25 threads (two of
// each), queued behind the pool's one connection, take a few round trips, not 50; each gets its
// thread's next number and the workspace.
func TestConcurrentTurnStartsShareRoundTrips(t *testing.T) {
	t.Parallel()
	tracer := &countingTracer{}
	pool := dbtest.NewPool(t, &dbtest.Options{Tracer: tracer, MaxConns: 1})
	store := NewStore(pool, Options{})
	ctx := context.Background()
	const threads, starts = 25, 50
	for i := range threads {
		_, err := store.Workspace(ThreadID{Name: fmt.Sprint("c", i)}).SetObjective(ctx, fmt.Sprint("objective ", i))
		require.NoError(t, err)
	}
	held, err := pool.Acquire(ctx) // the pool's one connection: every start waits
	require.NoError(t, err)
	before := tracer.n.Load()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		numbers = map[string][]int{}
	)
	for i := range starts {
		wg.Go(func() {
			name := fmt.Sprint("c", i%threads)
			turn, err := store.Workspace(ThreadID{Name: name}).StartTurn(ctx, TurnOptions{})
			if !assertNoError(t, err) {
				return
			}
			if turn.Objective != "objective "+name[1:] {
				t.Errorf("%s started with objective %q", name, turn.Objective)
			}
			mu.Lock()
			numbers[name] = append(numbers[name], turn.Number)
			mu.Unlock()
		})
	}
	time.Sleep(100 * time.Millisecond) // the starts queue up (any late one goes in a later round trip)
	held.Release()
	wg.Wait()
	roundTrips := tracer.n.Load() - before
	t.Logf("%d turn starts in %d round trips", starts, roundTrips)
	require.Less(t, roundTrips, int64(starts/2))
	for name, got := range numbers {
		slices.Sort(got)
		require.Equal(t, []int{1, 2}, got, name)
	}
	require.Len(t, numbers, threads)
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
