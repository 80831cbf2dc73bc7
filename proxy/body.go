package proxy

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
)

// Request bodies: read once, into a buffer that grows as bytes arrive (a client that declares
// 8 MiB and sends nothing holds 64 KiB, not 8 MiB), within a time bound, and counted against a
// budget shared by every request in flight.
const (
	// DefaultRequestReadTimeout is the longest a request body may take to arrive.
	DefaultRequestReadTimeout = 60 * time.Second
	// DefaultMaxBufferedBytes bounds the request bodies held in memory at once.
	DefaultMaxBufferedBytes = 256 << 20

	firstBodyBuffer = 64 << 10
	// After a body over MaxRequestBytes, up to maxDrain more bytes are read and thrown away
	// within drainTimeout, so that a client still sending sees the 413 instead of a reset
	// connection (as nginx's lingering close does); past either bound the connection is closed.
	maxDrain     = 64 << 20
	drainTimeout = 10 * time.Second
)

// bodyBudget bounds the bytes of request bodies held at once across all requests.
type bodyBudget struct {
	max  int64
	used atomic.Int64
}

// reserve takes n bytes of the budget; false when that would go over it.
func (b *bodyBudget) reserve(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *bodyBudget) release(n int64) { b.used.Add(-n) }

var errOverBudget = &apierr.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "server_busy",
	Message: "the proxy holds too many request bytes at once; retry shortly", Header: http.Header{"Retry-After": {"1"}}}

// readBody reads the whole request body, at most MaxRequestBytes of it, before anything is sent
// upstream (a re-read after the server closed it could cut a streamed response short:
// golang/go#40747). The caller calls release when it no longer needs the body. A body over the
// limit is answered here (413, apierr.ErrAnswered); one slower than RequestReadTimeout gets 408; one
// that does not fit in MaxBufferedBytes gets 503.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error) {
	release = func() {}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.opts.RequestReadTimeout))
	// Later reads of the connection (the server watching for a client that leaves) are not bounded.
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	if r.ContentLength > s.maxBytes {
		return nil, release, s.tooLarge(w, r, rc, 0)
	}
	size := int64(firstBodyBuffer)
	if r.ContentLength >= 0 && r.ContentLength < size {
		size = r.ContentLength + 1 // +1: reading EOF needs no growth
	}
	var reserved int64
	release = func() { s.budget.release(reserved) }
	grow := func(n int64) bool {
		if !s.budget.reserve(n - reserved) {
			return false
		}
		reserved = n
		return true
	}
	if !grow(size) {
		return nil, release, errOverBudget
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > s.maxBytes {
				return nil, release, s.tooLarge(w, r, rc, int64(len(buf)))
			}
			next := min(2*int64(cap(buf)), s.maxBytes+1)
			if r.ContentLength > int64(cap(buf)) {
				next = min(next, r.ContentLength+1)
			}
			if !grow(next) {
				return nil, release, errOverBudget
			}
			buf = append(make([]byte, 0, next), buf...)
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				w.Header().Set("Connection", "close")
				return nil, release, &apierr.Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
					Message: "the request body did not arrive within " + s.opts.RequestReadTimeout.String()}
			}
			return nil, release, apierr.BadRequest("invalid_body", "", "the request body could not be read")
		}
	}
	if int64(len(buf)) > s.maxBytes {
		return nil, release, s.tooLarge(w, r, rc, int64(len(buf)))
	}
	return buf, release, nil
}

// tooLarge answers 413 for a body over MaxRequestBytes of which read bytes were read: it first
// reads and throws away the rest (up to maxDrain, within drainTimeout), so that the answer
// reaches a client that is still sending.
func (s *Server) tooLarge(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, read int64) error {
	if r.ContentLength < 0 || r.ContentLength-read <= maxDrain {
		_ = rc.SetReadDeadline(time.Now().Add(drainTimeout))
		_, _ = io.CopyN(io.Discard, r.Body, maxDrain)
	}
	w.Header().Set("Connection", "close")
	apierr.Write(w, r, s.log, &apierr.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: "the request body is over " + strconv.FormatInt(s.maxBytes, 10) + " bytes"})
	return apierr.ErrAnswered
}
