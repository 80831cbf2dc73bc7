package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
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
	reader := workspace.NewStore(readerPool, workspace.Options{})
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

	d, err := reader.Workspace(workspace.ThreadID{Name: "late"}).Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, workspace.Usage{PromptTokens: 10, CachedPromptTokens: 2, CompletionTokens: 5}, d.Usage, "round 1's usage")
}

// TestShutdownEndsTheStreams: Shutdown ends at once what the rooms hold open — an admin event
// stream and an MCP subscriptions/listen stream, each live until then — which an HTTP server's
// shutdown would otherwise wait for.
func TestShutdownEndsTheStreams(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.admin("PUT", "/admin/v1/threads/open/objective", map[string]any{"text": "Before"}, 200, nil)
	events := e.openStream(e.srv.URL, "open", "", "")
	e.admin("PUT", "/admin/v1/threads/open/objective", map[string]any{"text": "Streamed"}, 200, nil)
	_, ev := events.Next()
	require.Equal(t, "objective_set", ev.Kind)

	lines := testkit.MCPListen(t, e.srv.URL, adminToken, "open") // returns once the stream holds its subscription

	ended := make(chan string, 2)
	go func() { _, _ = io.Copy(io.Discard, events.Resp.Body); ended <- "the event stream" }()
	go func() {
		for range lines {
		}
		ended <- "the listen stream"
	}()
	require.NoError(t, e.proxy.Shutdown(context.Background()))
	for range 2 {
		select {
		case <-ended:
		case <-time.After(time.Minute): // at once; a minute on a busy machine
			t.Fatal("a stream did not end at the shutdown")
		}
	}
}
