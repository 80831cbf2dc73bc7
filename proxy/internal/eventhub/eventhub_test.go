package eventhub

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/workspace"
)

func TestMain(m *testing.M) { dbtest.VerifyNoLeaks(m) }

// reads is a Store's Versions that records each read: the threads it was asked for.
type reads struct {
	store *workspace.Store
	mu    sync.Mutex
	asked [][]string
	read  chan struct{} // a signal after each read
}

func (r *reads) versions(ctx context.Context, threads []string) (map[string]workspace.Version, error) {
	r.mu.Lock()
	r.asked = append(r.asked, slices.Clone(threads))
	r.mu.Unlock()
	v, err := r.store.Versions(ctx, threads)
	select {
	case r.read <- struct{}{}:
	default:
	}
	return v, err
}

// readWith waits for a read whose threads are want.
func (r *reads) readWith(t *testing.T, want ...string) {
	t.Helper()
	timeout := time.After(time.Minute) // at once; a minute on a busy machine
	for {
		r.mu.Lock()
		for _, a := range r.asked {
			if slices.Equal(a, want) {
				r.mu.Unlock()
				return
			}
		}
		r.mu.Unlock()
		select {
		case <-r.read:
		case <-timeout:
			t.Fatalf("no read of %v within a minute", want)
		}
	}
}

// watch watches thread on h until the test ends, and returns a channel that gets the number of
// each call of the watch's function after its first (the wake-ups: the heartbeat is an hour).
func watch(t *testing.T, h *Hub, thread string) <-chan int {
	ctx, cancel := context.WithCancel(context.Background())
	woken := make(chan int, 100)
	var done sync.WaitGroup
	done.Go(func() {
		n := 0
		_ = h.Watch(ctx, thread, time.Hour, func(bool) error {
			if n > 0 {
				woken <- n
			}
			n++
			return nil
		})
	})
	t.Cleanup(func() { cancel(); done.Wait() })
	return woken
}

func wokenBy(t *testing.T, woken <-chan int, what string) {
	t.Helper()
	select {
	case <-woken:
	case <-time.After(time.Minute): // at once; a minute on a busy machine
		t.Fatalf("not woken by %s within a minute", what)
	}
}

// TestHubWakesOnEveryChange: a watch of a thread is woken by each commit of the thread's events
// made through another store on the same database (another replica), by the thread's creation
// and by its deletion — every change of its version — and the hub reads only the threads watched,
// never an empty list (no statement while nothing is watched).
func TestHubWakesOnEveryChange(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	r := &reads{store: workspace.NewStore(pool, workspace.Options{}), read: make(chan struct{}, 1)}
	h := New(r.versions, 5*time.Millisecond, slog.New(slog.DiscardHandler))
	defer h.Close()
	other := workspace.NewStore(dbtest.Bypass(t, pool), workspace.Options{})
	ctx := context.Background()
	id := func(name string) *workspace.Workspace {
		tid, err := workspace.NewThreadID("", name)
		require.NoError(t, err)
		return other.Workspace(tid)
	}

	woken := watch(t, h, "later")
	r.readWith(t, "later")
	wokenBy(t, woken, "the first read of its thread (a change before it is the version read)")
	_, err := id("later").SetObjective(ctx, "Created")
	require.NoError(t, err)
	wokenBy(t, woken, "the thread's creation")
	for i := range 3 {
		_, err := id("later").AddPreference(ctx, workspace.PreferenceInput{Title: fmt.Sprintf("Item %d", i)})
		require.NoError(t, err)
		wokenBy(t, woken, fmt.Sprintf("event %d", i+2))
	}
	require.NoError(t, id("later").Delete(ctx))
	wokenBy(t, woken, "the thread's deletion")

	second := watch(t, h, "second")
	r.readWith(t, "later", "second")
	wokenBy(t, second, "the first read of its thread")

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.asked {
		require.NotEmpty(t, a, "a read of no thread")
	}
}
