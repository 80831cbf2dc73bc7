package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
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
				testkit.ReadBody(t, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": fmt.Sprintf("u%d", i)}, `{"messages":[{"role":"user","content":"go"}]}`))
			}
		})
	}
	wg.Wait()
	require.NoError(t, e.proxy.Shutdown(context.Background()))
	for i := range threads {
		// cmpl reports 10 prompt tokens, 2 of them cached, and 5 completion tokens.
		require.Equal(t, workspace.Usage{PromptTokens: 10 * turns, CachedPromptTokens: 2 * turns, CompletionTokens: 5 * turns}, e.workspace(fmt.Sprintf("u%d", i)).Usage)
	}
	added := tracer.Count("INSERT INTO thread_usage")
	require.GreaterOrEqual(t, added, threads, "statements adding usage: one for each thread at least")
	require.Less(t, added, threads*turns, "statements adding usage")
	t.Logf("%d turns, %d statements adding usage", threads*turns, added)
}

// TestUsageKeptWhilePostgresIsAway: a write of usage that fails is retried with what came after;
// nothing is counted twice or lost.
func TestUsageKeptWhilePostgresIsAway(t *testing.T) {
	t.Parallel()
	pool, fault := dbtest.NewFaultPool(t, nil)
	store := workspace.NewStore(pool, workspace.Options{})
	id := workspace.ThreadID{Name: "away"}
	_, err := store.Workspace(id).StartTurn(context.Background(), workspace.TurnOptions{})
	require.NoError(t, err)
	logs := &lockedBuffer{}
	u := newUsageWriter(store, slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(u.close)

	fault.Cut()
	u.add(id, workspace.Usage{PromptTokens: 5, CompletionTokens: 1})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "retrying") }, 10e9, 1e7)
	u.add(id, workspace.Usage{PromptTokens: 3, CachedPromptTokens: 2})
	fault.Restore()
	require.Eventually(t, func() bool {
		d, err := store.Workspace(id).Get(context.Background())
		return err == nil && d.Usage == workspace.Usage{PromptTokens: 8, CachedPromptTokens: 2, CompletionTokens: 1}
	}, 20e9, 1e7)
	u.close()
	d, err := store.Workspace(id).Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, workspace.Usage{PromptTokens: 8, CachedPromptTokens: 2, CompletionTokens: 1}, d.Usage)
}

// TestUsageLag: wsproxy_usage_lag_seconds is 0 while every turn's usage is written, grows while
// Postgres refuses the writes, and is 0 again once they went through.
func TestUsageLag(t *testing.T) {
	t.Parallel()
	pool, fault := dbtest.NewFaultPool(t, nil)
	store := workspace.NewStore(pool, workspace.Options{})
	id := workspace.ThreadID{Name: "lagging"}
	_, err := store.Workspace(id).StartTurn(context.Background(), workspace.TurnOptions{})
	require.NoError(t, err)
	logs := &lockedBuffer{}
	u := newUsageWriter(store, slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(u.close)
	reg := prometheus.NewRegistry()
	NewMetrics(reg, MetricsOptions{}).watchUsage(u.lag)
	lag := func() float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "wsproxy_usage_lag_seconds" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no wsproxy_usage_lag_seconds")
		return 0
	}
	require.Zero(t, lag())

	fault.Cut()
	u.add(id, workspace.Usage{PromptTokens: 5, CompletionTokens: 1})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "retrying") }, 10e9, 1e7)
	behind := lag()
	require.Positive(t, behind)
	require.Eventually(t, func() bool { return lag() > behind }, 10e9, 1e7, "the lag grows while the writes fail")

	fault.Restore()
	require.Eventually(t, func() bool { return lag() == 0 }, 20e9, 1e7)
	d, err := store.Workspace(id).Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, workspace.Usage{PromptTokens: 5, CompletionTokens: 1}, d.Usage)
}

// TestUsageCountedOnceWhenTheAnswerIsLost: a batch that committed but whose answer was lost
// (the connection cut after the commit) is retried as it was, and counted once; the usage that
// came meanwhile is counted too.
func TestUsageCountedOnceWhenTheAnswerIsLost(t *testing.T) {
	t.Parallel()
	// One connection, which prepares the writer's statement on the first write (a statement
	// still to prepare waits for its description, which would be lost too).
	pool, fault := dbtest.NewFaultPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	store := workspace.NewStore(pool, workspace.Options{})
	id := workspace.ThreadID{Name: "lost-answer"}
	_, err := store.Workspace(id).StartTurn(context.Background(), workspace.TurnOptions{})
	require.NoError(t, err)
	direct := workspace.NewStore(dbtest.Bypass(t, pool), workspace.Options{}).Workspace(id)
	usage := func() workspace.Usage {
		d, err := direct.Get(context.Background())
		require.NoError(t, err)
		return d.Usage
	}
	logs := &lockedBuffer{}
	u := newUsageWriter(store, slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(u.close)

	u.add(id, workspace.Usage{CompletionTokens: 1})
	require.Eventually(t, func() bool { return usage().CompletionTokens == 1 }, 20e9, 1e7)

	fault.DropAnswers()
	u.add(id, workspace.Usage{PromptTokens: 100, CompletionTokens: 10})
	require.Eventually(t, func() bool { return usage().PromptTokens == 100 }, 20e9, 1e7, "the batch commits; its answer is lost")
	u.add(id, workspace.Usage{PromptTokens: 1})
	fault.Cut() // the writer's connection breaks: it cannot know that its batch committed
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "retrying") }, 20e9, 1e7)
	fault.Restore()
	u.close()
	require.Equal(t, workspace.Usage{PromptTokens: 101, CompletionTokens: 11}, usage())
}

// TestUsageAddNeverRacesClose: a turn's usage added while the writer closes (a turn that
// outlived the shutdown deadline) never races the writer's Wait (the race detector watches).
func TestUsageAddNeverRacesClose(t *testing.T) {
	t.Parallel()
	store := workspace.NewStore(dbtest.NewPool(t, nil), workspace.Options{})
	id := workspace.ThreadID{Name: "racing"}
	_, err := store.Workspace(id).StartTurn(context.Background(), workspace.TurnOptions{})
	require.NoError(t, err)
	for range 200 {
		u := newUsageWriter(store, slog.New(slog.DiscardHandler))
		added := make(chan struct{})
		go func() { u.add(id, workspace.Usage{PromptTokens: 1}); close(added) }()
		u.close()
		<-added
		u.close()
	}
}
