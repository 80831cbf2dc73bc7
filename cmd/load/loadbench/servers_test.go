package loadbench

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The bare proxy relays an answer whose head the upstream sends before it has the request's whole
// body, as a model may stream, and keeps its upstream connection. Go's HTTP/1 server drains and
// closes a request's body when its handler begins to write the answer (golang/go#40747): the
// transport, still copying that body upstream (or reading it once more for its end), fails its
// write and closes the upstream connection, and the answer on it is cut. A baseline that cut
// answers and dialled again would make every proxy compared with it look cheaper.
func TestBareProxyFullDuplex(t *testing.T) {
	t.Parallel()
	var dials atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "data: first\n\n")
		_ = http.NewResponseController(w).Flush()
		body, err := io.ReadAll(r.Body) // the rest of the body comes after the answer's head
		if err != nil {
			return
		}
		_, _ = fmt.Fprintf(w, "data: got %d bytes\n\n", len(body))
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	up.Start()
	defer up.Close()
	target, err := url.Parse(up.URL)
	require.NoError(t, err)
	proxy := httptest.NewServer(BareProxy(target))
	defer proxy.Close()

	// A client that sends the head and half of the body, waits for the answer's head, then
	// sends the other half: two requests on one connection.
	conn, err := net.Dial("tcp", strings.TrimPrefix(proxy.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := range 2 {
		_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"a\":")
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "request %d", i)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		answer := bufio.NewReader(resp.Body)
		first, err := answer.ReadString('\n')
		require.NoError(t, err, "request %d", i)
		require.Equal(t, "data: first\n", first)
		_, err = io.WriteString(conn, "1}\n")
		require.NoError(t, err)
		rest, err := io.ReadAll(answer)
		require.NoError(t, err, "request %d: the answer was cut", i)
		require.Contains(t, string(rest), "data: got 8 bytes", "request %d", i)
	}
	require.Equal(t, int64(1), dials.Load(), "the bare proxy dialled the upstream again")
}
