package workspace

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wsproxy/wsproxy/db"
)

// The write of a tool call. The tools (package tools) plan a call on the workspace as the call
// finds it (State) and give the workspace their plan (Plan: the call's record, and what it
// writes and its events); the workspace sends it with its record and events in one round trip,
// one transaction that waits for the disk: guarded by the version it was planned on (Commit),
// or under the thread's row lock, the workspace read first and the plan made on it
// (CommitLocked).

// State is a thread's workspace as a call plans on it: the thread (its creation), the
// workspace's version (the thread's next_event_id: every change of the workspace appends its
// events, which move it on), the thread's next preference id, its objective ("" none) with its
// source and its list in creation order; and, for a call that would make proposals, what the
// workspace holds of them (nil: not read; Locked.ProposalBook).
type State struct {
	Created         time.Time
	Version         int64
	NextID          int64
	Objective       string
	ObjectiveSource string
	List            []Preference
	Book            *ProposalBook
}

// ToolCall is the record of one tool call the model made, and of the result it was answered.
type ToolCall struct {
	Turn, Round int
	// Via is the path the call came by: ViaProxy, a call of a proxied turn; ViaMCP, a call over
	// MCP, which belongs to no turn (Turn and Round are recorded as null).
	Via       string
	ID        string // the id the model gave the call
	Name      string // the tool
	Arguments string // as the model sent them, or their start
	Reasoning string // the action_and_reasoning the model gave
	OK        bool
	Result    string // the envelope the call returned
}

// turn and round are the call's turn and round as recorded: null for a call of no turn.
func (c ToolCall) turn() (turn, round pgtype.Int4) {
	inTurn := c.Via != ViaMCP
	return pgtype.Int4{Int32: int32(c.Turn), Valid: inTurn}, pgtype.Int4{Int32: int32(c.Round), Valid: inTurn}
}

// Write is what a planned call writes of the workspace: the preferences it adds (with their ids,
// from State.NextID on, and their sources) and the thread's next preference id after them; the
// preferences it gives new fields (title, subtitle, kind, source) and those it removes, each only
// while unlocked (the statements' "AND NOT locked"); the objective it sets, with its source; and
// its events, each with the write's context (WriteContext's JSON; nil for none), or, when
// Contexts holds one per change, its own (a call whose items were decided apart: docs/spec.md
// §19). A refused call, or list_preferences, writes nothing.
type Write struct {
	Insert          []Preference
	NextID          int64
	Update          []Preference
	Delete          []int64
	Objective       *string
	ObjectiveSource string
	Changes         []Change
	Context         []byte
	Contexts        [][]byte
}

// ContextOf is the context of the write's change i.
func (w Write) ContextOf(i int) []byte {
	if len(w.Contexts) == len(w.Changes) {
		return w.Contexts[i]
	}
	return w.Context
}

// rows are the preferences w updates or deletes.
func (w Write) rows() []int64 {
	var rows []int64
	for _, p := range w.Update {
		rows = append(rows, p.ID)
	}
	return append(rows, w.Delete...)
}

// Plan is a planned call: its record and what it writes.
type Plan struct {
	Call  ToolCall
	Write Write
}

// ErrGuardRefused: Commit wrote nothing, since the workspace is no longer the one the call was
// planned on, or another transaction holds a row the call would lock.
var ErrGuardRefused = db.ErrGuardRefused

// Op begins one operation of the workspace made of several of its calls (a tool call: Commit,
// then CommitLocked), as each operation of the store begins: ctx bounded by the store's timeout,
// and done, which the operation defers with its error to release the bound and mark a failure
// of Postgres itself with ErrUnavailable. RecordCall, Commit and CommitLocked run within it.
func (w *Workspace) Op(ctx context.Context) (context.Context, func(*error)) { return w.store.op(ctx) }

// RecordCall records a call refused before it was planned (its arguments too long, or not
// JSON), in a statement of its own. ErrNotFound when the thread does not exist.
func (w *Workspace) RecordCall(ctx context.Context, c ToolCall) error {
	err := w.store.q.ToolCallInsert(ctx, w.store.pool, w.toolCallParams(c))
	if isForeignKeyViolation(err) {
		return ErrNotFound
	}
	return err
}

// Commit sends p, planned on st, in one round trip: ToolCallGuard locks the thread's row and the
// rows p rewrites, waiting for none of them, and checks that the workspace is still st; then p's
// statements, its record and its events, and the commit (db.SendGuarded). ErrGuardRefused, and
// nothing written, when the workspace moved on or a row is held.
func (w *Workspace) Commit(ctx context.Context, st State, p Plan) error {
	var first int64
	err := db.SendGuarded(ctx, w.store.pool, db.ToolCallGuardParams{ThreadID: w.threadID,
		CreatedAt: pgtype.Timestamptz{Time: st.Created, Valid: true}, Version: st.Version,
		Rows: p.Write.rows(), Objective: p.Write.Objective != nil}, w.queue(p, &first))
	if err == nil {
		w.proposed(p.Write.Changes, first)
	}
	return err
}

// CallLock is how CommitLocked takes the thread's row: Create creates the thread when new (a
// call over MCP), Scope reads the thread's place among its scopes too (Locked.Scope).
type CallLock struct {
	Create, Scope bool
}

// Locked is the workspace as a call finds it under the thread's row lock (CommitLocked).
type Locked struct {
	State
	w  *Workspace
	tx *db.LockedTx
}

// Scope is the thread's place among its scopes as it stands, read with the lock (CallLock.Scope).
func (l *Locked) Scope() (ScopeInfo, error) { return scopeFrom(l.tx.Scope, l.List, l.w.id.Client) }

// ErrPruned: the history after a change is no longer kept (HISTORY_RETENTION).
var ErrPruned = errors.New("the history after the change is no longer kept")

// ListAfter is the thread's list as it stood after its event n, rebuilt from the list as it
// stands and the events since, indexed in creation order. ErrPruned when the history after n
// was pruned.
func (l *Locked) ListAfter(ctx context.Context, n int64) ([]Preference, error) {
	w, q := l.w, l.tx.Conn()
	// The events after n are all there when the first of them is: history is pruned oldest first.
	if _, err := w.store.q.EventGet(ctx, q, db.EventGetParams{ThreadID: w.threadID, ID: n + 1}); errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrPruned
	} else if err != nil {
		return nil, fmt.Errorf("read event %d: %w", n+1, err)
	}
	states, err := w.store.q.EventPreferenceStatesAfter(ctx, q, db.EventPreferenceStatesAfterParams{ThreadID: w.threadID, AfterID: n})
	if err != nil {
		return nil, fmt.Errorf("read the events after change %d: %w", n, err)
	}
	then := make(map[int64]Preference, len(l.List)+len(states))
	for _, p := range l.List {
		then[p.ID] = p
	}
	for _, s := range states {
		if s.Before == nil { // added since
			delete(then, s.ID)
			continue
		}
		var p Preference
		if err := json.Unmarshal(s.Before, &p); err != nil {
			return nil, fmt.Errorf("decode event: %w", err)
		}
		p.ID = s.ID
		then[s.ID] = p
	}
	shown := make([]Preference, 0, len(then))
	for _, p := range then {
		shown = append(shown, p)
	}
	slices.SortFunc(shown, func(a, b Preference) int { return cmp.Compare(a.ID, b.ID) })
	for i := range shown {
		shown[i].Index = i + 1
	}
	return shown, nil
}

// CommitLocked locks the thread's row (as lock says) and reads the workspace, in one round trip
// (db.BeginLocked); plan plans the call on it; its statements, record and events are sent with
// the commit. Nothing that can wait for a lock goes out with the commit: the rows the plan
// rewrites are locked first, in a round trip of their own, so a call whose replica dies while
// it waits for a lock writes nothing. ErrNotFound when the thread does not exist (nothing is
// planned); plan's error, and nothing written, when it fails.
func (w *Workspace) CommitLocked(ctx context.Context, lock CallLock, plan func(*Locked) (Plan, error)) error {
	how := db.LockThread
	if lock.Create {
		how = db.LockThreadUpsert
	}
	tx, err := db.BeginLocked(ctx, w.store.pool, how, w.threadID, lock.Scope)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	l := &Locked{w: w, tx: tx, State: State{Created: tx.CreatedAt, Version: tx.Version, NextID: tx.NextPreferenceID,
		Objective: tx.Objective, ObjectiveSource: tx.ObjectiveSource, List: fromRows(tx.Preferences)}}
	p, err := plan(l)
	if err != nil {
		return err
	}
	rows, objective := p.Write.rows(), p.Write.Objective != nil
	if len(rows) > 0 || objective {
		err := w.store.q.CallRowsLock(ctx, tx.Conn(), db.CallRowsLockParams{ThreadID: w.threadID, Rows: rows, Objective: objective})
		if err != nil {
			return err
		}
	}
	var first int64
	if err := tx.Commit(ctx, w.queue(p, &first)); err != nil {
		return err
	}
	w.proposed(p.Write.Changes, first)
	return nil
}

// queue queues p's statements, then its record, then its events, the first of whose ids goes
// to first.
func (w *Workspace) queue(p Plan, first *int64) func(b *pgx.Batch) {
	return func(b *pgx.Batch) {
		w.queueWrite(b, p.Write)
		db.QueueToolCallInsert(b, w.toolCallParams(p.Call))
		// One statement per run of changes with one context; their ids follow on, under the
		// thread's lock, from first.
		changes, start := p.Write.Changes, 0
		for i := 1; i <= len(changes); i++ {
			if i < len(changes) && bytes.Equal(p.Write.ContextOf(i), p.Write.ContextOf(start)) {
				continue
			}
			to := first
			if start > 0 {
				to = nil
			}
			db.QueueEventInsert(b, w.agentEvents(p.Call, changes[start:i], p.Write.ContextOf(start)), to)
			start = i
		}
	}
}

// ProposalNotice is a proposal as a reviewer is told of it when it is made (Options.OnProposals,
// PROPOSALS_WEBHOOK): its thread (stored form), its event id, and the title it would write (the
// objective's text for an objective; the item's title for a removal). Never a key or a token.
type ProposalNotice struct {
	Thread   string `json:"thread"`
	Proposal int64  `json:"proposal"`
	Title    string `json:"title"`
}

// proposed tells Options.OnProposals of the proposals of committed changes, whose events took
// ids from first on.
func (w *Workspace) proposed(changes []Change, first int64) {
	on := w.store.onProposals
	if on == nil || first == 0 {
		return
	}
	var out []ProposalNotice
	for i, c := range changes {
		if !c.IsProposal() {
			continue
		}
		var f struct{ Title, Text string }
		if string(c.proposed) == "null" {
			_ = json.Unmarshal(c.before, &f)
		} else {
			_ = json.Unmarshal(c.proposed, &f)
		}
		out = append(out, ProposalNotice{Thread: w.threadID, Proposal: first + int64(i), Title: cmp.Or(f.Title, f.Text)})
	}
	if len(out) > 0 {
		on(out)
	}
}

// queueWrite queues the statements of wr.
func (w *Workspace) queueWrite(b *pgx.Batch, wr Write) {
	if len(wr.Insert) > 0 {
		p := db.PreferenceInsertBatchParams{ThreadID: w.threadID, NextPreferenceID: wr.NextID}
		for _, it := range wr.Insert {
			p.Ids = append(p.Ids, it.ID)
			p.Titles = append(p.Titles, it.Title)
			p.Subtitles = append(p.Subtitles, it.Subtitle)
			p.Kinds = append(p.Kinds, it.Kind)
			p.Locks = append(p.Locks, it.Locked)
			p.Sources = append(p.Sources, cmp.Or(it.Source, SourceAgent))
		}
		db.QueuePreferenceInsertBatch(b, p)
	}
	if len(wr.Update) > 0 {
		p := db.PreferenceUpdateUnlockedParams{ThreadID: w.threadID}
		for _, u := range wr.Update {
			p.Ids = append(p.Ids, u.ID)
			p.Titles = append(p.Titles, u.Title)
			p.Subtitles = append(p.Subtitles, u.Subtitle)
			p.Kinds = append(p.Kinds, u.Kind)
			p.Sources = append(p.Sources, cmp.Or(u.Source, SourceAgent))
		}
		db.QueuePreferenceUpdateUnlocked(b, p, wrote(p.Ids))
	}
	if len(wr.Delete) > 0 {
		p := db.PreferenceDeleteUnlockedParams{ThreadID: w.threadID, Ids: wr.Delete}
		db.QueuePreferenceDeleteUnlocked(b, p, wrote(p.Ids))
	}
	if wr.Objective != nil {
		db.QueueObjectiveUpsert(b, db.ObjectiveUpsertParams{ThreadID: w.threadID, Text: *wr.Objective, UpdatedBy: ByAgent,
			Source: cmp.Or(wr.ObjectiveSource, SourceAgent)})
	}
}

// errPlanDisagreed: a statement of a planned call changed other preferences than the plan said,
// which the thread's row lock, held from the read the plan was made on (or from the check of its
// version), rules out.
var errPlanDisagreed = errors.New("the workspace changed under the thread's lock")

// wrote checks that an agent-path statement changed exactly the preferences of ids: those the
// plan found unlocked under the thread's lock. The statement's own "AND NOT locked" leaves a
// locked one alone whatever the plan said; a disagreement is an error of the call.
func wrote(ids []int64) func(done []int64) error {
	return func(done []int64) error {
		if len(done) != len(ids) {
			return errPlanDisagreed
		}
		want := make(map[int64]bool, len(ids))
		for _, id := range ids {
			want[id] = true
		}
		for _, id := range done {
			if !want[id] {
				return errPlanDisagreed
			}
		}
		return nil
	}
}

// MaxRefusedArguments bounds the arguments kept of a refused call: longer ones are recorded as
// a JSON string of their first bytes, ending in "…".
const MaxRefusedArguments = 4 << 10

// toolCallParams are the parameters that record c; a refused call keeps at most
// MaxRefusedArguments of its arguments.
func (w *Workspace) toolCallParams(c ToolCall) db.ToolCallInsertParams {
	turn, round := c.turn()
	arg := db.ToolCallInsertParams{
		ThreadID:           w.threadID,
		Turn:               turn,
		Round:              round,
		CallID:             storableText(c.ID),
		Tool:               c.Name,
		Arguments:          argumentsJSON(c.Arguments),
		ActionAndReasoning: storableReason(c.Reasoning),
		Ok:                 c.OK,
		Result:             []byte(c.Result),
	}
	if !c.OK && len(c.Arguments) > MaxRefusedArguments {
		arg.Arguments, _ = json.Marshal(storableText(Truncate(c.Arguments, MaxRefusedArguments)))
	}
	return arg
}
