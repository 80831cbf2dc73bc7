package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
)

// TestUsageWrittenTogether: the usage of many turns of a few threads reaches Postgres exactly,
// in fewer statements than turns (a thread's turns within one interval are one statement), and
// what is still pending when the server stops is written by Wait.
func TestUsageWrittenTogether(t *testing.T) {
	t.Parallel()
	tracer := &dbtest.Statements{}
	e := setupWithPool(t, dbtest.NewPool(t, &dbtest.Options{Tracer: tracer}))
	e.up.Fallback = reply(cmpl("Done."))
	const threads, turns = 3, 20
	var wg sync.WaitGroup
	for i := range threads {
		wg.Go(func() {
			for range turns {
				readBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": fmt.Sprintf("u%d", i)}, `{"messages":[{"role":"user","content":"go"}]}`))
			}
		})
	}
	wg.Wait()
	e.proxy.Wait()
	for i := range threads {
		// cmpl reports 10 prompt tokens, 2 of them cached, and 5 completion tokens.
		require.Equal(t, tools.Usage{PromptTokens: 10 * turns, CachedPromptTokens: 2 * turns, CompletionTokens: 5 * turns}, e.workspace(fmt.Sprintf("u%d", i)).Usage)
	}
	added := tracer.Count("prompt_tokens = prompt_tokens +")
	require.Less(t, added, threads*turns, "statements adding usage")
	t.Logf("%d turns, %d statements adding usage", threads*turns, added)
}

// TestUsageKeptWhilePostgresIsAway: a write of usage that fails is retried with what came after;
// nothing is counted twice or lost.
func TestUsageKeptWhilePostgresIsAway(t *testing.T) {
	t.Parallel()
	pool, fault := dbtest.NewFaultPool(t, nil)
	store := tools.NewStore(pool, tools.Options{})
	id := tools.ThreadID{Name: "away"}
	_, err := store.Workspace(id).StartTurn(context.Background())
	require.NoError(t, err)
	logs := &lockedBuffer{}
	u := newUsageWriter(store, slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(u.close)

	fault.Cut()
	u.add(id, tools.Usage{PromptTokens: 5, CompletionTokens: 1})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "retrying") }, 10e9, 1e7)
	u.add(id, tools.Usage{PromptTokens: 3, CachedPromptTokens: 2})
	fault.Restore()
	require.Eventually(t, func() bool {
		d, err := store.Workspace(id).Get(context.Background())
		return err == nil && d.Usage == tools.Usage{PromptTokens: 8, CachedPromptTokens: 2, CompletionTokens: 1}
	}, 20e9, 1e7)
	u.close()
	d, err := store.Workspace(id).Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, tools.Usage{PromptTokens: 8, CachedPromptTokens: 2, CompletionTokens: 1}, d.Usage)
}
