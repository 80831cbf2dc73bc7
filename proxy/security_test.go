package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rawExchange writes raw to a new connection to the proxy and reads every response until the
// server closes the connection; open reports a connection still open after them.
func (e *env) rawExchange(t *testing.T, raw string) (resps []*http.Response, bodies []string, open bool) {
	t.Helper()
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, raw)
	require.NoError(t, err)
	// A guard against a server that keeps the connection: it is never reached otherwise.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(conn)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				open = true
			}
			return resps, bodies, open
		}
		b, _ := io.ReadAll(resp.Body)
		resps, bodies = append(resps, resp), append(bodies, string(b))
	}
}

// TestAmbiguousFramingRefused: a request with both Content-Length and Transfer-Encoding gets a
// 400 and its connection closed, so that the bytes after its chunked body never run as a second
// request (a front proxy that frames by Content-Length sends them as the first one's body);
// alone, each framing is served as before, on one keep-alive connection.
func TestAmbiguousFramingRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Fallback = reply(`{"object":"list","data":[]}`)
	const smuggled = "GET /v1/models/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	const chunked = "0\r\n\r\n" + smuggled
	const lines = "{\"input\":\"a\r\nContent-Length: 3\r\n\"}" // a body whose lines look like a head's
	plain := fmt.Sprintf("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", len(lines)) + lines
	for name, raw := range map[string]string{
		"length first":   fmt.Sprintf("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n", len(chunked)) + chunked,
		"encoding first": fmt.Sprintf("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\ncontent-length: %d\r\n\r\n", len(chunked)) + chunked,
		"after another":  plain + fmt.Sprintf("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n", len(chunked)) + chunked,
		"HTTP/1.0":       fmt.Sprintf("POST /v1/embeddings HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n", len(chunked)) + chunked,
	} {
		resps, bodies, open := e.rawExchange(t, raw)
		require.False(t, open, "%s: the connection stayed open", name)
		require.NotEmpty(t, resps, name)
		last := len(resps) - 1
		require.Equal(t, http.StatusBadRequest, resps[last].StatusCode, "%s: %s", name, bodies[last])
		requireErrorBody(t, bodies[last], "invalid_request_error", "invalid_framing")
		for _, r := range e.up.Requests() {
			require.NotEqual(t, "/v1/models/smuggled", r.Path, name)
		}
	}

	// Each framing alone, and a body whose lines look like a head, on one connection.
	const body = "{\"input\":\"x\"}"
	raw := plain + fmt.Sprintf("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body) +
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
	resps, bodies, open := e.rawExchange(t, raw)
	require.False(t, open)
	require.Len(t, resps, 3, strings.Join(bodies, "\n"))
	for i, r := range resps {
		require.Equal(t, 200, r.StatusCode, bodies[i])
	}
}

// chunkConn is a connection whose reads return at most size bytes of data at a time.
type chunkConn struct {
	net.Conn
	data []byte
	size int
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.size)], c.data)
	c.data = c.data[n:]
	return n, nil
}

// TestFramingConnHeads: however the network splits a stream, a request read as Go's server reads
// it (http.ReadRequest on a buffered reader) finds its own head's framing, whatever the requests
// and bodies before it held.
func TestFramingConnHeads(t *testing.T) {
	t.Parallel()
	const headLike = "x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n" // a body's lines
	stream := "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: " + fmt.Sprint(len(headLike)) + "\r\n\r\n" + headLike +
		"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(headLike), headLike) +
		"GET /c HTTP/1.1\r\nHost: x\r\nX-A: b HTTP/1.1\r\n\r\n" +
		"POST /d HTTP/1.1\r\nHost: x\r\ncontent-length: 5\r\nX-A: b HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\n\r\n0\r\n\r\n" +
		"GET /e HTTP/1.1\nHost: x\n\n"
	want := map[string]bool{"/a": false, "/b": false, "/c": false, "/d": true, "/e": false}
	for _, size := range []int{1, 2, 3, 5, 7, 64, len(stream)} {
		fc := &framingConn{Conn: &chunkConn{data: []byte(stream), size: size}, length: -1}
		br := bufio.NewReader(fc)
		got := map[string]bool{}
		for {
			r, err := http.ReadRequest(br)
			if err != nil {
				require.ErrorIs(t, err, io.EOF, "size %d", size)
				break
			}
			got[r.URL.Path] = fc.both.Load()
			_, err = io.Copy(io.Discard, r.Body)
			require.NoError(t, err, "size %d %s", size, r.URL.Path)
		}
		require.Equal(t, want, got, "size %d", size)
	}
}
