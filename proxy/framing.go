package proxy

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
)

// Requests that carry both Content-Length and Transfer-Encoding are refused with 400 and their
// connection closed (RFC 9112 §6.1: the server "MUST close the connection after responding to
// such a request"). Go's server serves them by Transfer-Encoding alone and deletes the
// Content-Length from the header before a handler runs (net/http transfer.go, fixLength), so a
// front proxy that frames by Content-Length would have the rest of the body run here as a
// second request. The handler cannot see the header that went, so the connection watches the
// raw request heads as Go's server reads them: Listener wraps the listener, ConnContext lets the
// handler find its connection.

// Listener wraps ln's connections so that ServeHTTP can refuse a request whose head named both
// Content-Length and Transfer-Encoding. Serve plain HTTP on it (the connections see the bytes
// as they come from the network), with http.Server.ConnContext set to ConnContext.
func Listener(ln net.Listener) net.Listener { return framingListener{ln} }

// ConnContext is the http.Server.ConnContext that goes with Listener.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if fc, ok := c.(*framingConn); ok {
		return context.WithValue(ctx, framingKey{}, fc)
	}
	return ctx
}

type framingKey struct{}

type framingListener struct{ net.Listener }

func (l framingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &framingConn{Conn: c, length: -1}, nil
}

// framingConn reads the connection for Go's server and reads the request heads in it: the
// lines since the last request line, up to each blank line that ends a head. A Read never
// returns bytes past the end of a head: Go's server reads a head to its blank line and no
// further before it calls the handler (textproto stops at the blank line; nothing is read
// ahead while a body remains), so when a handler starts, the last head the connection saw is
// its request's. A body of a Content-Length is passed over unread, so that the next request
// line starts a line however the body ends; a chunked body is read as lines, and ends with a
// blank line. A blank line that ends no line of a head (leading CRLFs, a blank line after
// another) records nothing.
type framingConn struct {
	net.Conn
	pending []byte // read from the network, not yet returned
	err     error  // the error that came with pending's bytes
	own     []byte // pending's storage

	line lineHead
	// Since the last request line: whether a Content-Length and a Transfer-Encoding header
	// line were seen, and whether any line was; length is the Content-Length (-1: none read).
	sawLength, sawEncoding, sawLine bool
	length                          int64
	skip                            int64 // the body bytes still to pass over
	// both is set at each blank line that ends a head: it named both headers. Read by the
	// handler's goroutine (Go's background read may be reading meanwhile).
	both atomic.Bool
}

// CloseWrite lets Go's server half-close a TCP connection before it closes it (as it does for
// an unwrapped one), so that the client reads the last response before the reset.
func (c *framingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *framingConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.pending) > 0 {
		n := c.scan(c.pending[:min(len(p), len(c.pending))])
		copy(p, c.pending[:n])
		c.pending = c.pending[n:]
		if len(c.pending) == 0 && c.err != nil {
			err := c.err
			c.err = nil
			return n, err
		}
		return n, nil
	}
	n, err := c.Conn.Read(p)
	cut := c.scan(p[:n])
	if cut < n { // the rest after a head's end waits for the next Read
		c.own = append(c.own[:0], p[cut:n]...)
		c.pending, c.err = c.own, err
		return cut, nil
	}
	return n, err
}

// scan reads b as the next bytes of the stream and returns how many of them to deliver: all of
// them, or up to and including the newline of a blank line that ends a head.
func (c *framingConn) scan(b []byte) int {
	i := 0
	if c.skip > 0 {
		i = int(min(c.skip, int64(len(b))))
		c.skip -= int64(i)
	}
	for i < len(b) {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			c.line.add(b[i:])
			return len(b)
		}
		c.line.add(b[i : i+j])
		i += j + 1
		blank := c.line.blank()
		c.endLine()
		if blank && c.sawLine {
			c.both.Store(c.sawLength && c.sawEncoding)
			if c.sawLength && !c.sawEncoding && c.length > 0 {
				c.skip = c.length
			}
			c.sawLength, c.sawEncoding, c.sawLine, c.length = false, false, false, -1
			return i
		}
	}
	return len(b)
}

// endLine accounts for the line just ended.
func (c *framingConn) endLine() {
	l := &c.line
	switch {
	case l.blank():
	case l.requestLine():
		c.sawLength, c.sawEncoding, c.sawLine, c.length = false, false, true, -1
	case l.names("content-length:"):
		c.sawLine, c.sawLength = true, true
		if n, ok := l.value(len("content-length:")); ok && c.length < 0 {
			c.length = n
		}
	default:
		c.sawLine = true
		c.sawEncoding = c.sawEncoding || l.names("transfer-encoding:")
	}
	*l = lineHead{}
}

// lineHead is what the framing needs of one line, in constant memory whatever its length: its
// first bytes, its length, its spaces and the bytes after the last one.
type lineHead struct {
	head    [64]byte
	n       int // the line's length so far
	spaces  int
	tail    [16]byte // the bytes after the last space (from the start without one)
	tailLen int      // -1: more than 16 of them
}

func (l *lineHead) add(b []byte) {
	if l.n < len(l.head) {
		copy(l.head[l.n:], b)
	}
	l.n += len(b)
	if k := bytes.LastIndexByte(b, ' '); k >= 0 {
		l.spaces += bytes.Count(b, []byte{' '})
		l.tailLen = 0
		b = b[k+1:]
	}
	if l.tailLen >= 0 && l.tailLen+len(b) <= len(l.tail) {
		l.tailLen += copy(l.tail[l.tailLen:], b)
	} else {
		l.tailLen = -1
	}
}

// blank reports an empty line (a lone CR counts: Go's server reads CRLF and LF line ends).
func (l *lineHead) blank() bool { return l.n == 0 || (l.n == 1 && l.head[0] == '\r') }

// requestLine reports a line shaped as a request line: METHOD SP target SP HTTP/x.y. No header
// line has that shape: a header's name ends in ':', which a method cannot hold (RFC 9110 §9.1:
// a method is a token), and Go's server refuses a name followed by a space.
func (l *lineHead) requestLine() bool {
	if l.spaces != 2 || l.tailLen < 0 {
		return false
	}
	tail := bytes.TrimSuffix(l.tail[:l.tailLen], []byte{'\r'})
	if !bytes.HasPrefix(tail, []byte("HTTP/")) {
		return false
	}
	head := l.head[:min(l.n, len(l.head))]
	sp := bytes.IndexByte(head, ' ')
	if sp <= 0 {
		return false
	}
	for _, ch := range head[:sp] {
		if !isTokenChar(ch) {
			return false
		}
	}
	return true
}

// names reports a header line of the field name (lower case, with its colon).
func (l *lineHead) names(field string) bool {
	if l.n < len(field) {
		return false
	}
	return bytes.EqualFold(l.head[:len(field)], []byte(field))
}

// value reads a Content-Length's value after the field name's from bytes (spaces and tabs
// around it; ok false when it is not all digits or not within the line's first bytes).
func (l *lineHead) value(from int) (int64, bool) {
	if l.n > len(l.head) {
		return 0, false
	}
	v := bytes.Trim(bytes.TrimSuffix(l.head[from:l.n], []byte{'\r'}), " \t")
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + int64(ch-'0')
	}
	return n, true
}

// isTokenChar reports the characters of an HTTP token (RFC 9110 §5.6.2).
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
}

// ambiguousFraming reports whether the request's head named both Content-Length and
// Transfer-Encoding (on a connection of Listener).
func ambiguousFraming(r *http.Request) bool {
	fc, ok := r.Context().Value(framingKey{}).(*framingConn)
	return ok && fc.both.Load()
}

var errAmbiguousFraming = &apierr.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_framing",
	Message: "a request may carry Content-Length or Transfer-Encoding, not both", Header: http.Header{"Connection": {"close"}}}
