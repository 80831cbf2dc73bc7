package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// TestStreamedRoundsReuseTheUpstreamConnection: a streamed round read to its [DONE] (chat) or
// its terminal event (Responses) leaves its upstream connection open for the next round and the
// next turn, as a pass-through does: turns one after the other, each with a workspace round,
// need about one connection, not one per round (a new TCP, and with a hosted model a new TLS,
// handshake each). The upstream ends each response a moment after its last event, as a server
// that logs or counts after it would: the proxy reads on to the end. Connections are told apart by
// the upstream's view of the proxy's address.
func TestStreamedRoundsReuseTheUpstreamConnection(t *testing.T) {
	t.Parallel()
	const turns = 5
	add := `{"items":[{"title":"Trains only"}],"action_and_reasoning":"stated"}`
	for _, api := range []string{"chat", "responses"} {
		t.Run(api, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			endLate := func(reply upstreamtest.Reply) upstreamtest.Reply {
				return func(w http.ResponseWriter, r *http.Request) {
					reply(w, r)
					time.Sleep(20 * time.Millisecond)
				}
			}
			path, body := "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			for i := range turns {
				if api == "chat" {
					e.up.Script(
						endLate(upstreamtest.Stream(upstreamtest.ToolCallChunks("chatcmpl-1", 8, call{ID: "p1", Name: "add_preferences", Arguments: add})...)),
						endLate(upstreamtest.Stream(upstreamtest.ContentChunks("chatcmpl-2", "Noted.")...)))
				} else {
					path, body = "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`
					e.up.Script(
						endLate(rspec{ID: "resp_1", Items: []upstreamtest.Item{callItem("fc_1", "call_1", "add_preferences", add)}}.Stream()),
						endLate(rspec{ID: "resp_2", Items: []upstreamtest.Item{msgItem("msg_2", "Noted.")}}.Stream()))
				}
				resp := e.post(path, map[string]string{"X-Thread-Id": "reuse-" + api}, body)
				require.Equal(t, 200, resp.StatusCode)
				got := testkit.ReadBody(t, resp)
				require.Contains(t, got, "Noted.", "turn %d", i)
				require.NotContains(t, got, `data: {"error"`, "turn %d", i)
				require.NotContains(t, got, "event: error", "turn %d", i)
			}
			var conns []string
			for _, r := range e.up.Requests() {
				if !slices.Contains(conns, r.RemoteAddr) {
					conns = append(conns, r.RemoteAddr)
				}
			}
			require.Len(t, e.up.Requests(), 2*turns)
			require.LessOrEqual(t, len(conns), 2, "%d upstream connections for %d rounds: %s", len(conns), 2*turns, strings.Join(conns, ", "))
		})
	}
}

// TestManyUpstreamConnectionsKeptIdle: after a burst of concurrent requests, the proxy keeps
// the burst's upstream connections for the next one, however many there were (Go's
// DefaultTransport keeps at most 100 idle connections): a second burst as large opens none.
func TestManyUpstreamConnectionsKeptIdle(t *testing.T) {
	t.Parallel()
	const burst = 150
	e := setup(t)
	var (
		mu      sync.Mutex
		arrived int
		release = make(chan struct{})
	)
	e.up.Fallback = func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if arrived++; arrived%burst == 0 {
			close(release) // the whole burst is in: every request holds a connection
		}
		wait := release
		mu.Unlock()
		select {
		case <-wait:
		case <-time.After(time.Minute):
			t.Error("the burst never came in whole")
		}
		upstreamtest.JSON(200, upstreamtest.Completion("ok"))(w, r)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: burst}}
	defer client.CloseIdleConnections()
	sendBurst := func() {
		var wg sync.WaitGroup
		for range burst {
			wg.Go(func() {
				resp, err := client.Post(e.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
				if !assert.NoError(t, err) {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, 200, resp.StatusCode)
			})
		}
		wg.Wait()
	}
	sendBurst()
	mu.Lock()
	release = make(chan struct{})
	mu.Unlock()
	sendBurst()
	conns := map[string]bool{}
	for _, r := range e.up.Requests() {
		conns[r.RemoteAddr] = true
	}
	require.Len(t, e.up.Requests(), 2*burst)
	require.Equal(t, burst, len(conns), "upstream connections of two bursts of %d", burst)
}

// writeCounter counts the writes to the connections it wraps.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestUpstreamRequestInOneWrite: a request goes to the upstream in one write, its head and its
// body together, whether it passes through (the chat route without a thread, any other route)
// or is a thread turn's round (the client's body, the workspace block and the tools: 5 KiB and
// more). A write costs the proxy a system call and the upstream a wake-up; net/http flushes the
// head in a write of its own unless the body is one it knows to be in memory.
func TestUpstreamRequestInOneWrite(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tr := e.proxy.transport.(*timeoutTransport).Base.(*http.Transport)
	var writes atomic.Int64
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}
	long := strings.Repeat("many words ", 200) // a 2 KiB message
	for _, c := range []struct{ name, path, thread, body string }{
		{"chat pass-through", "/v1/chat/completions", "", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`},
		{"other route", "/v1/embeddings", "", `{"model":"e","input":"` + long + `"}`},
		{"thread turn", "/v1/chat/completions", "one-write", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`},
	} {
		e.up.Script(upstreamtest.JSON(200, upstreamtest.Completion("ok")))
		writes.Store(0)
		header := map[string]string{}
		if c.thread != "" {
			header["X-Thread-Id"] = c.thread
		}
		resp := e.post(c.path, header, c.body)
		require.Equal(t, 200, resp.StatusCode, c.name)
		testkit.ReadBody(t, resp)
		assert.Equal(t, int64(1), writes.Load(), "%s: writes of one upstream request", c.name)
	}
}
