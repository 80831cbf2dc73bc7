package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/tools"
)

// placementOf is the request's placement: its X-Workspace-Placement header, else the
// configured one.
func (s *Server) placementOf(r *http.Request) (turn.Placement, error) {
	h := r.Header.Get(placementHeader)
	if h == "" {
		return s.opts.Placement, nil
	}
	p, err := turn.ParsePlacement(h)
	if err != nil {
		return "", apierr.BadRequest("invalid_placement", placementHeader, "%s: %s", placementHeader, err.Error())
	}
	return p, nil
}

// instructions is the text that stands before the block.
func (s *Server) instructions(p turn.Placement) string {
	switch {
	case s.opts.Instructions != "":
		return s.opts.Instructions
	case p == turn.PlaceSystem:
		return tools.SystemInstructions
	}
	return tools.TailInstructions
}

// threadOf returns the thread a request names: the X-Thread-Id header or the path, else the
// header fallback names (THREAD_HEADER, "" for none), for the request's client ("" without
// client keys). ok is false when it names none (the id then holds the client alone). Empty
// headers count as absent; two that differ, or a header and a path that differ, are a
// thread_mismatch.
func threadOf(r *http.Request, client, fallback string) (id tools.ThreadID, ok bool, err error) {
	name, from := r.PathValue("thread"), threadHeader
	for _, h := range r.Header.Values(threadHeader) {
		switch {
		case h == "":
		case name == "":
			name = h
		case h != name:
			return tools.ThreadID{}, false, apierr.BadRequest("thread_mismatch", threadHeader,
				"the %s headers and the path name different threads", threadHeader)
		}
	}
	if name == "" && fallback != "" {
		name, from = r.Header.Get(fallback), fallback
	}
	if name == "" {
		return tools.ThreadID{Client: client}, false, nil
	}
	if id, err = tools.NewThreadID(client, name); err != nil {
		return tools.ThreadID{}, false, apierr.BadRequest("invalid_thread_id", from, "%s", err.Error())
	}
	return id, true, nil
}

// parentsHeader names a thread's parents on any turn (docs/spec.md §17), nearest first,
// separated by commas.
const parentsHeader = "X-Workspace-Parents"

// parentsOf is what a request names of its thread's parents: X-Workspace-Parents, stored when
// they differ; else, for a thread named by THREAD_HEADER, THREAD_PARENTS, stored when the thread
// is new. Names are in the client's namespace; an empty header names none.
func (s *Server) parentsOf(r *http.Request, client string) (tools.TurnOptions, error) {
	names, from, ifNew := r.Header.Values(parentsHeader), parentsHeader, false
	if len(names) == 0 && len(s.opts.ThreadParents) > 0 && s.opts.ThreadHeader != "" && r.PathValue("thread") == "" &&
		r.Header.Get(threadHeader) == "" {
		names, from, ifNew = s.opts.ThreadParents, "THREAD_PARENTS", true
	}
	var parents []tools.ThreadID
	for _, v := range names {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name == "" {
				continue
			}
			id, err := tools.NewThreadID(client, name)
			if err != nil {
				return tools.TurnOptions{}, apierr.BadRequest("invalid_parents", from, "%s: %q: %s", from, name, err.Error())
			}
			parents = append(parents, id)
		}
	}
	if parents == nil {
		return tools.TurnOptions{}, nil
	}
	return tools.TurnOptions{Parents: parents, ParentsIfNew: ifNew}, nil
}

// forwardFunc passes a request that names no thread upstream, for its client ("" without client
// keys).
type forwardFunc func(w http.ResponseWriter, r *http.Request, client string, body []byte)

// forwardBody is the forwardFunc of the routes whose pass-through is the same for every client.
func (s *Server) forwardBody(w http.ResponseWriter, r *http.Request, _ string, body []byte) {
	s.forward(w, r, body)
}

// turnRequest reads a chat, Responses or Messages request and parses it: a thread turn's
// thread, placement, body and request. A request without a thread is passed to forward, and one
// that fails is answered; ok is then false. The caller calls in.release when done.
func turnRequest[R any](s *Server, w http.ResponseWriter, r *http.Request, forward forwardFunc, parse func([]byte) (R, error)) (in inbound, req R, ok bool) {
	in, err := s.inbound(w, r, nil)
	if err == nil && !in.named {
		if err = s.passThroughAllowed(r); err == nil {
			forward(w, r, in.thread.Client, in.body)
			return in, req, false
		}
	}
	if err == nil {
		in.placement, err = s.placementOf(r)
	}
	if err == nil {
		req, err = parse(in.body)
	}
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return in, req, false
	}
	return in, req, true
}

// errShuttingDown answers a turn that would start once Shutdown has begun.
var errShuttingDown = &apierr.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
	Message: "this wsproxy is shutting down; retry the request", Header: http.Header{"Retry-After": {"1"}}}

// chat serves POST /v1/chat/completions and its thread-path form.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	in, req, ok := turnRequest(s, w, r, s.forwardBody, turn.ParseChatRequest)
	defer in.release()
	if !ok {
		return
	}
	if req.Legacy {
		s.forward(w, r, in.body) // legacy functions: no workspace, no turn
		return
	}
	s.serveTurn(w, r, in, req, s.opts.Store.Workspace(in.thread), s.openAIUpstream(r, "/chat/completions"), s.runner, nil)
}

// responses serves POST /v1/responses and its thread-path form (docs/spec.md §12).
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	in, req, ok := turnRequest(s, w, r, s.forwardResponses, turn.ParseResponsesRequest)
	defer in.release()
	if !ok {
		return
	}
	ws := s.opts.Store.Workspace(in.thread)
	if req.ClientPrevious != "" {
		cont, err := ws.Continuation(r.Context(), req.ClientPrevious)
		switch {
		case err == nil:
			req.Continue(cont)
		case !errors.Is(err, tools.ErrNotFound):
			apierr.Write(w, r, s.log, err)
			return
		}
	}
	// With client keys: another thread's turn, or a response of a pass-through, is the client's
	// own or a 404; so is every item the input references.
	if err := s.ownedContinuation(r.Context(), in.thread, in.body, req.Continued); err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	s.serveTurn(w, r, in, req, ws, s.openAIUpstream(r, "/responses"), s.runner, func(t *turn.Turn) {
		ids := &answerIDs{}
		if s.opts.ClientKeys != nil {
			t.Upstream = tappedUpstream{Upstream: t.Upstream, ids: ids}
		}
		req.Record = func(first, last string, owed []string) error {
			// Recorded also when the client left while the round's workspace calls ran (they
			// run to their end): a continuation from the turn must find them.
			return ws.RecordResponseTurn(context.WithoutCancel(r.Context()), t.Start.Number, first, last, owed, ids.all())
		}
	})
}

// serveTurn runs a thread turn of req, whatever its wire API, toward up with runner: it takes
// the turn's number and workspace, has setup (when not nil) fit the turn to its API,
// puts the workspace in the request, and answers with a stream or one body; the turn's usage
// goes to its thread when it ends.
func (s *Server) serveTurn(w http.ResponseWriter, r *http.Request, in inbound, req turn.Request, ws *tools.Workspace, up turn.Upstream,
	runner *turn.Runner, setup func(*turn.Turn)) {
	t, text, err := s.startTurn(r, ws, in, req.Model(), up)
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	defer s.endTurn(t)
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
		s.stream(r, runner, t, req.Stream(t, out), out)
		return
	}
	s.reply(w, r, runner, t, req.JSON(t))
}

// openAIUpstream is the OpenAI-compatible upstream of one client request, at path (after the
// base URL's /v1).
func (s *Server) openAIUpstream(r *http.Request, path string) *clientUpstream {
	return &clientUpstream{client: s.client, url: upstreamURL(s.opts.UpstreamURL, path, "").String(),
		header: s.outboundHeader(r.Header), tracing: s.tracing, back: s.fromUpstream()}
}

// startTurn begins a thread turn: the next turn number, and the workspace text to inject. The
// caller ends a turn it started with endTurn.
func (s *Server) startTurn(r *http.Request, ws *tools.Workspace, in inbound, model string, up turn.Upstream) (*turn.Turn, string, error) {
	s.turnsMu.Lock()
	if s.draining {
		s.turnsMu.Unlock()
		return nil, "", errShuttingDown
	}
	s.turns.Add(1) // under turnsMu: before Shutdown's Wait
	s.turnsMu.Unlock()
	var start tools.TurnStart
	opts, err := s.parentsOf(r, in.thread.Client)
	if err == nil {
		start, err = ws.StartTurn(r.Context(), opts)
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
	}
	return t, s.workspaceText(in.placement, start.Block()), nil
}

// workspaceText is what a turn puts in its request: the instructions for placement, then the
// workspace block.
func (s *Server) workspaceText(placement turn.Placement, block string) string {
	return s.instructions(placement) + "\n\n" + block
}

// endTurn ends a turn startTurn began: it queues the turn's usage for its thread's totals,
// written in the background (neither the answer nor the next request on the connection waits
// for it; a failure to write it costs the count, not the answer).
func (s *Server) endTurn(t *turn.Turn) {
	s.usage.add(t.Workspace.ThreadID(), t.Usage)
	s.turns.Done()
}

// reply runs a non-streamed turn and answers with its body once it ended.
func (s *Server) reply(w http.ResponseWriter, r *http.Request, runner *turn.Runner, t *turn.Turn, d turn.JSONDialect) {
	rounds, err := runner.Run(r.Context(), t, d)
	noteRounds(r.Context(), rounds)
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	body, header := d.Answer()
	h := w.Header()
	apierr.CopyHeader(h, responseHeader(header))
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
func (s *Server) stream(r *http.Request, runner *turn.Runner, t *turn.Turn, d turn.StreamDialect, out *sseWriter) {
	out.keepaliveWith(d.Keepalive())
	rounds, err := runner.Run(r.Context(), t, d)
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

// promptCacheKey is the prompt_cache_key of a thread's turns: the same on every replica, never
// the thread's id (docs/spec.md §3.1).
func promptCacheKey(thread tools.ThreadID) string {
	sum := sha256.Sum256([]byte("wsproxy prompt_cache_key\n" + thread.String()))
	return "wsp_" + hex.EncodeToString(sum[:16])
}
