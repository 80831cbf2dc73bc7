package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/workspace"
)

// With client keys the upstream holds every client's responses under the operator's key, so a
// Responses request — a thread turn or a pass-through — continues from (previous_response_id)
// and references (an input item's id, item_reference among them) only responses that the
// client's own requests made through wsproxy: their ids, and their output items', are recorded
// per client as the answers pass (workspace.Store.RecordResponses). Any other id is a 404
// previous_response_not_found, and nothing goes upstream (docs/spec.md §12). Without client
// keys nothing of this runs: a pass-through is not even parsed.

// referencedIDs reads what a Responses request body names: its previous_response_id ("" for
// none; anything but a string or null is refused) and the ids its input items carry.
func referencedIDs(body []byte) (previous string, items []string, err error) {
	top, err := rawjson.Parse(body)
	if err != nil {
		return "", nil, apierr.BadRequest("invalid_json", "", "the request body is not a JSON object")
	}
	// A member read here given twice: the upstream might read the value not checked.
	if k := rawjson.Repeated(body, "previous_response_id", "input", "conversation"); k != "" {
		return "", nil, duplicateMember(k, k)
	}
	if top.Has("conversation") {
		// A conversation is an object the upstream keeps under the operator's key, which no
		// client made through wsproxy (thread turns refuse it too).
		return "", nil, apierr.BadRequest("unsupported_parameter", "conversation", "conversation is not supported for clients of this proxy; previous_response_id continues a response")
	}
	if p := top.Get("previous_response_id"); p != nil && string(p) != "null" {
		var ok bool
		if previous, ok = rawjson.Unquote(p); !ok {
			return "", nil, apierr.BadRequest("invalid_type", "previous_response_id", "previous_response_id must be a string")
		}
	}
	in := top.Get("input")
	if len(in) == 0 || in[0] != '[' {
		return previous, nil, nil
	}
	err = rawjson.Each(in, func(i, start, end int) error {
		item, err := rawjson.Parse(in[start:end])
		if err != nil {
			return nil // not an object: the upstream's to refuse
		}
		if rawjson.Repeated(in[start:end], "id") != "" {
			return duplicateMember("input", fmt.Sprintf("input[%d].id", i))
		}
		id := item.Get("id")
		if id == nil || string(id) == "null" {
			return nil
		}
		s, ok := rawjson.Unquote(id)
		if !ok {
			return apierr.BadRequest("invalid_type", "input", "input[%d].id must be a string", i)
		}
		items = append(items, s)
		return nil
	})
	if err != nil {
		if e, ok := err.(*apierr.Error); ok {
			return "", nil, e
		}
		return "", nil, apierr.BadRequest("invalid_type", "input", "input must be a string or an array of items")
	}
	return previous, items, nil
}

// duplicateMember is the 400 of a request that gives a member the proxy checks twice (name, in
// param).
func duplicateMember(param, name string) *apierr.Error {
	return apierr.BadRequest("duplicate_member", param, "%s is given more than once", name)
}

// checkOwned refuses the request unless previous ("" for none) and every id of items are the
// client's (a 404 previous_response_not_found naming the first that is not).
func (s *Server) checkOwned(ctx context.Context, client, previous string, items []string) error {
	ids := items
	if previous != "" {
		ids = append([]string{previous}, items...)
	}
	if len(ids) == 0 {
		return nil
	}
	unknown, err := s.opts.Store.UnknownResponses(ctx, client, ids)
	if err != nil || len(unknown) == 0 {
		return err
	}
	if unknown[0] == previous {
		return &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "previous_response_id",
			Code: "previous_response_not_found", Message: "Previous response with id '" + previous + "' not found."}
	}
	return &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "input",
		Code: "previous_response_not_found", Message: "Item with id '" + unknown[0] + "' not found."}
}

// answerIDs collects the ids of the answers of one request to the upstream: each 2xx answer's
// body is read through a responseIDs as it passes (tap).
type answerIDs struct {
	answers []*responseIDs
	// record, when set, records ids for the client (a pass-through's): called with the ids found
	// since its last call, as an answer's end passes — before its last bytes go on to the client,
	// who may continue from it at once on another connection — and by whoever tapped the answer
	// once it went out (the ids of an answer cut off before its end).
	record   func([]string)
	recorded int
}

// tap is body, an answer with header, passing what it reads to a new responseIDs.
func (a *answerIDs) tap(header http.Header, body io.ReadCloser) io.ReadCloser {
	ids := newResponseIDs(isEventStream(header))
	a.answers = append(a.answers, ids)
	return &tappedBody{ReadCloser: body, ids: ids, a: a}
}

// tappedBody is an answer's body read through its responseIDs; the read that brings the
// answer's end records its ids before returning (answerIDs.record).
type tappedBody struct {
	io.ReadCloser
	ids *responseIDs
	a   *answerIDs
}

func (b *tappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	_, _ = b.ids.Write(p[:n])
	if b.ids.ended {
		b.a.recordNew()
	}
	return n, err
}

// recordNew records the ids found since the last record (with record set).
func (a *answerIDs) recordNew() {
	if a.record == nil {
		return
	}
	n := 0
	for _, x := range a.answers {
		n += len(x.ids)
	}
	if n > a.recorded {
		found := a.all()[a.recorded:]
		a.recorded = n
		a.record(found)
	}
}

// all are the ids read so far.
func (a *answerIDs) all() []string {
	var out []string
	for _, x := range a.answers {
		out = append(out, x.ids...)
	}
	return out
}

type answerIDsKey struct{}

// tappedUpstream is a thread turn's upstream whose answers are read for their ids.
type tappedUpstream struct {
	turn.Upstream
	ids *answerIDs
}

func (u tappedUpstream) Post(ctx context.Context, body turn.Payload) (*turn.UpstreamResponse, error) {
	resp, err := u.Upstream.Post(ctx, body)
	if err == nil {
		resp.Body = u.ids.tap(resp.Header, resp.Body)
	}
	return resp, err
}

// forwardResponses forwards a Responses request without a thread. With client keys it first
// checks what the request continues from and references, and records the ids of the answer for
// the client before the answer's end goes out (a JSON body's last value byte, a stream's
// terminal event): a continuation sent as soon as the client has the answer finds them. A record
// that fails (Postgres down) costs the client the continuation of that response (a later 404),
// never the answer, which goes out unchanged.
func (s *Server) forwardResponses(w http.ResponseWriter, r *http.Request, client string, body []byte) {
	if !s.opts.ClientKeys.On() {
		s.forward(w, r, body)
		return
	}
	previous, items, err := referencedIDs(body)
	if err == nil {
		err = s.checkOwned(r.Context(), client, previous, items)
	}
	if err != nil {
		apierr.Write(w, r, s.log, err)
		return
	}
	ids := &answerIDs{record: func(found []string) {
		if err := s.opts.Store.RecordResponses(context.WithoutCancel(r.Context()), client, found); err != nil {
			s.log.LogAttrs(r.Context(), slog.LevelWarn, "responses of a pass-through not recorded: the client cannot continue them",
				slog.String("client", client), slog.Int("ids", len(found)), slog.Any("err", err))
		}
	}}
	s.forward(w, r.WithContext(context.WithValue(r.Context(), answerIDsKey{}, ids)), body)
	ids.recordNew() // what an answer that never reached its end held
}

// modifyResponse is the pass-through's ReverseProxy.ModifyResponse: what fromUpstream changes,
// and a 2xx Responses answer tapped for its ids when forwardResponses asked for them.
func (s *Server) modifyResponse(resp *http.Response) error {
	if err := s.fromUpstream().passThroughResponse(resp); err != nil {
		return err
	}
	if ids, ok := resp.Request.Context().Value(answerIDsKey{}).(*answerIDs); ok && resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		resp.Body = ids.tap(resp.Header, resp.Body)
	}
	s.tapResponse(resp)
	return nil
}

// ownedContinuation checks, with client keys, a thread turn's references: its input items' ids,
// and its previous_response_id when it names none of the thread's turns (continuing).
func (s *Server) ownedContinuation(ctx context.Context, thread workspace.ThreadID, body []byte, continuing bool) error {
	if !s.opts.ClientKeys.On() {
		return nil
	}
	previous, items, err := referencedIDs(body)
	if err != nil {
		return err
	}
	if continuing {
		previous = ""
	}
	return s.checkOwned(ctx, thread.Client, previous, items)
}
