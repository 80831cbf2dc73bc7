package proxy

import (
	"context"
	"encoding/json"
	"net/http"
)

// recordTurn records, durably, which upstream response (last) ended a Responses turn whose
// client got the id first, and the workspace calls of last whose outputs the upstream was not
// sent (owed). The turn fails when it cannot: a later continuation would lose its context.
type recordTurn func(first, last string, owed []string) error

// responsesJSON is the dialect of a non-streamed Responses turn (SPEC §12): each round's reply
// is one response object, and the client gets one at the end.
type responsesJSON struct {
	req    *ResponsesRequest
	up     Upstream
	record recordTurn
	first  string            // the turn's id: its first response's
	output []json.RawMessage // the visible output items of the rounds before the last
	last   *responseRound
	raw    []byte // the last round's body, as it came
	// body and header are the client's answer, set by finish.
	body   []byte
	header http.Header
}

func (d *responsesJSON) request(withWorkspaceTools bool) Payload {
	return d.req.Body(withWorkspaceTools)
}

func (d *responsesJSON) fetch(ctx context.Context, body Payload) ([]toolCall, json.RawMessage, roundInfo, error) {
	raw, header, err := postJSON(ctx, d.up, body)
	if err != nil {
		return nil, nil, roundInfo{}, err
	}
	rd, err := parseResponse(raw, d.req)
	if err != nil {
		return nil, nil, roundInfo{}, err
	}
	if d.first == "" {
		d.first = turnID(rd.id)
	}
	d.last, d.raw, d.header = rd, raw, header
	return rd.calls, rd.top.Get("usage"), rd.info(), nil
}

func (d *responsesJSON) pause() error { return nil }

func (d *responsesJSON) extend(calls []toolCall, results []string) {
	d.output = d.last.visible(d.output)
	d.req.extend(d.last, calls, results)
}

// finish records the turn and answers with the last response: untouched when the turn was one
// round that held no workspace call and continued nothing recorded (the proxy is invisible),
// else as responseRound.answer makes it.
func (d *responsesJSON) finish(_ []toolCall, usage *usageSum, rounds int) error {
	if err := d.record(d.first, d.last.id, d.last.owed()); err != nil {
		return err
	}
	if rounds == 1 && len(d.last.workspaceCallIDs()) == 0 && !d.req.Continued && d.first == d.last.id {
		d.body = d.raw
		return nil
	}
	d.body = d.last.answer(d.first, d.last.visible(d.output), usage, rounds, d.req)
	return nil
}
