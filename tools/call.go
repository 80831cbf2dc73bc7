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
//
// A call is planned on the workspace as it will find it (pure: its result, events and statement),
// then sent with its record and events in one round trip, one transaction that waits for the
// disk. A call of a turn whose view knows the workspace as the turn's start or last call left it
// is planned on that, and its round trip begins by locking the thread's row and checking that
// the workspace is still at that version (db.SendGuarded): one round trip in all. Otherwise, or
// when the workspace moved on meanwhile (a user's edit, another turn's call), the call first
// locks the row and reads the workspace (db.BeginLocked): two round trips.
func (w *Workspace) Run(ctx context.Context, c Call) (_ Result, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if n, max := max(len(c.Arguments), c.Length), w.store.limits.ArgumentBytesMax; n > max {
		return w.refuse(ctx, c, "", invalid("arguments", "at most %d bytes (got %d); nothing was written", max, n))
	}
	args, reasoning, err := parseArguments(c.Arguments)
	if err != nil {
		return w.refuse(ctx, c, reasoning, err)
	}
	if st := c.View.known(); st != nil {
		res, err := w.runPlanned(ctx, c, args, reasoning, *st, c.View, nil)
		if !errors.Is(err, db.ErrGuardRefused) && !errors.Is(err, errBookUnread) {
			return res, err
		}
	}
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
	st := state{created: tx.CreatedAt, version: tx.Version, nextID: tx.NextPreferenceID, objective: tx.Objective,
		list: fromRows(tx.Preferences)}
	view := c.View
	switch {
	case view != nil && !view.created.IsZero() && !view.created.Equal(tx.CreatedAt):
		// The thread was deleted and created again under its id: not the one the model was shown.
		return errorResult(errThreadGone), nil
	case view == nil && c.via() == ViaMCP && (c.Name == UpdatePreferences || c.Name == RemovePreferences):
		if view, err = w.viewAsOf(ctx, tx.Conn(), args, st.list, st.version-1); err != nil {
			return w.record(ctx, c, reasoning, err, tx, st)
		}
	case view == nil:
		view = viewOf(st.list)
	}
	if c.View == nil {
		// A call outside a turn (over MCP) sees the thread's scopes as they stand.
		scope, err := scopeFrom(tx.Scope, st.list)
		if err != nil {
			return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
		}
		view.inherited, view.propose = scope.Inherited, scope.AgentWrites == AgentWritesPropose
	}
	return w.runPlanned(ctx, c, args, reasoning, st, view, tx)
}

// runPlanned plans the call on st, the workspace as the call finds it, and sends its statement,
// record and events: in tx, which holds the thread's row lock since st was read, committing it;
// or, without tx, after ToolCallGuard, which locks the row and checks that the workspace is still
// st (db.ErrGuardRefused, nothing written, when it is not or a row is held). view is the list the call's indices
// name; a turn's view moves on with the call. A call that would make proposals is planned again
// once the proposals the workspace holds are read (proposalBook), in tx: without tx, it writes
// nothing (errBookUnread) and the call goes the locked way.
func (w *Workspace) runPlanned(ctx context.Context, c Call, args json.RawMessage, reasoning string, st state, view *View, tx *db.LockedTx) (Result, error) {
	out, err := w.plan(c.Name, args, st, view)
	if err != nil {
		return w.record(ctx, c, reasoning, err, tx, st)
	}
	if st.book == nil && out.proposes() {
		if tx == nil {
			return Result{}, errBookUnread
		}
		if st.book, err = w.readBook(ctx, tx.Conn(), out.changes); err != nil {
			return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
		}
		if out, err = w.plan(c.Name, args, st, view); err != nil {
			return w.record(ctx, c, reasoning, err, tx, st)
		}
	}
	if c.via() == ViaMCP && c.Name == ListPreferences {
		out.text = AsOfChange(out.text, st.version-1)
	}
	res := Result{OK: true, Content: Envelope{OK: true, Result: out.text}.encode(), Text: out.text, LockedSkips: out.lockedSkips}
	err = w.send(ctx, tx, st, out, func(b *pgx.Batch) {
		if out.write != nil {
			out.write(b)
		}
		db.QueueToolCallInsert(b, w.recordOf(c, reasoning, res))
		if len(out.changes) > 0 {
			db.QueueEventInsert(b, w.agentEvents(c, reasoning, out.changes), nil)
		}
	})
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	if out.shown != nil {
		view.show(out.shown)
	}
	view.ran(out.kept, out.removed)
	if c.View != nil {
		next := st.after(out)
		view.knows = &next
	}
	return res, nil
}

// send sends a planned call's statements (queue): in tx, committing it, or guarded by st's
// version (db.SendGuarded). Its commit goes out with them, so nothing that can wait for a lock
// may: the guard waits for none (a row held: db.ErrGuardRefused, nothing written), and in tx the
// rows out rewrites are locked first, in a round trip of their own. A call whose replica dies
// while it waits for a lock thus writes nothing.
func (w *Workspace) send(ctx context.Context, tx *db.LockedTx, st state, out toolOutput, queue func(b *pgx.Batch)) error {
	objective := out.objective != nil
	if tx == nil {
		return db.SendGuarded(ctx, w.store.pool, db.ToolCallGuardParams{ThreadID: w.threadID,
			CreatedAt: pgtype.Timestamptz{Time: st.created, Valid: true}, Version: st.version,
			Rows: out.rows, Objective: objective}, queue)
	}
	if len(out.rows) > 0 || objective {
		err := w.store.q.CallRowsLock(ctx, tx.Conn(), db.CallRowsLockParams{ThreadID: w.threadID, Rows: out.rows, Objective: objective})
		if err != nil {
			return err
		}
	}
	return tx.Commit(ctx, queue)
}

// maxRefusedArguments bounds the arguments kept of a refused call: longer ones are recorded as
// a JSON string of their first bytes, ending in "…".
const maxRefusedArguments = 4 << 10

// refuse answers a call refused before it was planned (its arguments too long, or not JSON)
// with an error envelope, and records it, in a statement of its own.
func (w *Workspace) refuse(ctx context.Context, c Call, reasoning string, err error) (Result, error) {
	res := errorResult(err)
	err = w.store.q.ToolCallInsert(ctx, w.store.pool, w.refusedRecord(c, reasoning, res))
	if isForeignKeyViolation(err) {
		return errorResult(errThreadGone), nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	return res, nil
}

// record answers a call its plan refused (err: a *ValidationError, a *DuplicateError, an
// unknown tool) with an error envelope, and records it as the call's statements are sent (in
// tx, or guarded by st's version: a refusal depends on the workspace it was planned on). An
// error that is not a refusal (the store failed) is returned.
func (w *Workspace) record(ctx context.Context, c Call, reasoning string, err error, tx *db.LockedTx, st state) (Result, error) {
	var ve *ValidationError
	var de *DuplicateError
	if !errors.As(err, &ve) && !errors.As(err, &de) && !errors.Is(err, errUnknownTool) {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	res := errorResult(err)
	arg := w.refusedRecord(c, reasoning, res)
	if err := w.send(ctx, tx, st, toolOutput{}, func(b *pgx.Batch) { db.QueueToolCallInsert(b, arg) }); err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	return res, nil
}

// refusedRecord is the record of a refused call, with at most maxRefusedArguments of its
// arguments.
func (w *Workspace) refusedRecord(c Call, reasoning string, res Result) db.ToolCallInsertParams {
	arg := w.recordOf(c, reasoning, res)
	if len(c.Arguments) > maxRefusedArguments {
		arg.Arguments, _ = json.Marshal(storableText(Truncate(c.Arguments, maxRefusedArguments)))
	}
	return arg
}

// errorResult is the result of a call refused with err.
func errorResult(err error) Result {
	return Result{Content: Envelope{Error: err.Error()}.encode(), Text: err.Error()}
}

// toolOutput is a call's plan: its result text, its events, what it leaves of the workspace, and
// the statement that writes it.
type toolOutput struct {
	text        string
	lockedSkips int
	changes     []change     // the events of the call
	kept        []Preference // the preferences the call added or changed, as it left them
	removed     []int64      // the preferences the call removed
	shown       []Preference // the list a list_preferences call showed
	objective   *string      // the objective the call set
	nextID      int64        // the thread's next preference id after the call's additions (0: unchanged)
	rows        []int64      // the preferences write updates or deletes
	write       func(b *pgx.Batch)
}

var errUnknownTool = errors.New("unknown tool")

// errBookUnread: a call planned on a known workspace would make proposals, which it must plan on
// what the workspace holds of them (read under the thread's row lock); it wrote nothing.
var errBookUnread = errors.New("the call's proposals are planned under the thread's lock")

// plan plans a call of the tool name on st, its indices naming view.
func (w *Workspace) plan(name string, args json.RawMessage, st state, view *View) (toolOutput, error) {
	switch name {
	case AddPreferences:
		return w.addPreferences(args, st, view)
	case ListPreferences:
		return toolOutput{text: listText(st.list), shown: st.list}, nil
	case UpdatePreferences:
		return w.updatePreferences(args, st, view)
	case RemovePreferences:
		return w.removePreferences(args, st, view)
	case SetObjective:
		return w.setObjective(args, st, view)
	}
	return toolOutput{}, fmt.Errorf("%w %q: the tools are %s", errUnknownTool, name, strings.Join(Names, ", "))
}

// recordOf is the record of a call and the result it returned.
func (w *Workspace) recordOf(c Call, reasoning string, res Result) db.ToolCallInsertParams {
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
