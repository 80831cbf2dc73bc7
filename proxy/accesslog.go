package proxy

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/tools"
)

// requestInfo is what a request's handlers learn for its line of the request log: the thread
// and client it names, the rounds of its turn, and the status of the last upstream exchange. It
// travels in the request's context (observed puts it there); a request without one (a handler
// called outside observed) records nothing.
type requestInfo struct {
	mu       sync.Mutex // the upstream's status may come from the transport's goroutine
	thread   string     // the stored thread id (client~name with client keys)
	client   string
	rounds   int
	kind     string // of a thread's request (turn.KindTurn, …)
	upstream string // a status code, or "error" when no response came
}

type requestInfoKey struct{}

func withRequestInfo(ctx context.Context, info *requestInfo) context.Context {
	return context.WithValue(ctx, requestInfoKey{}, info)
}

func requestInfoFrom(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return info
}

// noteCaller records the client and thread a request names.
func noteCaller(ctx context.Context, thread tools.ThreadID, named bool) {
	if info := requestInfoFrom(ctx); info != nil {
		info.mu.Lock()
		info.client = thread.Client
		if named {
			info.thread = thread.String()
		}
		info.mu.Unlock()
	}
}

// noteRounds records the rounds a thread turn made.
func noteRounds(ctx context.Context, n int) {
	if info := requestInfoFrom(ctx); info != nil {
		info.mu.Lock()
		info.rounds = n
		info.mu.Unlock()
	}
}

// noteKind records the kind of a thread's request.
func noteKind(ctx context.Context, kind string) {
	if info := requestInfoFrom(ctx); info != nil {
		info.mu.Lock()
		info.kind = kind
		info.mu.Unlock()
	}
}

// noteUpstream records the status of an upstream exchange: the last one's is logged.
func noteUpstream(ctx context.Context, code string) {
	if info := requestInfoFrom(ctx); info != nil {
		info.mu.Lock()
		info.upstream = code
		info.mu.Unlock()
	}
}

// quietRoutes are logged at Debug: probes and scrapes, which come every few seconds.
var quietRoutes = map[string]bool{"GET /healthz": true, "GET /readyz": true, "GET /metrics": true}

// logRequest writes a request's line of the request log, at Info (Debug for quietRoutes): what
// observed and the handlers know of it, never its path, body or credentials. Its thread is the
// one a handler noted, else the one the route's path names.
func (s *Server) logRequest(ctx context.Context, r *http.Request, route string, status int, d time.Duration, info *requestInfo) {
	level := slog.LevelInfo
	if quietRoutes[route] {
		level = slog.LevelDebug
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("method", r.Method), slog.String("route", route), slog.Int("status", status))
	info.mu.Lock()
	if thread := cmp.Or(info.thread, r.PathValue("thread")); thread != "" { // the admin REST's path holds the stored id
		attrs = append(attrs, slog.String("thread", thread))
	}
	if info.client != "" {
		attrs = append(attrs, slog.String("client", info.client))
	}
	if info.kind != "" {
		attrs = append(attrs, slog.String("kind", info.kind))
	}
	if info.rounds > 0 {
		attrs = append(attrs, slog.Int("rounds", info.rounds))
	}
	if info.upstream != "" {
		if n, err := strconv.Atoi(info.upstream); err == nil {
			attrs = append(attrs, slog.Int("upstream_status", n))
		} else {
			attrs = append(attrs, slog.String("upstream_status", info.upstream))
		}
	}
	info.mu.Unlock()
	attrs = append(attrs, slog.Float64("duration_ms", float64(d.Microseconds())/1000))
	s.log.LogAttrs(ctx, level, "request", attrs...)
}
