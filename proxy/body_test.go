package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
)

// rawRequest opens a connection to the proxy and writes a request head; the test writes the
// body itself.
func rawRequest(t *testing.T, e *env, path string, header string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\n", path, header)
	require.NoError(t, err)
	return conn
}

// TestTooLargeReachesASlowWriter: a client that sends a 9 MiB body in 64 KiB pieces, slowly,
// gets the 413 (and not a reset connection), with and without a thread, with and without a
// Content-Length.
func TestTooLargeReachesASlowWriter(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const size, piece = 9 << 20, 64 << 10
	for _, tt := range []struct{ name, header string }{
		{"NoThread", fmt.Sprintf("Content-Length: %d\r\n", size)},
		{"Thread", fmt.Sprintf("Content-Length: %d\r\nX-Thread-Id: big\r\n", size)},
		{"Chunked", "Transfer-Encoding: chunked\r\nX-Thread-Id: big\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := rawRequest(t, e, "/v1/chat/completions", tt.header)
			chunked := strings.Contains(tt.header, "chunked")
			buf := []byte(`{"messages":[],"x":"` + strings.Repeat("x", piece) + `"}`)[:piece]
			for sent := 0; sent < size; sent += piece {
				var err error
				if chunked {
					_, err = fmt.Fprintf(conn, "%x\r\n%s\r\n", piece, buf)
				} else {
					_, err = conn.Write(buf)
				}
				require.NoError(t, err, "the proxy let the client send its body (sent %d)", sent)
				time.Sleep(time.Millisecond)
			}
			if chunked {
				_, err := io.WriteString(conn, "0\r\n\r\n")
				require.NoError(t, err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
			testkit.RequireErrorBody(t, string(body), "invalid_request_error", "request_too_large")
		})
	}
}

// TestSlowBodyTimesOut: a body that does not arrive within RequestReadTimeout gets 408.
func TestSlowBodyTimesOut(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.RequestReadTimeout = 200 * time.Millisecond })
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		conn := rawRequest(t, e, path, "Content-Length: 100\r\nX-Thread-Id: slow\r\n")
		_, err := io.WriteString(conn, `{"messages":[`)
		require.NoError(t, err)
		start := time.Now()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, path)
		testkit.RequireErrorBody(t, string(body), "invalid_request_error", "request_timeout")
		require.Less(t, time.Since(start), 5*time.Second)
	}
}

// TestBodyBuffersGrowAsBytesArrive: 100 connections that declare 8 MiB and send nothing hold
// one small first buffer each, not 8 MiB; a request that would take the proxy over
// MaxBufferedBytes gets 503 with Retry-After; the budget comes back when they end.
func TestBodyBuffersGrowAsBytesArrive(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.MaxBufferedBytes = 100 * firstBodyBuffer })
	var conns []net.Conn
	for range 100 {
		conns = append(conns, rawRequest(t, e, "/v1/chat/completions", fmt.Sprintf("Content-Length: %d\r\n", 8<<20)))
	}
	require.Eventually(t, func() bool { return e.proxy.budget.used.Load() == 100*firstBodyBuffer }, 5*time.Second, 10*time.Millisecond,
		"each waiting body holds %d bytes", firstBodyBuffer)
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "busy"}, `{"messages":[]}`)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	testkit.RequireErrorBody(t, testkit.ReadBody(t, resp), "server_error", "server_busy")
	for _, c := range conns {
		c.Close()
	}
	require.Eventually(t, func() bool { return e.proxy.budget.used.Load() == 0 }, 5*time.Second, 10*time.Millisecond)
	e.up.Fallback = reply(cmpl("ok"))
	require.Equal(t, 200, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "busy"}, `{"messages":[]}`).StatusCode)
}
