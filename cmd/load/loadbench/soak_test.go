package loadbench

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbfault"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
	"github.com/wsproxy/wsproxy/workspace"
)

// inProcessSoak is the soak's target in this process: the proxy (wrapped by wrap, when set) on a
// pool behind a fault proxy, in front of the soak's upstream.
func inProcessSoak(t *testing.T, wrap func(http.Handler) http.Handler) (soakTarget, *soakModel) {
	pool, fault := dbtest.NewFaultPool(t, nil)
	up := newSoakModel(fake.Faults{Status: 0.05, Reset: 0.03, Stall: 0.01, BadJSON: 0.02, StallFor: time.Second})
	upSrv := httptest.NewUnstartedServer(up)
	upSrv.Config = newSoakServer(up)
	upSrv.Start()
	t.Cleanup(upSrv.Close)
	u, _ := url.Parse(upSrv.URL + "/v1")
	p := proxy.NewServer(proxy.Options{
		Store:           workspace.NewStore(pool, workspace.Options{Timeout: 2 * time.Second}),
		UpstreamURL:     u,
		UpstreamTimeout: 300 * time.Millisecond,
		RetryBackoff:    time.Millisecond,
		AdminToken:      adminToken,
		Metrics:         proxy.NewMetrics(prometheus.NewRegistry(), proxy.MetricsOptions{}),
	})
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) }) // after the server below has closed
	var h http.Handler = p
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return soakTarget{baseURLs: []string{srv.URL}, adminToken: adminToken, cutEvery: 2 * time.Second, cutDB: cutFor(fault), settle: settleInProcess(pool)}, up
}

func cutFor(fault *dbfault.Proxy) func(time.Duration) {
	return func(d time.Duration) {
		fault.Cut()
		time.Sleep(d / 4)
		fault.Restore()
	}
}

// settleInProcess closes what the binary's process would not hold: the pool's connections
// through the fault proxy (two goroutines each, in this process) and, since this process's
// heap is the measure, collects the garbage.
func settleInProcess(pool *pgxpool.Pool) func() {
	return func() {
		pool.Reset()
		runtime.GC()
	}
}

// testLoad is the traffic of the soak tests: a number of requests, not a duration, so that the
// verdict judges the same traffic on a machine of any speed, however loaded. A handler that keeps
// every body (8 KB a thread turn) grows the live heap by about 5 MB over it, past the verdict's
// floor.
var testLoad = soakLoad{requests: 600}

// TestSoakShort is the soak in miniature: 600 requests of mixed traffic with upstream faults and
// Postgres cuts, against the proxy in-process; nothing lost, nothing duplicated, goroutines back
// to their baseline exactly, the live heap within the bound.
//
// The soak tests do not run in parallel: each measures the whole process's goroutines and heap.
func TestSoakShort(t *testing.T) {
	tgt, up := inProcessSoak(t, nil)
	sum, err := soak(context.Background(), tgt, up, testLoad, 8)
	require.NoError(t, err)
	t.Log(sum)
	require.Empty(t, sum.problems())
	require.Equal(t, sum.Reported, sum.StoredOnce)
	require.Positive(t, sum.DBCuts)
	require.NotEmpty(t, sum.Injected)
}

// TestSoakFindsLeaks: the verdict fails on a handler that leaks — a goroutine parked per request,
// or a slice that keeps every request body — and says which, at any speed.
func TestSoakFindsLeaks(t *testing.T) {
	for _, leak := range []struct {
		name, problem string
		wrap          func(t *testing.T, next http.Handler) http.Handler
	}{
		{"GoroutinePerRequest", "goroutines did not come back", func(t *testing.T, next http.Handler) http.Handler {
			release := make(chan struct{})
			var wg sync.WaitGroup
			t.Cleanup(func() { close(release); wg.Wait() }) // goleak checks the package once the tests end
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				wg.Go(func() { <-release })
				next.ServeHTTP(w, r)
			})
		}},
		{"KeepEveryBody", "the live heap grew", func(t *testing.T, next http.Handler) http.Handler {
			var kept [][]byte
			var mu sync.Mutex
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				kept = append(kept, body)
				mu.Unlock()
				r.Body = io.NopCloser(bytes.NewReader(body))
				next.ServeHTTP(w, r)
			})
		}},
	} {
		t.Run(leak.name, func(t *testing.T) {
			tgt, up := inProcessSoak(t, func(next http.Handler) http.Handler { return leak.wrap(t, next) })
			sum, err := soak(context.Background(), tgt, up, testLoad, 8)
			require.NoError(t, err)
			t.Log(sum)
			problems := sum.problems()
			require.Len(t, problems, 1, "%v", problems)
			require.Contains(t, problems[0], leak.problem)
		})
	}
}
