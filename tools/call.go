package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wsproxy/wsproxy/db"
)

// Call is one tool call the model made in a turn.
type Call struct {
	Turn      int
	Round     int
	ID        string // the id the model gave the call (kept with its record)
	Name      string
	Arguments string // as the model sent them, or their start (see Length)
	// Length is the arguments' length in bytes when Arguments holds only their start (a stream
	// brought more than ArgumentBytesMax, which the call is refused for); 0 otherwise.
	Length int
	// View is the list the call's indices name, the model's view of the round (see View); the
	// call moves it on. Nil: the list as the call finds it.
	View *View
	// Via is the path the call came by: "" or ViaProxy, a call of a proxied turn; ViaMCP, a call
	// over MCP, which belongs to no turn (Turn and Round are recorded as null) and creates its
	// thread when new, as a turn's start does.
	Via string
	// Existing runs a call over MCP only on a thread that exists (a thread token's: its thread
	// existed when the token was made, so one missing now was deleted, and is not created again);
	// false creates it when new.
	Existing bool
}

// via is the path the call came by.
func (c Call) via() string {
	if c.Via == "" {
		return ViaProxy
	}
	return c.Via
}

// turn and round are the call's turn and round as recorded: null for a call of no turn.
func (c Call) turn() (turn, round pgtype.Int4) {
	inTurn := c.via() != ViaMCP
	return pgtype.Int4{Int32: int32(c.Turn), Valid: inTurn}, pgtype.Int4{Int32: int32(c.Round), Valid: inTurn}
}

// Result is what a call gives back to the model.
type Result struct {
	OK bool
	// Content is the tool message's content: the envelope {"ok":true,"result":…} or
	// {"ok":false,"error":…}.
	Content string
	// Text is the envelope's result, or its error.
	Text string
	// LockedSkips counts the locked preferences the call named and left alone.
	LockedSkips int
}

// Envelope is the JSON a tool message carries.
type Envelope struct {
	OK     bool   `json:"ok"`
	Result string `json:"result,omitempty"`
	Error  string `json:"error,omitempty"`
}

func (e Envelope) encode() string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(e) // a struct of strings always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

// errThreadGone: the thread was deleted (through the admin REST) while its turn ran.
var errThreadGone = errors.New("this thread's workspace was deleted; nothing was recorded")

// Run runs one tool call against the thread and records it with its reasoning. A call the tool
// refuses (arguments that are not JSON, break the schema or a limit; an unknown tool) gives an
// error envelope and writes nothing but its record; the returned error is only for failures of
// the store itself (Postgres unavailable, the context cancelled).
func (w *Workspace) Run(ctx context.Context, c Call) (_ Result, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if n, max := max(len(c.Arguments), c.Length), w.store.limits.ArgumentBytesMax; n > max {
		return w.refuse(ctx, w.store.pool, c, "", invalid("arguments", "at most %d bytes (got %d); nothing was written", max, n), nil)
	}
	args, reasoning, err := parseArguments(c.Arguments)
	if err != nil {
		return w.refuse(ctx, w.store.pool, c, reasoning, err, nil)
	}
	// One round trip to begin, lock the thread and read its list (and, for a call outside a turn,
	// its scopes); one for the tool's statement
	// (none for list_preferences); one to record the call and commit.
	lock := db.LockThread
	if c.via() == ViaMCP && !c.Existing {
		lock = db.LockThreadUpsert
	}
	tx, err := db.BeginLocked(ctx, w.store.pool, lock, w.threadID, c.View == nil)
	if errors.Is(err, db.ErrNotFound) {
		return errorResult(errThreadGone), nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	defer tx.Rollback(ctx)
	view, list := c.View, fromRows(tx.Preferences)
	if view == nil && c.via() == ViaMCP && (c.Name == UpdatePreferences || c.Name == RemovePreferences) {
		if view, err = w.viewAsOf(ctx, tx.Conn(), args, list); err != nil {
			return w.refuse(ctx, tx.Conn(), c, reasoning, err, tx)
		}
	} else if view == nil {
		view = viewOf(list)
	}
	if c.View == nil {
		// A call outside a turn (over MCP) sees the thread's scopes as they stand.
		scope, err := scopeFrom(tx.Scope, list)
		if err != nil {
			return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
		}
		view.inherited, view.propose = scope.Inherited, scope.AgentWrites == AgentWritesPropose
	} else if !view.created.IsZero() && !view.created.Equal(tx.CreatedAt) {
		// The thread was deleted and created again under its id: not the one the model was shown.
		return errorResult(errThreadGone), nil
	}
	out, err := w.dispatch(ctx, tx.Conn(), c.Name, args, tx.NextPreferenceID, view, list)
	if err != nil {
		// A refused call has written nothing (every check runs before the tool's statement): the
		// view stays as it was.
		return w.refuse(ctx, tx.Conn(), c, reasoning, err, tx)
	}
	if c.via() == ViaMCP && c.Name == ListPreferences {
		last, err := w.lastEvent(ctx, tx.Conn())
		if err != nil {
			return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
		}
		out.text = AsOfChange(out.text, last)
	}
	res := Result{OK: true, Content: Envelope{OK: true, Result: out.text}.encode(), Text: out.text, LockedSkips: out.lockedSkips}
	err = tx.Commit(ctx, func(b *pgx.Batch) {
		db.QueueToolCallInsert(b, w.record(c, reasoning, res))
		if len(out.changes) > 0 {
			db.QueueEventInsert(b, w.agentEvents(c, reasoning, out.changes), nil)
		}
	})
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	view.ran(out.kept, out.removed)
	return res, nil
}

// maxRefusedArguments bounds the arguments kept of a refused call: longer ones are recorded as
// a JSON string of their first bytes, ending in "…".
const maxRefusedArguments = 4 << 10

// refuse answers a call the tool refused with an error envelope and records it (committing tx
// when the call ran in one), with at most maxRefusedArguments of its arguments. An error that is
// not a refusal (the store failed) is returned.
func (w *Workspace) refuse(ctx context.Context, q db.DBTX, c Call, reasoning string, err error, tx *db.LockedTx) (Result, error) {
	var ve *ValidationError
	var de *DuplicateError
	if !errors.As(err, &ve) && !errors.As(err, &de) && !errors.Is(err, errUnknownTool) {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	res := errorResult(err)
	arg := w.record(c, reasoning, res)
	if len(c.Arguments) > maxRefusedArguments {
		arg.Arguments, _ = json.Marshal(storableText(Truncate(c.Arguments, maxRefusedArguments)))
	}
	if tx != nil {
		err = tx.Commit(ctx, func(b *pgx.Batch) { db.QueueToolCallInsert(b, arg) })
	} else {
		err = w.store.q.ToolCallInsert(ctx, q, arg)
	}
	if isForeignKeyViolation(err) {
		return errorResult(errThreadGone), nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	return res, nil
}

// errorResult is the result of a call refused with err.
func errorResult(err error) Result {
	return Result{Content: Envelope{Error: err.Error()}.encode(), Text: err.Error()}
}

type toolOutput struct {
	text        string
	lockedSkips int
	changes     []change     // the events of the call
	kept        []Preference // the preferences the call added or changed, as it left them
	removed     []int64      // the preferences the call removed
}

var errUnknownTool = errors.New("unknown tool")

func (w *Workspace) dispatch(ctx context.Context, tx db.DBTX, name string, args json.RawMessage, nextID int64, view *View, list []Preference) (toolOutput, error) {
	switch name {
	case AddPreferences:
		return w.addPreferences(ctx, tx, args, nextID, view, list)
	case ListPreferences:
		view.show(list)
		return toolOutput{text: listText(list)}, nil
	case UpdatePreferences:
		return w.updatePreferences(ctx, tx, args, view, list)
	case RemovePreferences:
		return w.removePreferences(ctx, tx, args, view, list)
	case SetObjective:
		return w.setObjective(ctx, tx, args, view)
	}
	return toolOutput{}, fmt.Errorf("%w %q: the tools are %s", errUnknownTool, name, strings.Join(Names, ", "))
}

// record is the record of a call and the result it returned.
func (w *Workspace) record(c Call, reasoning string, res Result) db.ToolCallInsertParams {
	turn, round := c.turn()
	return db.ToolCallInsertParams{
		ThreadID:           w.threadID,
		Turn:               turn,
		Round:              round,
		CallID:             storableText(c.ID),
		Tool:               c.Name,
		Arguments:          argumentsJSON(c.Arguments),
		ActionAndReasoning: storableReason(reasoning),
		Ok:                 res.OK,
		Result:             []byte(res.Content),
	}
}
