package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
)

// heldRound is a transport whose second request waits for release, whatever its context says:
// a turn still running when the server's shutdown deadline passes.
type heldRound struct {
	n       atomic.Int32
	held    chan struct{} // closed when the second request arrives
	release chan struct{}
}

func (h *heldRound) RoundTrip(req *http.Request) (*http.Response, error) {
	if h.n.Add(1) == 2 {
		close(h.held)
		<-h.release
		return nil, errors.New("the upstream went away")
	}
	return http.DefaultTransport.RoundTrip(req)
}

// TestATurnPastTheShutdownDeadlineKeepsItsUsage: a turn still running when SHUTDOWN_TIMEOUT
// passes (its connection closed under it) ends before Wait writes the last usage and returns,
// and so before the pool closes: the usage of its rounds is kept.
func TestATurnPastTheShutdownDeadlineKeepsItsUsage(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	readerPool, err := pgxpoolNew(pool.Config().Copy())
	require.NoError(t, err)
	t.Cleanup(readerPool.Close)
	reader := tools.NewStore(readerPool, tools.Options{})
	transport := &heldRound{held: make(chan struct{}), release: make(chan struct{})}
	e := setupWithPool(t, pool, func(o *Options) { o.Transport = transport })
	e.up.Script(reply(cmpl("", call{ID: "l", Name: "list_preferences", Arguments: `{}`})))

	// The program's shutdown (cmd/proxy Main.Close), with a server of its own.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: e.proxy}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		resp, err := http.Post("http://"+ln.Addr().String()+"/threads/late/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"go"}]}`))
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-transport.held // round 1 ran the call and counted its usage; round 2 waits
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, srv.Shutdown(ctx), context.DeadlineExceeded, "the turn outlives SHUTDOWN_TIMEOUT")
	require.NoError(t, srv.Close())
	waited := make(chan struct{})
	go func() { _ = e.proxy.Shutdown(context.Background()); close(waited) }()
	select {
	case <-waited: // Wait did not wait for the turn
	case <-time.After(time.Second): // it waits: let the turn end
	}
	close(transport.release)
	<-waited
	pool.Close() // as the program closes it after Shutdown

	d, err := reader.Workspace(tools.ThreadID{Name: "late"}).Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, tools.Usage{PromptTokens: 10, CachedPromptTokens: 2, CompletionTokens: 5}, d.Usage, "round 1's usage")
}
