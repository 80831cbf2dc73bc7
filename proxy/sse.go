package proxy

import (
	"net/http"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/sse"
	"github.com/wsproxy/wsproxy/workspace"
)

// sseWriter is the client side of a streamed turn: server-sent events on the response, and a
// keepalive (a comment, or the Messages API's ping event) when the client has had nothing for
// the keepalive interval (docs/spec.md §16) — once the stream started, or once the proxy began
// a round the client cannot see (before that, the client waits for the upstream's status as it
// would straight). The keepalive is a
// runtime timer, not a goroutine: it fires only when the stream is silent.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	thread  string
	every   time.Duration
	mu      sync.Mutex // the timer writes too
	started bool
	waiting bool // a round the client cannot see began: keepalives may start the stream
	closed  bool
	last    time.Time // the last write
	timer   *time.Timer
	ping    []byte // the keepalive, as the dialect makes it
	buf     []byte
}

func (s *Server) sseWriter(w http.ResponseWriter, thread workspace.ThreadID) *sseWriter {
	o := &sseWriter{w: w, rc: http.NewResponseController(w), thread: thread.Name, every: s.opts.StreamKeepalive,
		last: time.Now()}
	o.mu.Lock() // the timer may fire before it is assigned
	o.timer = time.AfterFunc(o.every, o.keepalive)
	o.mu.Unlock()
	return o
}

// keepaliveWith sets the keepalive the dialect sends (a comment, or Messages' ping event).
func (o *sseWriter) keepaliveWith(b []byte) {
	o.mu.Lock()
	o.ping = b
	o.mu.Unlock()
}

func (o *sseWriter) Emit(event string, data []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = sse.AppendNamedEvent(o.buf[:0], event, data)
	return o.put(o.buf)
}

// put writes b: every event of a stream goes out through it (what came from the upstream was
// read with the operator's keys redacted, clientUpstream). The caller holds o.mu.
func (o *sseWriter) put(b []byte) error {
	o.start()
	o.last = time.Now()
	_, err := o.w.Write(b)
	return err
}

// start sends the status and headers of the stream, once.
func (o *sseWriter) start() {
	if o.started {
		return
	}
	h := o.w.Header()
	sse.SetHeaders(h)
	h.Set(threadHeader, o.thread)
	o.w.WriteHeader(http.StatusOK)
	o.started = true
}

// Flush sends what was written; before the stream started it means a round the client cannot
// see began (the runner flushes before it runs the workspace's tools).
func (o *sseWriter) Flush() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.started {
		o.waiting = true
		return nil
	}
	return o.rc.Flush()
}

// keepalive writes the keepalive when the stream has been silent for the interval, and sets the
// timer for the next check.
func (o *sseWriter) keepalive() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	if !o.started && !o.waiting {
		o.timer.Reset(o.every)
		return
	}
	if idle := time.Since(o.last); idle < o.every {
		o.timer.Reset(o.every - idle)
		return
	}
	if err := o.put(o.ping); err == nil {
		_ = o.rc.Flush()
	}
	o.timer.Reset(o.every)
}

// write writes b and flushes it.
func (o *sseWriter) write(b []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.put(b); err != nil {
		return err
	}
	return o.rc.Flush()
}

// close stops the keepalives and reports whether the stream started; the handler calls it
// before it answers otherwise, and before it returns.
func (o *sseWriter) close() (started bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	o.timer.Stop()
	return o.started
}
