package turn

import (
	"context"
	"encoding/json"

	"github.com/wsproxy/wsproxy/tools"
)

// responsesTurn is what both Responses dialects keep of a turn: its request and upstream, how its
// end is recorded, its id, the visible output of the rounds before the last, and the last round.
type responsesTurn struct {
	req    *ResponsesRequest
	up     Upstream
	first  string            // the turn's id: its first response's
	output []json.RawMessage // the visible output items of the rounds before the last
	last   *responseRound
}

func (t *responsesTurn) request(withWorkspaceTools bool) Payload {
	return t.req.Body(withWorkspaceTools)
}

func (t *responsesTurn) extend(calls []toolCall, results []tools.Result) {
	t.output = t.last.visible(t.output)
	t.req.extend(t.last, calls, results)
}

// recordEnd records which upstream response ended the turn, and the calls it was owed outputs of.
func (t *responsesTurn) recordEnd() error {
	if t.req.Record == nil || t.first == "" || t.last.id == "" {
		return nil // nothing a client could continue from
	}
	return t.req.Record(t.first, t.last.id, t.last.owed(), t.last.stored)
}

// responsesJSON is the dialect of a non-streamed Responses turn (docs/spec.md §12): each round's
// reply is one response object, and the client gets one at the end.
type responsesJSON struct {
	responsesTurn
	jsonAnswer
}

func (d *responsesJSON) fetch(ctx context.Context, body Payload) ([]toolCall, usage, roundInfo, error) {
	raw, err := d.post(ctx, d.up, body)
	if err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	rr, err := parseResponse(raw, d.req)
	if err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	if d.first == "" {
		d.first = turnID(rr.id)
	}
	d.last = rr
	return rr.calls, responsesTokens(rr.top.Get("usage")), rr.info(), nil
}

// finish records the turn and answers with the last response: untouched when the turn was one
// round that held no workspace call and continued nothing recorded (the proxy is invisible),
// else as responseRound.answer makes it.
func (d *responsesJSON) finish(_ []toolCall, usage *usageSum, rounds int) error {
	if err := d.recordEnd(); err != nil {
		return err
	}
	if rounds == 1 && len(d.last.workspaceCallIDs()) == 0 && !d.req.Continued && d.first == d.last.id {
		d.body = d.raw
		return nil
	}
	d.body = d.last.answer(d.first, d.last.visible(d.output), usage, rounds, d.req)
	return nil
}
