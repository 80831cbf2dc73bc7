package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/workspace"
)

// instructions is the text that stands before the block.
func (s *Server) instructions(p turn.Placement) string {
	switch {
	case s.opts.Instructions != "":
		return s.opts.Instructions
	case p == turn.PlaceSystem:
		return workspace.SystemInstructions
	}
	return workspace.TailInstructions
}

// errShuttingDown answers a turn that would start once Shutdown has begun.
var errShuttingDown = &apierr.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
	Message: "this wsproxy is shutting down; retry the request", Header: http.Header{"Retry-After": {"1"}}}

// serveTurn runs a thread turn of req, whatever its wire API, toward up: it takes the turn's
// number and workspace, has setup (when not nil) fit the turn to its API, puts the workspace in
// the request, and answers with a stream or one body; the turn's usage goes to its thread when
// it ends.
func (s *Server) serveTurn(w http.ResponseWriter, r *http.Request, in inbound, req turn.Request, ws *workspace.Workspace, up *clientUpstream,
	setup func(*turn.Turn)) {
	if kind := req.Kind(); kind != turn.KindTurn {
		s.leaveAlone(w, r, in, ws, kind)
		return
	}
	noteKind(r.Context(), turn.KindTurn)
	// What the model is given to read, by who wrote it (docs/spec.md §19): the thread keeps that
	// a turn of it read untrusted content, from its start on; the rest of it (the user's words,
	// the untrusted parts by kind) is read once, when a write of the turn asks.
	tainted, clientTools := req.Tainted()
	t, text, err := s.startTurn(r, ws, in, req.Model(), up, tainted, clientTools)
	if err != nil {
		if !s.bypassed(w, r, in, err) {
			apierr.Write(w, r, s.log, err)
		}
		return
	}
	defer s.endTurn(r.Context(), t)
	t.Reading = sync.OnceValue(req.Reading)
	if t.Start.Number == 1 {
		s.label(r, ws, t)
	}
	if setup != nil {
		setup(t)
	}
	cacheKey := ""
	if s.cacheKey {
		cacheKey = promptCacheKey(in.thread)
	}
	req.Prepare(text, in.placement, cacheKey)
	if req.Streamed() {
		out := s.sseWriter(w, in.thread)
		defer out.close()
		s.stream(r, t, req.Stream(t, out), out)
		return
	}
	s.reply(w, r, t, req.JSON(t))
}

// label keeps what a thread's first turn says of it (docs/spec.md §13: what tells sessions
// apart): the agent, by its request's User-Agent, and the user's words in it (the newest
// user-authored message). A failure costs the label, never the turn.
func (s *Server) label(r *http.Request, ws *workspace.Workspace, t *turn.Turn) {
	first := ""
	if texts := t.Reading().UserTexts; len(texts) > 0 {
		first = texts[len(texts)-1]
	}
	if err := ws.Label(r.Context(), r.UserAgent(), first); err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "thread label not kept", slog.String("thread", ws.ThreadID().String()), slog.Any("err", err))
	}
}

// leaveAlone forwards an agent's own request of a thread, of kind side or compaction, as it came
// (docs/spec.md §18): no workspace, no tools, no loop; counted by its kind, and a compaction
// recorded in the thread's history once answered (compaction.go).
func (s *Server) leaveAlone(w http.ResponseWriter, r *http.Request, in inbound, ws *workspace.Workspace, kind string) {
	noteKind(r.Context(), kind)
	s.opts.Metrics.turn(kind)
	s.forward(w, r, in.body)
	if kind == turn.KindCompaction {
		s.noteCompaction(w, r, ws)
	}
}

// startTurn begins a thread turn: the next turn number, and the workspace text to inject. The
// caller ends a turn it started with endTurn.
func (s *Server) startTurn(r *http.Request, ws *workspace.Workspace, in inbound, model string, up *clientUpstream,
	tainted, clientTools bool) (*turn.Turn, string, error) {
	s.turnsMu.Lock()
	if s.draining {
		s.turnsMu.Unlock()
		return nil, "", errShuttingDown
	}
	s.turns.Add(1) // under turnsMu: before Shutdown's Wait
	s.turnsMu.Unlock()
	var start workspace.TurnStart
	opts, err := s.parentsOf(r, in.thread.Client)
	opts.ReadsUntrusted, opts.ClientTools = tainted, clientTools
	if err == nil {
		err = s.admitThread(r.Context(), in.thread)
	}
	if err == nil {
		ctx, cancel := r.Context(), context.CancelFunc(func() {})
		if s.opts.BypassUnavailable {
			ctx, cancel = context.WithTimeout(ctx, s.opts.WorkspaceBudget)
		}
		start, err = ws.StartTurn(ctx, opts)
		cancel()
	}
	if err != nil {
		s.turns.Done()
		return nil, "", err
	}
	t := &turn.Turn{
		Workspace: ws,
		Log:       s.log,
		Start:     start,
		Model:     model,
		Upstream:  up,
		Provider:  up.provider,
	}
	return t, s.workspaceText(in.placement, start.Block()), nil
}

// bypassed forwards a thread turn whose workspace could not be read (err: Postgres unavailable,
// or slower than WorkspaceBudget) as a pass-through when BypassUnavailable is set: the client's
// request as it came, its answer marked X-Workspace: unavailable, counted in
// wsproxy_workspace_bypassed_total and logged. It reports whether it did.
func (s *Server) bypassed(w http.ResponseWriter, r *http.Request, in inbound, err error) bool {
	if !s.opts.BypassUnavailable || r.Context().Err() != nil ||
		!(errors.Is(err, workspace.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
		return false
	}
	s.opts.Metrics.workspaceBypassed()
	s.log.LogAttrs(r.Context(), slog.LevelWarn, "workspace unavailable: the turn is forwarded without it (WORKSPACE_UNAVAILABLE=bypass)",
		slog.String("thread", in.thread.String()), slog.Any("err", err))
	w.Header().Set("X-Workspace", "unavailable")
	s.forward(w, r, in.body)
	return true
}

// workspaceText is what a turn puts in its request: the instructions for placement, then the
// workspace block.
func (s *Server) workspaceText(placement turn.Placement, block string) string {
	return s.instructions(placement) + "\n\n" + block
}

// endTurn ends a turn startTurn began. A turn that reached its model is counted, and its usage
// queued for its thread's totals, written in the background (neither the answer nor the next
// request on the connection waits for it; a failure to write it costs the count, not the
// answer). One that never did — its first upstream round failed — is given back: no turn number
// spent, no empty thread left (docs/spec.md §2).
func (s *Server) endTurn(ctx context.Context, t *turn.Turn) {
	defer s.turns.Done()
	noteTurn(ctx, t.Model, t.Usage)
	if !t.Reached() {
		if err := t.Workspace.UndoTurn(context.WithoutCancel(ctx), t.Start); err != nil {
			s.log.LogAttrs(ctx, slog.LevelWarn, "a turn that never reached its model kept its number",
				slog.String("thread", t.Workspace.ThreadID().String()), slog.Any("err", err))
		}
		return
	}
	s.opts.Metrics.turn(turn.KindTurn)
	s.usage.add(t.Workspace.ThreadID(), t.Usage)
	s.countClientTokens(t.Workspace.ThreadID().Client, t.Usage)
}

// reply runs a non-streamed turn and answers with its body once it ended.
func (s *Server) reply(w http.ResponseWriter, r *http.Request, t *turn.Turn, d turn.JSONDialect) {
	rounds, err := s.runner.Run(r.Context(), t, d)
	noteRounds(r.Context(), rounds)
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	body, header := d.Answer()
	h := w.Header()
	copyResponseHeader(h, header)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set(threadHeader, t.Workspace.ThreadID().Name)
	h.Set("X-Workspace-Rounds", strconv.Itoa(rounds))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// stream serves a streamed turn. The status and headers go out with the first event, so a
// failure before it gets a plain error response (but for the upstream's error event); after it,
// one failure event ends the stream.
func (s *Server) stream(r *http.Request, t *turn.Turn, d turn.StreamDialect, out *sseWriter) {
	out.keepaliveWith(d.Keepalive())
	rounds, err := s.runner.Run(r.Context(), t, d)
	noteRounds(r.Context(), rounds)
	if err == nil {
		if end := d.End(); end != nil {
			if err := out.write(end); err != nil {
				s.log.LogAttrs(r.Context(), slog.LevelDebug, "client left before the end of the stream", slog.Any("err", err))
			}
		}
		return
	}
	var se *apierr.StreamError
	if started := out.close(); !started && !errors.As(err, &se) {
		apierr.Write(out.w, r, s.log, err) // nothing went out yet: a plain error response
		return
	}
	// After the first byte, or for the upstream's own error event (which a client straight from
	// the upstream reads inside a stream too): one failure event ends the stream.
	var ue *apierr.UpstreamError
	if errors.As(err, &se) || errors.As(err, &ue) {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream error after the stream started", slog.String("thread", t.Workspace.ThreadID().String()))
	} else {
		e := apierr.From(err)
		if e.Status == apierr.StatusClientClosedRequest {
			return
		}
		e.Log(r.Context(), s.log, "stream failed", slog.String("thread", t.Workspace.ThreadID().String()))
	}
	name, data := d.Failure(err)
	_ = out.write(sse.AppendNamedEvent(nil, name, data))
}

// countTokens serves a wire API's token count of a request read by parse (docs/spec.md §14):
// with a thread, the request goes upstream as the turn's first round would (the five tools after
// the client's, the workspace as it stands now where the placement puts it), so the client
// counts what the model will see; no turn is counted and no thread is made. Without one, a
// pass-through.
func countTokens[R turn.Counted](s *Server, w http.ResponseWriter, r *http.Request, parse func([]byte) (R, error)) {
	in, req, ok := turnRequest(s, w, r, s.forwardBody, parse)
	defer in.release()
	if !ok {
		return
	}
	block, err := s.opts.Store.Workspace(in.thread).Block(r.Context())
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	body := req.CountBody(s.workspaceText(in.placement, block), in.placement)
	resp, err := s.turnUpstream(r).Post(r.Context(), body)
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	defer resp.Body.Close()
	h := w.Header()
	copyResponseHeader(h, resp.Header)
	h.Set(threadHeader, in.thread.Name)
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, resp.Body)
}

// promptCacheKey is the prompt_cache_key of a thread's turns: the same on every replica, never
// the thread's id (docs/spec.md §3.1).
func promptCacheKey(thread workspace.ThreadID) string {
	sum := sha256.Sum256([]byte("wsproxy prompt_cache_key\n" + thread.String()))
	return "wsp_" + hex.EncodeToString(sum[:16])
}
