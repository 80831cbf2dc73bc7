package proxy

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/workspace"
)

// openAIAPI is OpenAI's wire APIs, chat completions and Responses, toward the OpenAI-compatible
// upstream (UPSTREAM_BASE_URL, whose base URL ends in /v1), and every other /v1 route as a
// pass-through to it.
var openAIAPI = wireAPI{
	name:       OpenAI,
	defaultURL: DefaultUpstreamURL,
	provider:   "openai",
	urlSetting: "UPSTREAM_BASE_URL",
	keySetting: "UPSTREAM_API_KEY",
	prefix:     "/v1",
	routes: []apiRoute{
		{"POST /v1/chat/completions", (*Server).chat},
		{"POST /v1/responses", (*Server).responses},
		{"GET /v1/responses", (*Server).refuseWebSocket},
		{"POST /v1/responses/compact", (*Server).responsesCompact},
	},
	passThrough: []string{"/v1/"},
	setKey:      bearerKey,
}

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
	s.serveTurn(w, r, in, req, s.opts.Store.Workspace(in.thread), s.turnUpstream(r), nil)
}

// responses serves POST /v1/responses and its thread-path form (docs/spec.md §12).
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	in, req, ok := turnRequest(s, w, r, s.forwardResponses, turn.ParseResponsesRequest)
	defer in.release()
	if !ok {
		return
	}
	ws := s.opts.Store.Workspace(in.thread)
	if req.ClientPrevious != "" && req.Kind() == turn.KindTurn { // a request left alone goes as it came
		cont, err := ws.Continuation(r.Context(), req.ClientPrevious)
		switch {
		case err == nil:
			req.Continue(cont)
		case !errors.Is(err, workspace.ErrNotFound):
			// With client keys the continuation's owner is checked below, which needs the
			// database: no bypass then.
			if s.opts.ClientKeys.On() || !s.bypassed(w, r, in, err) {
				apierr.Write(w, r, s.log, err)
			}
			return
		}
	}
	// With client keys: another thread's turn, or a response of a pass-through, is the client's
	// own or a 404; so is every item the input references.
	if err := s.ownedContinuation(r.Context(), in.thread, in.body, req.Continued); err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	s.serveTurn(w, r, in, req, ws, s.turnUpstream(r), func(t *turn.Turn) {
		ids := &answerIDs{}
		if s.opts.ClientKeys.On() {
			t.Upstream = tappedUpstream{Upstream: t.Upstream, ids: ids}
		}
		req.Record = func(first, last string, owed []string, stored bool) error {
			// Recorded also when the client left while the round's workspace calls ran (they
			// run to their end): a continuation from the turn must find them, and the user's
			// words it was given (docs/spec.md §19), which only a stored response is continued
			// with.
			userText := ""
			if stored {
				userText = strings.Join(t.Reading().UserTexts, "\n")
			}
			return ws.RecordResponseTurn(context.WithoutCancel(r.Context()), t.Start.Number, first, last, owed, ids.all(), userText)
		}
	})
}

// responsesCompact serves POST /v1/responses/compact and its thread-path form: with a thread, a
// compaction left alone (docs/spec.md §18); without one, a pass-through.
func (s *Server) responsesCompact(w http.ResponseWriter, r *http.Request) {
	in, err := s.inbound(w, r, s.passThroughAllowed)
	defer in.release()
	switch {
	case err != nil:
		apierr.Write(w, r, s.log, err)
	case !in.named:
		s.forward(w, r, in.body)
	default:
		s.leaveAlone(w, r, in, s.opts.Store.Workspace(in.thread), turn.KindCompaction)
	}
}
