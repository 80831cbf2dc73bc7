package workspace

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wsproxy/wsproxy/db"
)

// Event kinds (docs/spec.md §13).
const (
	ObjectiveSet       = "objective_set"
	PreferenceAdded    = "preference_added"
	PreferenceUpdated  = "preference_updated"
	PreferenceLocked   = "preference_locked"
	PreferenceUnlocked = "preference_unlocked"
	PreferenceRemoved  = "preference_removed"
	Revert             = "revert"
	LockedSkip         = "locked_skip"
	// docs/spec.md §17: a thread's parents or review setting changed; review mode's proposal of
	// an agent's change, and a proposal the user dismissed; a preference moved between threads
	// (one event in each).
	ParentsSet        = "parents_set"
	AgentWritesSet    = "agent_writes_set"
	Proposed          = "proposed"
	ProposalDismissed = "proposal_dismissed"
	PreferenceMoved   = "preference_moved"
	// Compaction: the client compacted its history (docs/spec.md §18); it changed nothing of the
	// workspace.
	Compaction = "compaction"
	// UntrustedWritesSet: a thread's untrusted_writes changed (docs/spec.md §19).
	UntrustedWritesSet = "untrusted_writes_set"
	// SharedWithSet: the clients a workspace is shared with changed (docs/spec.md §20).
	SharedWithSet = "shared_with_set"
)

// ByClient is the actor of a change a client made by its request (X-Workspace-Parents), or of
// its compaction, not a user in the admin REST nor the model.
const ByClient = "client"

// Targets of events.
const (
	TargetObjective  = "objective"
	TargetPreference = "preference"
	TargetThread     = "thread" // its parents or review setting, or the client's compaction
)

// Version is where a thread stands in its history: its next event id and its creation. Every
// change of its workspace appends events (which move the first), and a thread deleted and
// created again has another creation.
type Version struct {
	NextEvent int64
	Created   time.Time
}

// Versions are where the threads (stored form) stand, by thread; a thread that does not exist
// has none. The replicas follow the threads they watch with it (docs/spec.md §13): one indexed
// read per interval, whatever the rate of writes, and no write waits for it.
func (s *Store) Versions(ctx context.Context, threads []string) (_ map[string]Version, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	rows, err := s.q.ThreadVersions(ctx, s.pool, threads)
	if err != nil {
		return nil, fmt.Errorf("read the threads' versions: %w", err)
	}
	out := make(map[string]Version, len(rows))
	for _, r := range rows {
		out[r.ID] = Version{NextEvent: r.NextEventID, Created: r.CreatedAt.Time}
	}
	return out, nil
}

// MaxReason is how many characters of a call's action_and_reasoning are kept.
const MaxReason = 1000

// Event is one change of a thread's workspace.
type Event struct {
	ID         int64           `json:"id"`
	Thread     string          `json:"thread"`
	At         time.Time       `json:"at"`
	Actor      string          `json:"actor"` // ByAgent, ByUser or ByClient
	Via        string          `json:"via"`   // ViaProxy, ViaMCP or ViaAdmin
	Turn       *int            `json:"turn"`
	Round      *int            `json:"round"`
	ToolCallID *int64          `json:"tool_call_id"`
	Reason     *string         `json:"reason"`
	Kind       string          `json:"kind"`
	Target     Target          `json:"target"`
	Before     json.RawMessage `json:"before"` // the target's fields, null where it did not exist
	After      json.RawMessage `json:"after"`
	Reverts    *int64          `json:"reverts,omitempty"`
	// Proposed is a locked_skip's proposal: the preference's fields as the refused update would
	// have left them ({title, subtitle, kind}), or null for a refused removal; absent where the
	// event has none (other kinds, and an update's locked_skip stored without one).
	Proposed json.RawMessage `json:"proposed,omitempty"`
	// Answers is the proposal an apply or a dismissal answered.
	Answers *int64 `json:"answers,omitempty"`
	// Moved is a preference_moved's {from, to}: the threads' names.
	Moved json.RawMessage `json:"moved,omitempty"`
	// Context is an agent write's (proposed included): what its turn had read, and whether the
	// write was grounded in the user's words (WriteContext, docs/spec.md §19); absent on others.
	Context json.RawMessage `json:"context,omitempty"`
}

// isProposal reports whether the event is a proposal the user may apply or dismiss: review
// mode's, or a locked item's that kept what the agent asked for.
func (e Event) isProposal() bool {
	return e.Kind == Proposed || (e.Kind == LockedSkip && e.Proposed != nil)
}

// Target is what an event changed: the objective, or a preference by its stable id.
type Target struct {
	Type string `json:"type"`
	ID   int64  `json:"id,omitempty"`
}

// ParseTarget reads a target filter: "objective" or "preference:N".
func ParseTarget(s string) (Target, error) {
	if s == TargetObjective {
		return Target{Type: TargetObjective}, nil
	}
	if rest, ok := strings.CutPrefix(s, TargetPreference+":"); ok {
		if id, err := strconv.ParseInt(rest, 10, 64); err == nil && id > 0 {
			return Target{Type: TargetPreference, ID: id}, nil
		}
	}
	return Target{}, invalid("target", `must be "objective" or "preference:<id>"`)
}

// state is a stored before or after (jsonb, which orders and spaces it its own way) in the
// fields' order of docs/spec.md §13: {text, source} or {title, subtitle, kind, locked, source}
// (source left out of a state stored before sources were kept); null for none.
func (t Target) state(stored []byte) json.RawMessage { return t.stateOf("", stored) }

// stateOf is state for an event of thread (stored form): a thread's parents are named as its
// client names them.
func (t Target) stateOf(thread string, stored []byte) json.RawMessage {
	if stored == nil {
		return json.RawMessage("null")
	}
	if t.Type == TargetThread {
		return threadState(thread, stored)
	}
	if t.Type == TargetObjective {
		var o struct{ Text, Source string }
		_ = json.Unmarshal(stored, &o)
		return ObjectiveSourced(o.Text, o.Source)
	}
	var p Preference
	_ = json.Unmarshal(stored, &p)
	return PrefState(p)
}

// threadState is a thread target's stored state ({parents} of stored ids, or {agent_writes}) as
// events show it: parents by the names the client of thread (stored form) gives them (~name for
// a shared scope, docs/spec.md §20).
func threadState(thread string, stored []byte) json.RawMessage {
	var st struct {
		Parents *[]string `json:"parents"`
	}
	if json.Unmarshal(stored, &st) != nil || st.Parents == nil {
		return json.RawMessage(stored)
	}
	client := ""
	if id, err := ParseThreadID(thread); err == nil {
		client = id.Client
	}
	names := make([]string, len(*st.Parents))
	for i, p := range *st.Parents {
		names[i] = nameOf(p)
		if id, err := ParseThreadID(p); err == nil && client != "" {
			names[i] = id.NameFor(client)
		}
	}
	b, _ := json.Marshal(struct {
		Parents []string `json:"parents"`
	}{names})
	return b
}

// nameOf is a stored thread id's name, as its client gives it.
func nameOf(stored string) string {
	if id, err := ParseThreadID(stored); err == nil {
		return id.Name
	}
	return stored
}

// Change is one change a call or an edit makes, before it is an event.
type Change struct {
	kind          string
	target        Target
	before, after []byte // JSON; nil where the target did not exist
	reverts       int64
	proposed      []byte // a proposal: JSON, "null" for a removal; nil for none
	answers       int64  // the proposal an apply or dismissal answers; 0 none
	moved         []byte // a preference_moved's {from, to}; nil none
}

// PrefState is a preference's fields as events show them, with its source (a revert restores
// it).
func PrefState(p Preference) []byte {
	b, _ := json.Marshal(struct {
		Title    string `json:"title"`
		Subtitle string `json:"subtitle"`
		Kind     string `json:"kind"`
		Locked   bool   `json:"locked"`
		Source   string `json:"source,omitempty"`
	}{p.Title, p.Subtitle, p.Kind, p.Locked, p.Source})
	return b
}

// ObjectiveState is an objective's text as a proposal shows it; nil for none.
func ObjectiveState(text string) []byte { return ObjectiveSourced(text, "") }

// ObjectiveSourced is the objective as events show it, with its source ("" left out); nil for
// none.
func ObjectiveSourced(text, source string) []byte {
	if text == "" {
		return nil
	}
	b, _ := json.Marshal(struct {
		Text   string `json:"text"`
		Source string `json:"source,omitempty"`
	}{text, source})
	return b
}

// PrefChange is the change from before to after (nil where the preference does not exist), and
// false when nothing changed.
func PrefChange(before, after *Preference) (Change, bool) {
	c := Change{target: Target{Type: TargetPreference}}
	switch {
	case before == nil && after == nil:
		return c, false
	case before == nil:
		c.kind, c.target.ID, c.after = PreferenceAdded, after.ID, PrefState(*after)
		return c, true
	case after == nil:
		c.kind, c.target.ID, c.before = PreferenceRemoved, before.ID, PrefState(*before)
		return c, true
	}
	c.target.ID, c.before, c.after = before.ID, PrefState(*before), PrefState(*after)
	fields := before.Title != after.Title || before.Subtitle != after.Subtitle || before.Kind != after.Kind
	if !fields && before.Locked == after.Locked && before.Source != after.Source {
		// Only where it came from: a grounded write of what an unconfirmed item already said.
		c.kind = PreferenceUpdated
		return c, true
	}
	switch {
	case fields:
		c.kind = PreferenceUpdated
	case before.Locked == after.Locked:
		return c, false
	case after.Locked:
		c.kind = PreferenceLocked
	default:
		c.kind = PreferenceUnlocked
	}
	return c, true
}

// ObjectiveChange is the change of the objective from before to after ("" for none), and false
// when nothing changed.
func ObjectiveChange(before, after string) (Change, bool) {
	return ObjectiveSourcedChange(before, "", after, "")
}

// ObjectiveSourcedChange is the change of the objective from before to after ("" for none), each
// with its source, and false when nothing changed.
func ObjectiveSourcedChange(before, beforeSource, after, afterSource string) (Change, bool) {
	if before == after && (beforeSource == afterSource || after == "") {
		return Change{}, false
	}
	return Change{kind: ObjectiveSet, target: Target{Type: TargetObjective}, before: ObjectiveSourced(before, beforeSource),
		after: ObjectiveSourced(after, afterSource)}, true
}

// LockedSkipChange is the event of an agent's update or removal refused because p is locked:
// proposed holds the fields the update would have left, nil for a removal.
func LockedSkipChange(p Preference, proposed *Preference) Change {
	s := PrefState(p)
	c := Change{kind: LockedSkip, target: Target{Type: TargetPreference, ID: p.ID}, before: s, after: s, proposed: []byte("null")}
	if proposed != nil {
		c.proposed = ProposalState(*proposed)
	}
	return c
}

// proposalOf is a stored proposal (jsonb, which orders and spaces it its own way) in the fields'
// order of docs/spec.md §13; null for a removal.
func proposalOf(t Target, stored []byte) json.RawMessage {
	if string(stored) == "null" {
		return json.RawMessage("null")
	}
	if t.Type == TargetObjective {
		return t.state(stored)
	}
	var p Preference
	_ = json.Unmarshal(stored, &p)
	return ProposalState(p)
}

// Proposal is the event of a change proposed to target (before: its fields now, nil for an
// addition; want: the fields it would write, "null" for a removal).
func Proposal(target Target, before, want []byte) Change {
	return Change{kind: Proposed, target: target, before: before, proposed: want}
}

// ProposalState is a proposal's fields as events show them: {title, subtitle, kind}.
func ProposalState(p Preference) []byte {
	b, _ := json.Marshal(struct {
		Title    string `json:"title"`
		Subtitle string `json:"subtitle"`
		Kind     string `json:"kind"`
	}{p.Title, p.Subtitle, p.Kind})
	return b
}

// agentEvents are the parameters that append a tool call's changes, after its record in the
// same transaction, each with the write's context (nil: none).
func (w *Workspace) agentEvents(c ToolCall, changes []Change, context []byte) db.EventInsertParams {
	p := w.eventParams(ByAgent, c.Via, changes)
	p.Turn, p.Round = c.turn()
	p.Reason = pgtype.Text{String: storableReason(c.Reasoning), Valid: true}
	p.AfterToolCall = true
	p.Context = context
	return p
}

// storableReason is the reason as stored: storable text of at most MaxReason characters.
func storableReason(s string) string {
	s = storableText(s)
	if utf8.RuneCountInString(s) <= MaxReason {
		return s
	}
	return string([]rune(s)[:MaxReason])
}

func (w *Workspace) eventParams(actor, via string, changes []Change) db.EventInsertParams {
	p := db.EventInsertParams{ThreadID: w.threadID, Actor: actor, Via: via}
	for _, c := range changes {
		p.Kinds = append(p.Kinds, c.kind)
		p.TargetTypes = append(p.TargetTypes, c.target.Type)
		p.TargetIds = append(p.TargetIds, c.target.ID)
		p.Befores = append(p.Befores, string(c.before))
		p.Afters = append(p.Afters, string(c.after))
		p.Reverts = append(p.Reverts, c.reverts)
		p.Proposals = append(p.Proposals, string(c.proposed))
		p.Answers = append(p.Answers, c.answers)
		p.Moves = append(p.Moves, string(c.moved))
	}
	return p
}

func fromEvent(r db.Event) Event {
	e := Event{ID: r.ID, Thread: r.ThreadID, At: r.At.Time.UTC(), Actor: r.Actor, Via: r.Via, Kind: r.Kind,
		Target: Target{Type: r.TargetType, ID: r.TargetID.Int64}}
	e.Before, e.After = e.Target.stateOf(r.ThreadID, r.Before), e.Target.stateOf(r.ThreadID, r.After)
	e.Turn, e.Round = intOrNull(r.Turn), intOrNull(r.Round)
	if r.ToolCallID.Valid {
		e.ToolCallID = &r.ToolCallID.Int64
	}
	if r.Reason.Valid {
		e.Reason = &r.Reason.String
	}
	if r.Reverts.Valid {
		e.Reverts = &r.Reverts.Int64
	}
	if r.Proposed != nil {
		e.Proposed = proposalOf(e.Target, r.Proposed)
	}
	if r.Answers.Valid {
		e.Answers = &r.Answers.Int64
	}
	if r.Moved != nil {
		var m struct{ From, To string }
		_ = json.Unmarshal(r.Moved, &m)
		e.Moved = movedState(nameOf(m.From), nameOf(m.To))
	}
	if r.Context != nil {
		var c WriteContext
		if json.Unmarshal(r.Context, &c) == nil {
			e.Context = c.JSON()
		}
	}
	return e
}

// intOrNull is a nullable integer column's value, nil for null.
func intOrNull(v pgtype.Int4) *int {
	if !v.Valid {
		return nil
	}
	n := int(v.Int32)
	return &n
}

// EventQuery selects a thread's events.
type EventQuery struct {
	After      int64   // the cursor: events after it (before it, Descending); 0 none
	Target     *Target // one target's only
	Descending bool    // newest first
	Limit      int
}

// Events lists the thread's events. ErrNotFound when the thread does not exist.
func (w *Workspace) Events(ctx context.Context, q EventQuery) (_ []Event, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if err := w.exists(ctx); err != nil {
		return nil, err
	}
	p := db.EventListParams{ThreadID: w.threadID, AfterID: q.After, Descending: q.Descending, MaxRows: int32(q.Limit)}
	if q.Target != nil {
		p.TargetType, p.TargetID = q.Target.Type, q.Target.ID
	}
	rows, err := w.store.q.EventList(ctx, w.store.pool, p)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out := make([]Event, len(rows))
	for i, r := range rows {
		out[i] = fromEvent(r)
	}
	return out, nil
}

// LastEventID is the thread's last event id (0 for none). ErrNotFound when the thread does not
// exist.
func (w *Workspace) LastEventID(ctx context.Context) (_ int64, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	id, err := w.store.q.EventLastID(ctx, w.store.pool, w.threadID)
	return id, db.NotFound(err)
}

// NoteCompaction records that the thread's client compacted its history (docs/spec.md §18): a
// compaction event by the client via the proxy, target the thread, in one statement
// (EventCompactionInsert) that creates the thread when it does not exist (with no turn, past its
// tombstone) and wakes its live views. The event changes nothing of the workspace and carries no
// turn: a compaction is not a turn of the loop.
func (w *Workspace) NoteCompaction(ctx context.Context) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if _, err := w.store.q.EventCompactionInsert(ctx, w.store.pool, w.threadID); err != nil {
		return fmt.Errorf("record compaction: %w", err)
	}
	return nil
}

// ConflictError: a revert of a change whose target changed again since, or a proposal applied
// to an item that changed since it was made.
type ConflictError struct {
	Later    int64 // the first later event on the target
	Latest   int64 // the latest later event on the target (Later when there is one)
	Proposal bool  // an apply's, not a revert's
}

func (e *ConflictError) Error() string {
	if e.Proposal {
		return fmt.Sprintf("the preference changed after this proposal (event %d); it no longer applies", e.Later)
	}
	// The latest is the one that can be reverted now; ?through=latest reverts them all.
	return fmt.Sprintf("the target changed again after this change (latest: event %d); revert that one first, "+
		"or revert back to this change in one step with ?through=latest", e.Latest)
}

// Errors of RevertEvent: the event changed nothing (a locked_skip, a proposal or its
// dismissal, a client's compaction), or a thread's setting, which is set again rather than
// reverted.
var (
	errNothingToRevert = invalid("", "this event changed nothing (a locked_skip, a proposal or its dismissal, a client's compaction): there is nothing to revert")
	errRevertSetting   = invalid("", "a thread's parents or review setting is changed by setting it again (PUT …/parents, PATCH …), not reverted")
)

// RevertEvent restores the before state of the change event id made, as a user change, and
// returns the revert event. ErrNotFound for an unknown thread or event; a *ConflictError when
// the target changed again since; a *ValidationError for an event that changed nothing or a
// state past the limits; a *DuplicateError when a restored title is taken.
func (w *Workspace) RevertEvent(ctx context.Context, id int64) (Event, error) {
	return w.changeOnEvent(ctx, id, func(tx db.DBTX, ev Event, nextID int64, list []Preference) (c Change, err error) {
		if err := revertable(ev); err != nil {
			return Change{}, err
		}
		if err := w.laterChange(ctx, tx, id, ev.Target, false); err != nil {
			return Change{}, err
		}
		return w.revertOne(ctx, tx, ev, nextID, list)
	})
}

// revertable is nil for an event a revert can undo.
func revertable(ev Event) error {
	switch {
	case ev.Kind == LockedSkip || ev.Kind == Proposed || ev.Kind == ProposalDismissed || ev.Kind == Compaction:
		return errNothingToRevert
	case ev.Target.Type == TargetThread:
		return errRevertSetting
	}
	return nil
}

// revertOne restores the before state of ev's change over the target as it is now (list, the
// thread's preferences, in the transaction tx): the revert's change.
func (w *Workspace) revertOne(ctx context.Context, tx db.DBTX, ev Event, nextID int64, list []Preference) (c Change, err error) {
	if ev.Target.Type == TargetObjective {
		c, err = w.revertObjective(ctx, tx, ev)
	} else {
		c, err = w.revertPreference(ctx, tx, ev, nextID, list)
	}
	c.kind, c.reverts = Revert, ev.ID
	return c, err
}

// MaxRevertThrough is how many later changes of its target one RevertThrough undoes at most.
const MaxRevertThrough = 1000

// Errors of RevertThrough.
var (
	errThroughOther = invalid("through", `through must be "latest" or the id of the latest change of this event's target`)
	errTooManyLater = invalid("", "more than %d later changes of this target: revert the latest ones first", MaxRevertThrough)
)

// RevertThrough reverts the change event id made back to the state before it, in one step: each
// later change of its target first, newest first, then event id's own — each a revert event
// (docs/spec.md §13), all in one transaction under the thread's lock, so either all are made or
// none. through is the target's latest change as the caller saw it (its event id; 0: whatever
// is latest now): when the latest is another, a *ConflictError names it and nothing changes, so
// a change the caller has not seen is never undone unawares. With no later change it is
// RevertEvent's one revert. It returns the revert events in id order (event id's last).
// ErrNotFound, *ConflictError, *ValidationError and *DuplicateError as RevertEvent's — a
// restored title taken, or a limit passed, at any step refuses the whole. A later move of the
// preference reverts as RevertEvent reverts it (docs/spec.md §17: as a removal, on this side).
func (w *Workspace) RevertThrough(ctx context.Context, id, through int64) (_ []Event, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	var n int
	first, err := w.locked(ctx, db.LockThreadTouch, func(tx db.DBTX, nextID int64, list []Preference) ([]Change, error) {
		r, err := w.store.q.EventGet(ctx, tx, db.EventGetParams{ThreadID: w.threadID, ID: id})
		if err != nil {
			return nil, db.NotFound(err)
		}
		ev := fromEvent(r)
		if err := revertable(ev); err != nil {
			return nil, err
		}
		rows, err := w.store.q.EventChangesOnTarget(ctx, tx, db.EventChangesOnTargetParams{ThreadID: w.threadID, ID: id,
			TargetType: ev.Target.Type, TargetID: ev.Target.ID, MaxRows: MaxRevertThrough + 1})
		if err != nil {
			return nil, fmt.Errorf("read later events: %w", err)
		}
		if len(rows) > MaxRevertThrough {
			return nil, errTooManyLater
		}
		latest := id
		if len(rows) > 0 {
			latest = rows[len(rows)-1].ID
		}
		switch {
		case through == 0 || through == latest:
		case len(rows) > 0:
			return nil, &ConflictError{Later: rows[0].ID, Latest: latest}
		default:
			return nil, errThroughOther
		}
		steps := make([]Event, 0, len(rows)+1)
		for i := len(rows) - 1; i >= 0; i-- {
			steps = append(steps, fromEvent(rows[i]))
		}
		changes := make([]Change, 0, len(steps)+1)
		for _, e := range append(steps, ev) {
			c, err := w.revertOne(ctx, tx, e, nextID, list)
			if err != nil {
				return nil, err
			}
			list = listAfter(list, c)
			changes = append(changes, c)
		}
		n = len(changes)
		return changes, nil
	})
	if err != nil {
		return nil, err
	}
	rows, err := w.store.q.EventList(ctx, w.store.pool, db.EventListParams{ThreadID: w.threadID, AfterID: first - 1, MaxRows: int32(n)})
	if err != nil {
		return nil, fmt.Errorf("read the reverts' events: %w", err)
	}
	out := make([]Event, len(rows))
	for i, r := range rows {
		out[i] = fromEvent(r)
	}
	return out, nil
}

// listAfter is list (in id order) once the preference change c is made: a later step of a
// RevertThrough checks its limits and titles against it.
func listAfter(list []Preference, c Change) []Preference {
	if c.target.Type != TargetPreference {
		return list
	}
	out := make([]Preference, 0, len(list)+1)
	for _, p := range list {
		if p.ID != c.target.ID {
			out = append(out, p)
		}
	}
	if c.after != nil {
		var p Preference
		_ = json.Unmarshal(c.after, &p)
		p.ID = c.target.ID
		i := 0
		for i < len(out) && out[i].ID < p.ID {
			i++
		}
		out = slices.Insert(out, i, p)
	}
	for i := range out {
		out[i].Index = i + 1
	}
	return out
}

// changeOnEvent makes the user change fn derives from event id (ErrNotFound for an unknown one),
// under the thread's lock, and returns the change's event.
func (w *Workspace) changeOnEvent(ctx context.Context, id int64, fn func(tx db.DBTX, ev Event, nextID int64, list []Preference) (Change, error)) (_ Event, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	first, err := w.locked(ctx, db.LockThreadTouch, func(tx db.DBTX, nextID int64, list []Preference) ([]Change, error) {
		r, err := w.store.q.EventGet(ctx, tx, db.EventGetParams{ThreadID: w.threadID, ID: id})
		if err != nil {
			return nil, db.NotFound(err)
		}
		c, err := fn(tx, fromEvent(r), nextID, list)
		if err != nil {
			return nil, err
		}
		return []Change{c}, nil
	})
	if err != nil {
		return Event{}, err
	}
	r, err := w.store.q.EventGet(ctx, w.store.pool, db.EventGetParams{ThreadID: w.threadID, ID: first})
	if err != nil {
		return Event{}, fmt.Errorf("read the change's event: %w", err)
	}
	return fromEvent(r), nil
}

// laterChange is a *ConflictError naming the first and the latest events after id that changed
// target, or nil when none did.
func (w *Workspace) laterChange(ctx context.Context, tx db.DBTX, id int64, target Target, proposal bool) error {
	later, err := w.store.q.EventLaterOnTarget(ctx, tx, db.EventLaterOnTargetParams{ThreadID: w.threadID, ID: id,
		TargetType: target.Type, TargetID: target.ID})
	if err != nil {
		return fmt.Errorf("read later events: %w", err)
	}
	if later.Changes > 0 {
		return &ConflictError{Later: later.FirstID, Latest: later.LatestID, Proposal: proposal}
	}
	return nil
}

// Errors of ApplyProposal for events that keep no proposal.
var (
	errNotAProposal = invalid("", "only a proposed event, or a locked_skip that kept what the agent asked for, is a proposal")
	errSameProposal = invalid("", "the preference already reads as proposed: there is nothing to apply")
)

// ApplyProposal applies the proposal event id as a user change (docs/spec.md §13, §17): a
// locked_skip's (an update's fields, the lock kept, or the removal of the item) or review mode's
// (an addition, an update, a removal, an objective). The change's event answers the proposal, so
// it applies once. It returns that event. ErrNotFound for an unknown thread or event; a
// *ConflictError when the target changed since; an *AnsweredError for a proposal applied or
// dismissed already; a *ValidationError for an event that is not a proposal or one that changes
// nothing; a *DuplicateError when the proposed title is taken.
func (w *Workspace) ApplyProposal(ctx context.Context, id int64) (Event, error) {
	return w.changeOnEvent(ctx, id, func(tx db.DBTX, ev Event, nextID int64, list []Preference) (Change, error) {
		if !ev.isProposal() {
			return Change{}, errNotAProposal
		}
		if err := w.answered(ctx, tx, id); err != nil {
			return Change{}, err
		}
		if ev.Target.ID != 0 || ev.Target.Type == TargetObjective {
			if err := w.laterChange(ctx, tx, id, ev.Target, true); err != nil {
				return Change{}, err
			}
		}
		c, err := w.applyProposed(ctx, tx, ev, nextID, list)
		c.answers = id
		return c, err
	})
}

// applyProposed makes the change a proposal asks for, as the user.
func (w *Workspace) applyProposed(ctx context.Context, tx db.DBTX, ev Event, nextID int64, list []Preference) (Change, error) {
	if ev.Target.Type == TargetObjective {
		var want struct{ Text string }
		if err := json.Unmarshal(ev.Proposed, &want); err != nil {
			return Change{}, fmt.Errorf("decode proposal: %w", err)
		}
		r, err := w.store.q.ObjectiveUpsert(ctx, tx, db.ObjectiveUpsertParams{ThreadID: w.threadID, Text: want.Text, UpdatedBy: ByUser,
			Source: SourceConfirmed})
		if err != nil {
			return Change{}, fmt.Errorf("set objective: %w", err)
		}
		c, ok := ObjectiveSourcedChange(r.Previous, r.PreviousSource, r.Text, SourceConfirmed)
		if !ok || r.Previous == r.Text {
			return Change{}, invalid("", "the objective already reads as proposed: there is nothing to apply")
		}
		return c, nil
	}
	var want struct{ Title, Subtitle, Kind string }
	if string(ev.Proposed) != "null" {
		if err := json.Unmarshal(ev.Proposed, &want); err != nil {
			return Change{}, fmt.Errorf("decode proposal: %w", err)
		}
	}
	if ev.Target.ID == 0 { // an addition
		p, err := w.checkedFields(PreferenceInput{Title: want.Title, Subtitle: want.Subtitle, Kind: want.Kind}, 0, list)
		if err != nil {
			return Change{}, err
		}
		p.Source = SourceConfirmed
		if max := w.store.limits.PreferencesMax; len(list) >= max {
			return Change{}, invalid("", "a thread holds at most %d preferences", max)
		}
		rows, err := w.insert(ctx, tx, nextID, []Preference{p})
		if err != nil {
			return Change{}, err
		}
		added := fromRow(len(list)+1, rows[0])
		c, _ := PrefChange(nil, &added)
		return c, nil
	}
	i := IndexOf(list, ev.Target.ID)
	if i < 0 { // gone without an event: pruned history
		return Change{}, ErrNotFound
	}
	current := list[i]
	if string(ev.Proposed) == "null" {
		if _, err := w.store.q.PreferenceDelete(ctx, tx, db.PreferenceDeleteParams{ThreadID: w.threadID, ID: current.ID}); err != nil {
			return Change{}, fmt.Errorf("delete preference: %w", err)
		}
		c, _ := PrefChange(&current, nil)
		return c, nil
	}
	p, err := w.checkedFields(PreferenceInput{Title: want.Title, Subtitle: want.Subtitle, Kind: want.Kind, Locked: current.Locked}, current.ID, list)
	if err != nil {
		return Change{}, err
	}
	p.Index, p.Source = current.Index, SourceConfirmed
	c, ok := PrefChange(&current, &p)
	if !ok {
		return Change{}, errSameProposal
	}
	return c, w.updatePreference(ctx, tx, p)
}

// checkedFields are in's checked fields for preference id of list: a *ValidationError past the
// limits, a *DuplicateError for a title another preference has.
func (w *Workspace) checkedFields(in PreferenceInput, id int64, list []Preference) (Preference, error) {
	p, err := w.store.checkInput(in)
	if err != nil {
		return Preference{}, err
	}
	if existing, ok := findTitle(list, p.Title, id); ok {
		return Preference{}, &DuplicateError{Existing: existing}
	}
	p.ID = id
	return p, nil
}

// updatePreference writes p's fields and source over its preference.
func (w *Workspace) updatePreference(ctx context.Context, tx db.DBTX, p Preference) error {
	if _, err := w.store.q.PreferenceUpdate(ctx, tx, db.PreferenceUpdateParams{ThreadID: w.threadID, ID: p.ID,
		Title: p.Title, Subtitle: p.Subtitle, Kind: p.Kind, Locked: p.Locked, Source: p.Source}); err != nil {
		return fmt.Errorf("update preference: %w", err)
	}
	return nil
}

// revertObjective restores the objective ev's change found, with the source it had then (the
// user's, for a state stored before sources were kept: the user chose it back).
func (w *Workspace) revertObjective(ctx context.Context, tx db.DBTX, ev Event) (Change, error) {
	var before struct{ Text, Source string }
	if string(ev.Before) != "null" {
		if err := json.Unmarshal(ev.Before, &before); err != nil {
			return Change{}, fmt.Errorf("decode event: %w", err)
		}
	}
	before.Source = cmp.Or(before.Source, SourceUser)
	var current, currentSource string
	if o, err := w.store.q.ObjectiveGet(ctx, tx, w.threadID); err == nil {
		current, currentSource = o.Text, o.Source
	} else if err = db.NotFound(err); err != ErrNotFound {
		return Change{}, fmt.Errorf("get objective: %w", err)
	}
	if before.Text == "" {
		if _, err := w.store.q.ObjectiveDelete(ctx, tx, w.threadID); err != nil {
			return Change{}, fmt.Errorf("delete objective: %w", err)
		}
	} else if _, err := w.store.q.ObjectiveUpsert(ctx, tx, db.ObjectiveUpsertParams{ThreadID: w.threadID, Text: before.Text, UpdatedBy: ByUser,
		Source: before.Source}); err != nil {
		return Change{}, fmt.Errorf("set objective: %w", err)
	}
	return Change{target: ev.Target, before: ObjectiveSourced(current, currentSource), after: ObjectiveSourced(before.Text, before.Source)}, nil
}

func (w *Workspace) revertPreference(ctx context.Context, tx db.DBTX, ev Event, nextID int64, list []Preference) (Change, error) {
	c := Change{target: ev.Target}
	i := IndexOf(list, ev.Target.ID)
	if i >= 0 {
		c.before = PrefState(list[i])
	}
	if string(ev.Before) == "null" { // it was added: remove it
		if i >= 0 {
			if _, err := w.store.q.PreferenceDelete(ctx, tx, db.PreferenceDeleteParams{ThreadID: w.threadID, ID: ev.Target.ID}); err != nil {
				return Change{}, fmt.Errorf("delete preference: %w", err)
			}
		}
		return c, nil
	}
	var before struct {
		Title, Subtitle, Kind, Source string
		Locked                        bool
	}
	if err := json.Unmarshal(ev.Before, &before); err != nil {
		return Change{}, fmt.Errorf("decode event: %w", err)
	}
	p, err := w.checkedFields(PreferenceInput{Title: before.Title, Subtitle: before.Subtitle, Kind: before.Kind, Locked: before.Locked}, ev.Target.ID, list)
	if err != nil {
		return Change{}, err
	}
	// The source it had then; the user's for a state stored before sources were kept (the user
	// chose it back).
	p.Source = cmp.Or(before.Source, SourceUser)
	c.after = PrefState(p)
	if i >= 0 {
		return c, w.updatePreference(ctx, tx, p)
	}
	// It was removed: it comes back with its old id, in its old place.
	if max := w.store.limits.PreferencesMax; len(list) >= max {
		return Change{}, invalid("", "a thread holds at most %d preferences", max)
	}
	if _, err := w.store.q.PreferenceInsertBatch(ctx, tx, db.PreferenceInsertBatchParams{ThreadID: w.threadID, NextPreferenceID: nextID,
		Ids: []int64{p.ID}, Titles: []string{p.Title}, Subtitles: []string{p.Subtitle}, Kinds: []string{p.Kind}, Locks: []bool{p.Locked},
		Sources: []string{p.Source}}); err != nil {
		return Change{}, fmt.Errorf("restore preference: %w", err)
	}
	return c, nil
}

// Pruned counts what PruneHistory removed.
type Pruned struct{ Events, Snapshots, ToolCalls, ResponseTurns, ClientResponses int64 }

// PruneHistory removes the events, snapshots (but each thread's last, which still applies),
// tool-call records, Responses turns and clients' response records older than cutoff
// (HISTORY_RETENTION). A removed preference's text lives on in them until then; a response
// older than it can no longer be continued as a turn (nor at all, with client keys). Rows
// another transaction holds (a thread being deleted) are left to the next prune: it never waits
// on them, so it never deadlocks with a thread's DELETE.
func (s *Store) PruneHistory(ctx context.Context, cutoff time.Time) (_ Pruned, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	at := pgtype.Timestamptz{Time: cutoff, Valid: true}
	var p Pruned
	if p.Events, err = s.q.EventPrune(ctx, s.pool, at); err != nil {
		return p, fmt.Errorf("prune events: %w", err)
	}
	if p.Snapshots, err = s.q.SnapshotPrune(ctx, s.pool, at); err != nil {
		return p, fmt.Errorf("prune snapshots: %w", err)
	}
	if p.ToolCalls, err = s.q.ToolCallPrune(ctx, s.pool, at); err != nil {
		return p, fmt.Errorf("prune tool calls: %w", err)
	}
	if p.ResponseTurns, err = s.q.ResponseTurnPrune(ctx, s.pool, at); err != nil {
		return p, fmt.Errorf("prune response turns: %w", err)
	}
	if p.ClientResponses, err = s.q.ClientResponsePrune(ctx, s.pool, at); err != nil {
		return p, fmt.Errorf("prune client responses: %w", err)
	}
	return p, nil
}
