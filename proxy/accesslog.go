package proxy

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/workspace"
)

// requestInfo is what a request's handlers learn for its line of the request log: the thread
// and client it names, the rounds of its turn, and the status of the last upstream exchange. It
// travels in the request's context (observed puts it there); a request without one (a handler
// called outside observed) records nothing.
type requestInfo struct {
	mu       sync.Mutex // the upstream's status may come from the transport's goroutine
	id       string     // the request's id (X-Request-Id)
	thread   string     // the stored thread id (client~name with client keys)
	client   string
	model    string // a thread turn's
	usage    workspace.Usage
	rounds   int
	kind     string // of a thread's request (turn.KindTurn, …)
	upstream string // a status code, or "error" when no response came
	// tapped is set when the pass-through's answer is read for its client's usage; strip when
	// wsproxy asked a chat stream for its usage (limits.go).
	tapped, strip bool
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
func noteCaller(ctx context.Context, thread workspace.ThreadID, named bool) {
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

// noteTurn records what a thread turn's log line tells: its model, and its token counts once
// it ended.
func noteTurn(ctx context.Context, model string, usage workspace.Usage) {
	if info := requestInfoFrom(ctx); info != nil {
		info.mu.Lock()
		info.model, info.usage = model, usage
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
	attrs := make([]slog.Attr, 0, 16)
	// The request's id is added by requestIDHandler, as to every line of the request.
	attrs = append(attrs, slog.String("method", r.Method), slog.String("route", route), slog.Int("status", status),
		slog.String("addr", s.opts.TrustedProxies.ClientAddr(r)))
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
	if info.model != "" {
		attrs = append(attrs, slog.String("model", info.model))
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
	if u := info.usage; u != (workspace.Usage{}) {
		attrs = append(attrs, slog.Int64("prompt_tokens", u.PromptTokens), slog.Int64("cached_tokens", u.CachedPromptTokens),
			slog.Int64("completion_tokens", u.CompletionTokens))
		if u.CacheWriteTokens > 0 {
			attrs = append(attrs, slog.Int64("cache_write_tokens", u.CacheWriteTokens))
		}
	}
	info.mu.Unlock()
	attrs = append(attrs, slog.Float64("duration_ms", float64(d.Microseconds())/1000))
	s.log.LogAttrs(ctx, level, "request", attrs...)
}

// requestIDHeader is the header of a request's id: the client's when it sends a valid one, else
// made here; every answer carries it. The upstream's own id comes back in
// upstreamRequestIDHeader.
const (
	requestIDHeader         = "X-Request-Id"
	upstreamRequestIDHeader = "X-Upstream-Request-Id"
)

// requestID is a request's id: the client's X-Request-Id when it is 1 to 128 visible ASCII
// characters, else a new one.
func requestID(r *http.Request) string {
	if id := r.Header.Get(requestIDHeader); id != "" && len(id) <= 128 && strings.IndexFunc(id, func(c rune) bool { return c < '!' || c > '~' }) < 0 {
		return id
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "req_" + hex.EncodeToString(b[:])
}

// requestIDHandler adds the request's id to every log record made with its context.
type requestIDHandler struct{ slog.Handler }

func (h requestIDHandler) Handle(ctx context.Context, rec slog.Record) error {
	if id := apierr.RequestID(ctx); id != "" {
		rec = rec.Clone()
		rec.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, rec)
}

func (h requestIDHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(attrs)}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
}
