package workspace

// The tests of the package's unexported parts. The other tests are of package workspace_test,
// which runs tool calls through package tools (which imports this package).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
)

// TestInheritedCacheBounded: the cache of decoded inherited lists answers a list it saw from its
// bytes, and never holds more than its bound of them.
func TestInheritedCacheBounded(t *testing.T) {
	t.Parallel()
	var c inheritedCache
	own := []Preference{{ID: 1, Title: "Mine", Kind: Soft}}
	for i := range 40000 { // past the bound: the cache starts again
		raw := fmt.Appendf(nil, `[{"scope":"alice","preferences":[{"id":1,"title":"Rule %d of a long list of rules","subtitle":"","kind":"soft","locked":false}]}]`, i)
		s, err := c.shown(raw, []byte(`[{"id":1,"title":"Mine"}]`), own, "")
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("Rule %d of a long list of rules", i), s[0].Preferences[0].Title)
		require.LessOrEqual(t, c.bytes, maxInheritedCached)
	}
	raw := []byte(`[{"scope":"alice","preferences":[{"id":1,"title":"mine","subtitle":"","kind":"soft","locked":false}]}]`)
	s, err := c.shown(raw, nil, own, "")
	require.NoError(t, err)
	require.Empty(t, s, "the thread's own title hides the inherited one")
	again, err := c.shown(raw, nil, own, "")
	require.NoError(t, err)
	require.Equal(t, s, again)
}

// TestTurnStartBatchLeavesOutGivenUp: a batch of turn starts that waited for a pooled connection
// leaves out the starts whose callers gave up meanwhile (the client left, or DATABASE_TIMEOUT ran
// out: a 503): they begin no turn, and the others begin theirs.
func TestTurnStartBatchLeavesOutGivenUp(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, &dbtest.Options{MaxConns: 1})
	store := NewStore(pool, Options{Timeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held, err := pool.Acquire(ctx) // the pool's one connection: the batch waits for it
	require.NoError(t, err)
	leaving, leave := context.WithCancel(ctx)
	gone := &pendingStart{ctx: leaving, args: db.TurnStartParams{ThreadID: store.Workspace(ThreadID{Name: "gone"}).threadID}, done: make(chan startResult, 1)}
	stays := &pendingStart{ctx: ctx, args: db.TurnStartParams{ThreadID: store.Workspace(ThreadID{Name: "stays"}).threadID}, done: make(chan startResult, 1)}
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		store.starter.send([]*pendingStart{gone, stays})
	}()
	leave()
	held.Release()
	<-sent
	r := <-stays.done
	require.NoError(t, r.err)
	require.Equal(t, int32(1), r.row.Turn)
	threads, err := store.Threads(ctx, "", "", ThreadFilter{}, 10)
	require.NoError(t, err)
	require.Len(t, threads, 1, "only the start that stayed began a turn (and created its thread)")
	require.Equal(t, stays.args.ThreadID, threads[0].ID)
}
