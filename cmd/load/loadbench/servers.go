package loadbench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime"
	"sync/atomic"
	"time"
)

// The servers the harness starts as processes of its own (see spawnSelf): the fake model
// (proxy/upstreamtest/fake) and the bare proxy, each served by ServeCounted.

// BareProxy is the baseline: httputil.ReverseProxy with nothing added, in full duplex. Go's
// HTTP/1 server otherwise drains and closes a request's body when the handler begins to write
// the answer (golang/go#40747), while the transport may still be copying that body upstream or
// reading it once more for its end: its write fails, it closes the upstream connection, and the
// answer on it is cut (0.5–0.8 % of streamed answers at one client, in make bench-load) or the
// next request dials again.
func BareProxy(target *url.URL) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		FlushInterval: -1,
		Transport:     &http.Transport{MaxIdleConnsPerHost: 256},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	})
}

// statsPath serves a process's figures to the latency harness: JSON, and with ?reset the peak
// starts again from what is open now.
const statsPath = "/_load/stats"

// loadStats are the figures of the harness's own processes (the model upstream, the bare
// proxy).
type loadStats struct {
	Goroutines int   `json:"goroutines"`
	Open       int64 `json:"open_connections"`
	Peak       int64 `json:"peak_open_connections"`
	Accepted   int64 `json:"accepted_connections"`
}

// connCounter counts a server's connections (its connState is the http.Server's ConnState) and
// serves them with the process's goroutines at statsPath.
type connCounter struct {
	open, peak, accepted atomic.Int64
}

func (c *connCounter) connState(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		c.accepted.Add(1)
		n := c.open.Add(1)
		for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
		}
	case http.StateClosed, http.StateHijacked:
		c.open.Add(-1)
	}
}

func (c *connCounter) serveStats(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("reset") {
		c.peak.Store(c.open.Load())
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(loadStats{Goroutines: runtime.NumGoroutine(), Open: c.open.Load(), Peak: c.peak.Load(), Accepted: c.accepted.Load()})
}

// ServeCounted serves h on a new listener at addr until ctx ends, printing its address first
// (as spawnSelf expects), its connections counted and served at statsPath.
func ServeCounted(ctx context.Context, addr string, h http.Handler) error {
	c := &connCounter{}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	srv := &http.Server{ReadHeaderTimeout: time.Minute, ConnState: c.connState, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == statsPath {
			c.serveStats(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})}
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}
