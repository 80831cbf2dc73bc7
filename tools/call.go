package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/wsproxy/wsproxy/workspace"
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
		return workspace.ViaProxy
	}
	return c.Via
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
	// Untrusted is what became of the call's write when its turn had read content the user did
	// not write (docs/spec.md §19): OutcomeGrounded, OutcomeProposed, OutcomeUnconfirmed,
	// OutcomeRefused or OutcomeOverLimit; "" otherwise.
	Untrusted string
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

// Run runs one tool call against the thread ws and records it with its reasoning. A call the
// tool refuses (arguments that are not JSON, break the schema or a limit; an unknown tool) gives
// an error envelope and writes nothing but its record; the returned error is only for failures
// of the store itself (Postgres unavailable, the context cancelled).
//
// A call is planned on the workspace as it will find it (pure: its result, events and what it
// writes), then the workspace sends it with its record and events in one round trip, one
// transaction that waits for the disk. A call of a turn whose view knows the workspace as the
// turn's start or last call left it is planned on that, and its round trip begins by locking the
// thread's row and checking that the workspace is still at that version (workspace.Commit): one
// round trip in all. Otherwise, or when the workspace moved on meanwhile (a user's edit, another
// turn's call), the call first locks the row and reads the workspace, and is planned on that
// (workspace.CommitLocked): two round trips. A call that would make proposals is planned again,
// under the lock, once what the workspace holds of them is read (workspace.ProposalBook): three.
func Run(ctx context.Context, ws *workspace.Workspace, c Call) (_ Result, err error) {
	ctx, done := ws.Op(ctx)
	defer done(&err)
	s := planner{limits: ws.Limits(), untrustedWrites: ws.UntrustedWrites()}
	if n, max := max(len(c.Arguments), c.Length), s.limits.ArgumentBytesMax; n > max {
		return refuse(ctx, ws, c, "", invalid("arguments", "at most %d bytes (got %d); nothing was written", max, n))
	}
	args, reasoning, err := parseArguments(c.Arguments)
	if err != nil {
		return refuse(ctx, ws, c, reasoning, err)
	}
	if st := c.View.known(); st != nil {
		p, err := s.planCall(c, args, reasoning, *st, c.View)
		if err != nil {
			return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
		}
		if !p.proposes() && !p.needsScope() {
			err = ws.Commit(ctx, *st, p.Plan)
			if err == nil {
				p.ran(c, *st)
				return p.res, nil
			}
			if !errors.Is(err, workspace.ErrGuardRefused) {
				return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
			}
		}
	}
	var planned called
	// A call outside a turn, or of a tainted turn, reads the workspace's place among its scopes
	// with the lock: its settings decide its write (docs/spec.md §17, §19).
	lock := workspace.CallLock{Create: c.via() == workspace.ViaMCP && !c.Existing, Scope: c.View == nil || c.View.Tainted()}
	err = ws.CommitLocked(ctx, lock, func(l *workspace.Locked) (workspace.Plan, error) {
		st := l.State
		view := c.View
		switch {
		case view != nil && !view.created.IsZero() && !view.created.Equal(st.Created):
			// The thread was deleted and created again under its id: not the one the model was shown.
			return workspace.Plan{}, errThreadGone
		case view == nil && c.via() == workspace.ViaMCP && (c.Name == UpdatePreferences || c.Name == RemovePreferences):
			var err error
			if view, err = viewAsOf(ctx, l, args, st.List, st.Version-1); err != nil {
				planned, err = refused(c, reasoning, err)
				return planned.Plan, err
			}
		case view == nil:
			view = viewOf(st.List)
		}
		if lock.Scope {
			scope, err := l.Scope()
			if err != nil {
				return workspace.Plan{}, err
			}
			if c.View == nil {
				// A call outside a turn (over MCP) sees the thread's scopes as they stand.
				view.inherited, view.propose = scope.Inherited, scope.AgentWrites == workspace.AgentWritesPropose
			}
			view.scope = &scope
		}
		var err error
		planned, err = s.planCall(c, args, reasoning, st, view)
		if err == nil && planned.proposes() {
			if st.Book, err = l.ProposalBook(ctx, planned.out.write.Changes); err != nil {
				return workspace.Plan{}, err
			}
			planned, err = s.planCall(c, args, reasoning, st, view)
		}
		planned.st = st
		return planned.Plan, err
	})
	switch {
	case errors.Is(err, errThreadGone) || errors.Is(err, workspace.ErrNotFound):
		return errorResult(errThreadGone), nil
	case err != nil:
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	planned.ran(c, planned.st)
	return planned.res, nil
}

// called is a planned call: what the workspace commits (its record and write), the result it
// answers, and, for a call that was not refused, its output and the view it moves on.
type called struct {
	workspace.Plan
	res  Result
	out  *toolOutput
	view *View
	st   workspace.State // the workspace it was planned on
}

// planCall plans the call on st, the workspace as the call finds it, its indices naming view.
// A call its plan refuses (a *ValidationError, a *DuplicateError, an unknown tool) is answered
// with an error envelope and recorded, writing nothing; an error that is not a refusal is
// returned.
func (s planner) planCall(c Call, args json.RawMessage, reasoning string, st workspace.State, view *View) (called, error) {
	out, err := s.plan(c, args, st, view)
	if err != nil {
		return refused(c, reasoning, err)
	}
	if c.via() == workspace.ViaMCP && c.Name == ListPreferences {
		out.text = AsOfChange(out.text, st.Version-1)
	}
	res := Result{OK: true, Content: Envelope{OK: true, Result: out.text}.encode(), Text: out.text, LockedSkips: out.lockedSkips, Untrusted: out.outcome}
	return called{Plan: workspace.Plan{Call: record(c, reasoning, res), Write: out.write}, res: res, out: &out, view: view}, nil
}

// proposes reports whether the call would make proposals, which it plans on what the workspace
// holds of them (workspace.ProposalBook, read under the thread's row lock).
func (p called) proposes() bool {
	return p.out != nil && workspace.Proposes(p.out.write.Changes)
}

// needsScope reports whether the call's write is decided on the workspace's settings, which it
// reads under the thread's row lock (a tainted turn's write: docs/spec.md §19).
func (p called) needsScope() bool { return p.out != nil && p.out.needsScope }

// refused is the plan of a call refused with err, which records it and writes nothing; an
// error that is not a refusal (the store failed) is returned.
func refused(c Call, reasoning string, err error) (called, error) {
	var ve *workspace.ValidationError
	var de *workspace.DuplicateError
	if !errors.As(err, &ve) && !errors.As(err, &de) && !errors.Is(err, errUnknownTool) {
		return called{}, err
	}
	res := errorResult(err)
	return called{Plan: workspace.Plan{Call: record(c, reasoning, res)}, res: res}, nil
}

// ran moves the call's view on once the workspace committed it: the list a list_preferences
// call showed, what the call added, changed and removed; a turn's view knows the workspace as
// the call, planned on st, left it.
func (p called) ran(c Call, st workspace.State) {
	if p.view != nil {
		p.view.scope = nil // read again, under the lock, by the next call that needs it
	}
	if p.out == nil {
		return
	}
	if p.out.shown != nil {
		p.view.show(p.out.shown)
	}
	p.view.ran(p.out.kept, p.out.removed)
	if p.out.ungrounded {
		p.view.ungrounded = true
	}
	if c.View != nil {
		next := after(st, *p.out)
		p.view.knows = &next
	}
}

// refuse answers a call refused before it was planned (its arguments too long, or not JSON)
// with an error envelope, and records it, in a statement of its own.
func refuse(ctx context.Context, ws *workspace.Workspace, c Call, reasoning string, err error) (Result, error) {
	res := errorResult(err)
	err = ws.RecordCall(ctx, record(c, reasoning, res))
	if errors.Is(err, workspace.ErrNotFound) {
		return errorResult(errThreadGone), nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	return res, nil
}

// record is the record of a call and the result it returned.
func record(c Call, reasoning string, res Result) workspace.ToolCall {
	return workspace.ToolCall{Turn: c.Turn, Round: c.Round, Via: c.via(), ID: c.ID, Name: c.Name,
		Arguments: c.Arguments, Reasoning: reasoning, OK: res.OK, Result: res.Content}
}

// errorResult is the result of a call refused with err.
func errorResult(err error) Result {
	return Result{Content: Envelope{Error: err.Error()}.encode(), Text: err.Error()}
}

// toolOutput is a call's plan: its result text, what it leaves of the workspace, and what it
// writes (its statements and events).
type toolOutput struct {
	text        string
	lockedSkips int
	kept        []workspace.Preference // the preferences the call added or changed, as it left them
	removed     []int64                // the preferences the call removed
	shown       []workspace.Preference // the list a list_preferences call showed
	write       workspace.Write
	// outcome is what became of a write of a tainted turn (docs/spec.md §19; "" for an untainted
	// turn's); ungrounded: the write was not grounded, so no later write of the turn is;
	// needsScope: the write of a tainted turn is decided on the workspace's settings, not read
	// yet (the call is planned again under the thread's lock, with them).
	outcome    string
	ungrounded bool
	needsScope bool
	// full: a proposal of the call was not made, MaxPendingProposals waiting already.
	full bool
	// at is, for an add, the position in the call's items of each preference it adds.
	at []int
}

var errUnknownTool = errors.New("unknown tool")

// plan plans the call c on st, its indices naming view: the tool's plan, and what provenance
// makes of its write (untrusted).
func (s planner) plan(c Call, args json.RawMessage, st workspace.State, view *View) (toolOutput, error) {
	book := st.Book.Clone() // as the tool's plan found it: a call decided per item plans again on it
	out, err := s.planTool(c.Name, args, st, view)
	if err != nil {
		return out, err
	}
	return s.untrusted(c, args, st, view, out, book)
}

// planTool plans a call of the tool name on st, its indices naming view.
func (s planner) planTool(name string, args json.RawMessage, st workspace.State, view *View) (toolOutput, error) {
	switch name {
	case AddPreferences:
		return s.addPreferences(args, st, view)
	case ListPreferences:
		return toolOutput{text: listText(st.List), shown: st.List}, nil
	case UpdatePreferences:
		return s.updatePreferences(args, st, view)
	case RemovePreferences:
		return s.removePreferences(args, st, view)
	case SetObjective:
		return s.setObjective(args, st, view)
	}
	return toolOutput{}, fmt.Errorf("%w %q: the tools are %s", errUnknownTool, name, strings.Join(Names, ", "))
}
