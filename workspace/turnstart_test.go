package workspace_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	. "github.com/wsproxy/wsproxy/workspace"
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

// TestHeldThreadDelaysOnlyItsOwnTurnStarts: a thread whose row another transaction holds (a
// user's edit, a tool call of another turn) delays its own turn starts only: with two of them
// sent and waiting for the row, another thread's turn starts while the row is still held; when
// it is released, the held thread's starts take its next numbers.
func TestHeldThreadDelaysOnlyItsOwnTurnStarts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tracer, pool, held, other := twoThreads(ctx, t, "held", "other")
	tx, _ := holdThread(ctx, t, pool, held.ThreadID().String())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }() // a failure ends the held starts before the test
	numbers := startTwo(ctx, t, &wg, tracer, held)

	otherCtx, otherCancel := context.WithTimeout(ctx, 20*time.Second)
	defer otherCancel()
	turn, err := other.StartTurn(otherCtx, TurnOptions{})
	require.NoError(t, err, "another thread's turn start waited for the held thread's row")
	require.Equal(t, 2, turn.Number)

	require.NoError(t, tx.Rollback(ctx))
	got := []int{<-numbers, <-numbers}
	slices.Sort(got)
	require.Equal(t, []int{2, 3}, got, "the held thread's starts took its next numbers")
}

// threadTracer counts, per argument, the statements a pool sends with it (a batch's each).
type threadTracer struct {
	mu sync.Mutex
	n  map[any]int
}

func (c *threadTracer) add(args []any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[any]int{}
	}
	for _, a := range args { // the thread ids: one (a held thread's start), or a batch's (JSON)
		switch a := a.(type) {
		case string:
			c.n[a]++
		case []byte:
			var batch []struct{ ID string }
			if json.Unmarshal(a, &batch) == nil {
				for _, s := range batch {
					c.n[s.ID]++
				}
			}
		}
	}
}

func (c *threadTracer) statements(arg any) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[arg]
}

func (c *threadTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.add(d.Args)
	return ctx
}
func (c *threadTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *threadTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		c.add(q.Arguments)
	}
	return ctx
}
func (c *threadTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *threadTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestTurnStartTimedOutTakesNoNumber: a turn start that failed (DATABASE_TIMEOUT ran out while
// it waited for its thread's row, which another transaction held: a 503) begins no turn, also
// when the row is released afterwards: the thread's turns count only the starts that returned
// one. Its statement is sent in a batch that others' starts began (two starts of another held
// thread under way before it), then waits for its own thread's row.
func TestTurnStartTimedOutTakesNoNumber(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tracer, pool, busy, late := twoThreads(ctx, t, "busy", "late")
	busyTx, _ := holdThread(ctx, t, pool, busy.ThreadID().String())
	lateTx, latePID := holdThread(ctx, t, pool, late.ThreadID().String())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	startTwo(ctx, t, &wg, tracer, busy)
	timedOut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second) // the operation's bound
		defer cancel()
		turn, err := late.StartTurn(ctx, TurnOptions{})
		if err == nil {
			err = fmt.Errorf("turn %d", turn.Number)
		}
		timedOut <- err
	}()
	require.NoError(t, busyTx.Rollback(ctx))
	require.Eventually(t, func() bool { return blockedBy(ctx, t, pool, latePID) > 0 }, time.Minute, time.Millisecond,
		"the start of late waits for its row")
	err := <-timedOut
	require.ErrorIs(t, err, ErrUnavailable)
	require.NoError(t, lateTx.Rollback(ctx))

	turn, err := late.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, 2, turn.Number, "the start that failed took no turn number")
}

// twoThreads returns a pool that tracer traces and two threads of a store on it, each past its
// first turn.
func twoThreads(ctx context.Context, t *testing.T, a, b string) (*threadTracer, *pgxpool.Pool, *Workspace, *Workspace) {
	t.Helper()
	tracer := &threadTracer{}
	pool := dbtest.NewPool(t, &dbtest.Options{Tracer: tracer, MaxConns: 8})
	store := NewStore(pool, Options{Timeout: time.Minute})
	wa, wb := store.Workspace(ThreadID{Name: a}), store.Workspace(ThreadID{Name: b})
	for _, w := range []*Workspace{wa, wb} {
		turn, err := w.StartTurn(ctx, TurnOptions{})
		require.NoError(t, err)
		require.Equal(t, 1, turn.Number)
	}
	return tracer, pool, wa, wb
}

// startTwo starts two turns of w in goroutines of wg, and returns once both have sent a
// statement; their numbers come on the channel it returns.
func startTwo(ctx context.Context, t *testing.T, wg *sync.WaitGroup, tracer *threadTracer, w *Workspace) <-chan int {
	t.Helper()
	sent := tracer.statements(w.ThreadID().String())
	numbers := make(chan int, 2)
	for range 2 {
		wg.Go(func() {
			turn, err := w.StartTurn(ctx, TurnOptions{})
			assertNoError(t, err)
			numbers <- turn.Number
		})
	}
	require.Eventually(t, func() bool { return tracer.statements(w.ThreadID().String()) >= sent+2 }, time.Minute, time.Millisecond,
		"both starts of %s were sent", w.ThreadID().String())
	return numbers
}

// holdThread locks thread's row in a transaction, as an edit does, and returns it and its
// backend's pid. The test's end rolls it back.
func holdThread(ctx context.Context, t *testing.T, pool *pgxpool.Pool, thread string) (pgx.Tx, int32) {
	t.Helper()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var pid int32
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM threads WHERE id = $1 FOR UPDATE`, thread).Scan(&pid))
	return tx, pid
}

// blockedBy counts the sessions that wait for a lock the backend pid holds.
func blockedBy(ctx context.Context, t *testing.T, pool *pgxpool.Pool, pid int32) int {
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, pid).Scan(&n))
	return n
}

// TestTurnStartFastPathAgreesWithTurnStart: the statements that begin turns (db.TurnStarts:
// TurnStartUnlessHeld for one thread, TurnStartsUnlessHeld for several), which begin a thread's
// turn themselves when its last snapshot holds its workspace as it stands (their "fast" part),
// return what turn_start returns, in every state a thread can be in; they run turn_start only
// when they must: a new thread, a changed workspace, ancestors, parents to store. Each state is
// tried in transactions rolled back each time, counting the calls of turn_start_unless_held
// (track_functions): through turn_start; the thread's turn starting alone (TurnStartUnlessHeld);
// the thread's start in a batch, between those of two new threads (TurnStartsUnlessHeld); and
// the thread twice in a batch with another thread twice, which begins the next two turns of each.
func TestTurnStartFastPathAgreesWithTurnStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t, nil)
	store := NewStore(pool, Options{})
	ws, scope := store.Workspace(ThreadID{Name: "d"}), store.Workspace(ThreadID{Name: "d-scope"})
	compare := func(name string, args db.TurnStartParams, fast bool) {
		t.Helper()
		rolledBack := func(fn func(tx pgx.Tx)) {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { require.NoError(t, tx.Rollback(ctx)) }()
			fn(tx)
		}
		var want db.TurnStartRow
		rolledBack(func(tx pgx.Tx) {
			var err error
			want, err = db.New().TurnStart(ctx, tx, args)
			require.NoError(t, err, name)
		})
		// The session's counts not yet reported are counted too: a call is the difference.
		calls := func(tx pgx.Tx) (n int64) {
			require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE funcname = 'turn_start_unless_held'`).Scan(&n))
			return n
		}
		tracked := func(tx pgx.Tx) {
			_, err := tx.Exec(ctx, `SET LOCAL track_functions = 'pl'`)
			require.NoError(t, err)
		}
		rolledBack(func(tx pgx.Tx) {
			tracked(tx)
			before := calls(tx)
			got, err := db.TurnStarts(ctx, tx, []db.TurnStartParams{args})
			require.NoError(t, err, name)
			require.Equal(t, fast, calls(tx) == before, "%s: the fast path taken", name)
			if want.Turn == 1 {
				got[0].CreatedAt = want.CreatedAt // a thread each transaction created: now() of each
			}
			require.Equal(t, want, got[0], name)
		})
		rolledBack(func(tx pgx.Tx) {
			tracked(tx)
			before := calls(tx)
			// "d-0" and "d-1" are new threads (before and after "d" in id order): a call each.
			got, err := db.TurnStarts(ctx, tx, []db.TurnStartParams{{ThreadID: "d-1"}, args, {ThreadID: "d-0"}})
			require.NoError(t, err, name)
			slow := int64(2)
			if !fast {
				slow++
			}
			require.Equal(t, slow, calls(tx)-before, "%s in a batch: the calls of turn_start_unless_held", name)
			if want.Turn == 1 {
				got[1].CreatedAt = want.CreatedAt
			}
			require.Equal(t, want, got[1], "%s in a batch", name)
			require.Equal(t, []int32{1, 1}, []int32{got[0].Turn, got[2].Turn}, "%s in a batch: the new threads' turns", name)
			again, err := db.TurnStarts(ctx, tx, []db.TurnStartParams{args, {ThreadID: "d-0"}, args, {ThreadID: "d-0"}})
			require.NoError(t, err, name)
			require.Equal(t, []int32{want.Turn + 1, 2, want.Turn + 2, 3}, []int32{again[0].Turn, again[1].Turn, again[2].Turn, again[3].Turn},
				"%s twice in a batch", name)
		})
	}
	begin := func(opts TurnOptions) {
		t.Helper()
		_, err := ws.StartTurn(ctx, opts)
		require.NoError(t, err)
	}
	args := db.TurnStartParams{ThreadID: "d"}
	compare("a new thread", args, false)
	begin(TurnOptions{})
	compare("an empty workspace, unchanged", args, true)
	_, err := ws.SetObjective(ctx, "Plan a trip")
	require.NoError(t, err)
	_, err = ws.AddPreference(ctx, PreferenceInput{Title: "Trains", Subtitle: "no flights", Kind: Hard, Locked: true})
	require.NoError(t, err)
	compare("a changed workspace", args, false)
	begin(TurnOptions{})
	compare("a workspace unchanged since its snapshot", args, true)
	compare("parents given for a thread that has none", db.TurnStartParams{ThreadID: "d", Parents: []string{"d-scope"}}, false)
	compare("parents given only for a new thread", db.TurnStartParams{ThreadID: "d", Parents: []string{"d-scope"}, ParentsIfNew: true}, true)
	compare("no parents given", db.TurnStartParams{ThreadID: "d", Parents: []string{}}, true)
	_, err = scope.AddPreference(ctx, PreferenceInput{Title: "Window seat"})
	require.NoError(t, err)
	require.NoError(t, ws.SetParents(ctx, []ThreadID{{Name: "d-scope"}}))
	compare("a thread with a parent", args, false)
	begin(TurnOptions{})
	compare("a thread with a parent, unchanged", args, false)
	require.NoError(t, ws.SetParents(ctx, nil))
	compare("its parent gone", args, false)
	begin(TurnOptions{})
	compare("no parent since the snapshot", args, true)
	tx, _ := holdThread(ctx, t, pool, "d")
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	rows, err := db.TurnStarts(ctx, conn, []db.TurnStartParams{args})
	require.NoError(t, err)
	require.Zero(t, rows[0].Turn, "a held row: no turn begun")
	rows, err = db.TurnStarts(ctx, conn, []db.TurnStartParams{args, {ThreadID: "d-scope"}, args})
	require.NoError(t, err)
	require.Equal(t, []int32{0, 0}, []int32{rows[0].Turn, rows[2].Turn}, "a held row in a batch: no turn begun")
	require.NotZero(t, rows[1].Turn, "another thread of the batch begins its turn")
	require.NoError(t, tx.Rollback(ctx))
}

// awaitUnblocked waits for a value of done, failing the test as soon as a session waits for a
// lock that the backend pid holds instead.
func awaitUnblocked[T any](ctx context.Context, t *testing.T, pool *pgxpool.Pool, pid int32, done <-chan T, blocked string) T {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case v := <-done:
			return v
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-tick.C:
			if blockedBy(ctx, t, pool, pid) > 0 {
				t.Fatal(blocked)
			}
		}
	}
}

// TestTurnStartWhoseCallerLeftTakesNoTurn: a turn start whose caller gave up while its batch was
// under way (the client left; WORKSPACE_BUDGET or DATABASE_TIMEOUT ran out, and the caller
// answered 503 or went on without its workspace) leaves no turn behind once the batch commits:
// no number taken, no snapshot (docs/spec.md §2, §10). The batch waits for a thread that another
// transaction is creating (the one wait a batch has), and the caller, bounded as
// WORKSPACE_BUDGET bounds it, leaves meanwhile; the thread's next start is its turn 1.
func TestTurnStartWhoseCallerLeftTakesNoTurn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := dbtest.NewPool(t, &dbtest.Options{MaxConns: 8})
	store := NewStore(pool, Options{Timeout: time.Minute})
	ws := store.Workspace(ThreadID{Name: "left"})
	creating, err := pool.Begin(ctx) // a user's first edit of the thread, under way
	require.NoError(t, err)
	defer creating.Rollback(ctx)
	var pid int32
	require.NoError(t, creating.QueryRow(ctx, `INSERT INTO threads (id) VALUES ($1) RETURNING pg_backend_pid()`, ws.ThreadID().String()).Scan(&pid))
	_, err = creating.Exec(ctx, `INSERT INTO objectives (thread_id, text, updated_by) VALUES ($1, 'Keep it', 'user')`, ws.ThreadID().String())
	require.NoError(t, err)
	var created string // the creating transaction's id: the thread row's xmin until a turn starts
	require.NoError(t, creating.QueryRow(ctx, `SELECT pg_current_xact_id()::xid::text`).Scan(&created))

	callerCtx, giveUp := context.WithTimeout(ctx, 30*time.Second) // shorter than the store's bound
	defer giveUp()
	gaveUp := make(chan error, 1)
	go func() {
		turn, err := ws.StartTurn(callerCtx, TurnOptions{})
		if err == nil {
			err = fmt.Errorf("turn %d", turn.Number)
		}
		gaveUp <- err
	}()
	require.Eventually(t, func() bool { return blockedBy(ctx, t, pool, pid) > 0 }, time.Minute, time.Millisecond,
		"the batch waits for the thread's creation")
	giveUp()
	require.ErrorIs(t, <-gaveUp, context.Canceled, "the caller gave up")
	require.NoError(t, creating.Commit(ctx))
	require.Eventually(t, func() bool { // the batch has begun its turn (a row written since), and given it back
		var given bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT turns = 0 AND xmin::text <> $2 FROM threads WHERE id = $1`, ws.ThreadID().String(), created).Scan(&given))
		return given
	}, time.Minute, time.Millisecond, "the given-up start's turn is given back")

	turn, err := ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, turn.Number, "the start whose caller left took no turn number")
	require.Equal(t, "Keep it", turn.Objective)
	var snapshots int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM workspace_snapshots WHERE thread_id = $1`, ws.ThreadID().String()).Scan(&snapshots))
	require.Equal(t, 1, snapshots, "the given-up start's snapshot is gone; the next one's is there")
}
