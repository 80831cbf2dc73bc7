package main

import (
	"context"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy"
	"github.com/wsproxy/wsproxy/tools"
)

// TestSoakShort is the soak in miniature: seconds of mixed traffic with upstream faults and a
// Postgres cut, against the proxy in-process; nothing lost, nothing duplicated.
func TestSoakShort(t *testing.T) {
	pool, fault := dbtest.NewFaultPool(t, nil)
	up := newSoakUpstream(faultRates{status: 0.05, reset: 0.03, stall: 0.01, badJSON: 0.02, stallFor: time.Second})
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	u, _ := url.Parse(upSrv.URL + "/v1")
	srv := httptest.NewServer(proxy.NewServer(proxy.Options{
		Store:           tools.NewStore(pool, tools.Options{Timeout: 2 * time.Second}),
		UpstreamURL:     u,
		UpstreamTimeout: 300 * time.Millisecond,
		RetryBackoff:    time.Millisecond,
		AdminToken:      "soak",
		Metrics:         proxy.NewMetrics(prometheus.NewRegistry()),
	}))
	defer srv.Close()
	tgt := soakTarget{baseURL: srv.URL, adminToken: "soak", cutEvery: 2 * time.Second, cutDB: func(d time.Duration) {
		fault.Cut()
		time.Sleep(d / 4)
		fault.Restore()
	}}
	sum, err := soak(context.Background(), tgt, up, 5*time.Second, 8)
	require.NoError(t, err)
	t.Log(sum)
	require.Positive(t, sum.Reported)
	require.Zero(t, sum.Lost)
	require.Zero(t, sum.Duplicated)
	require.Equal(t, sum.Reported, sum.StoredOnce)
	require.Positive(t, sum.DBCuts)
	require.NotEmpty(t, sum.Injected)
}
