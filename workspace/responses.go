package workspace

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/wsproxy/wsproxy/db"
)

// Continuation is what the proxy recorded of a Responses turn (docs/spec.md §12) for a request that
// continues from it: the upstream response that ended the turn, and the outputs of the
// workspace calls in it that the upstream has not been sent; and the user's words that turn was
// given (its Reading.UserTexts, joined by a line break; docs/spec.md §19), which ground the writes
// of a continuation that brings none of its own.
type Continuation struct {
	LastResponseID string
	Owed           []OwedOutput
	UserText       string
}

// MaxRecordedUserText bounds the user's words a Responses turn's record keeps, in bytes.
const MaxRecordedUserText = 8 << 10

// OwedOutput is the result of a workspace call, owed to the upstream as a function_call_output.
type OwedOutput struct {
	CallID string
	Output string // the envelope the call returned
}

// notRun is the output of a workspace call that was not run: the tools' error envelope
// (tools.Envelope, docs/spec.md §5).
const notRun = `{"ok":false,"error":"not run: the workspace tools were not offered in that round"}`

// Continuation reads the record of the Responses turn whose client-facing id is responseID
// (ErrNotFound when this thread has none).
func (w *Workspace) Continuation(ctx context.Context, responseID string) (_ Continuation, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	rows, err := w.store.q.ResponseTurnContinuation(ctx, w.store.pool, db.ResponseTurnContinuationParams{ThreadID: w.threadID, ResponseID: responseID})
	if err != nil {
		return Continuation{}, fmt.Errorf("read response turn: %w", err)
	}
	if len(rows) == 0 {
		return Continuation{}, ErrNotFound
	}
	c := Continuation{LastResponseID: rows[0].LastResponseID, UserText: rows[0].UserText}
	for _, r := range rows {
		switch {
		case r.CallID == "":
		case r.Result == nil: // a call the model made where the tools were not offered
			c.Owed = append(c.Owed, OwedOutput{CallID: r.CallID, Output: notRun})
		default:
			// jsonb spaces its text; compact, it is the envelope as the call returned it.
			var b bytes.Buffer
			if err := json.Compact(&b, r.Result); err != nil {
				return Continuation{}, fmt.Errorf("read response turn: %w", err)
			}
			c.Owed = append(c.Owed, OwedOutput{CallID: r.CallID, Output: b.String()})
		}
	}
	return c, nil
}

// RecordResponseTurn records, durably, which upstream response ended a Responses turn whose
// client got responseID, and the workspace calls of that response whose outputs the upstream
// was not sent; for a client's thread, with the ids of the turn's responses and output items
// (ids), which the client may continue from and reference (RecordResponses), in the same round
// trip; and userText, the user's words the turn was given (its first MaxRecordedUserText bytes).
// A thread deleted meanwhile records nothing.
func (w *Workspace) RecordResponseTurn(ctx context.Context, turn int, responseID, lastResponseID string, owed, ids []string, userText string) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if owed == nil {
		owed = []string{}
	}
	err = db.RecordResponseTurn(ctx, w.store.pool, db.ResponseTurnRecordParams{
		ThreadID: w.threadID, ResponseID: responseID, Turn: int32(turn), LastResponseID: lastResponseID, OwedCallIds: owed,
		UserText: storableText(Truncate(userText, MaxRecordedUserText)),
	}, db.ClientResponseRecordParams{Client: w.id.Client, Ids: ids})
	if isForeignKeyViolation(err) {
		return nil
	}
	return err
}

// RecordResponses records, durably, the ids of responses made through wsproxy for a client (of
// CLIENT_KEYS) and of their output items: what the client may continue from
// (previous_response_id) and reference (an input item's id) later.
func (s *Store) RecordResponses(ctx context.Context, client string, ids []string) (err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	if err := s.q.ClientResponseRecord(ctx, s.pool, db.ClientResponseRecordParams{Client: client, Ids: ids}); err != nil {
		return fmt.Errorf("record responses: %w", err)
	}
	return nil
}

// UnknownResponses returns the ids among ids that no response made for the client holds.
func (s *Store) UnknownResponses(ctx context.Context, client string, ids []string) (_ []string, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	unknown, err := s.q.ClientResponseUnknown(ctx, s.pool, db.ClientResponseUnknownParams{Client: client, Ids: ids})
	if err != nil {
		return nil, fmt.Errorf("read responses: %w", err)
	}
	return unknown, nil
}
