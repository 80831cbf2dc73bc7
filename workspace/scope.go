package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wsproxy/wsproxy/db"
)

// Scopes (docs/spec.md §17): a thread's parents are other threads, whose preferences it inherits,
// nearest first. Nothing is stored twice: a turn reads its ancestors with its thread
// (turn_start), the user path with ThreadScopeGet.

// MaxAncestors bounds the ancestors of a thread, its parents' parents included.
const MaxAncestors = 8

// MaxParentsBytes bounds a list of parents as a request carries it (a header's values, an admin
// body), checked before the list is split or decoded: MaxAncestors stored ids (a client's name,
// '~', a thread's 128 characters), each character JSON-escaped, with room for spaces.
const MaxParentsBytes = 16 << 10

// ErrTooManyParents and ErrParentsTooLong refuse a list of parents before its names are read: more
// than MaxAncestors names (each a parent: more ancestors than MaxAncestors, or a name twice), or
// more than MaxParentsBytes bytes.
var (
	ErrTooManyParents = &ParentsError{Reason: fmt.Sprintf("more than %d ancestors (at most %d parents)", MaxAncestors, MaxAncestors)}
	ErrParentsTooLong = &ParentsError{Reason: fmt.Sprintf("the list is longer than %d bytes", MaxParentsBytes)}
)

// Review settings (agent_writes): the tools write, or every change a tool would make becomes a
// proposal the user decides.
const (
	AgentWritesDirect  = "direct"
	AgentWritesPropose = "propose"
)

// Scope is what one ancestor gives a thread: its preferences, in its own order. Thread is its
// stored id; Shared says that it is a workspace the admin shared with the thread's client
// (docs/spec.md §20); in JSON, scope is its name as the thread's client names it (Name).
type Scope struct {
	Thread      ThreadID     `json:"-"`
	Shared      bool         `json:"-"`
	Preferences []Preference `json:"preferences"`
}

// Name is the ancestor as the thread's client names it: its id, or ~id for a shared scope.
func (s Scope) Name() string {
	if s.Shared {
		return SharedPrefix + s.Thread.Name
	}
	return s.Thread.Name
}

// MarshalJSON writes {scope, preferences}, scope the ancestor's id as its client names it.
func (s Scope) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Scope       string       `json:"scope"`
		Preferences []Preference `json:"preferences"`
	}{s.Name(), s.Preferences})
}

// ParentsError: a list of parents that cannot be stored (a cycle, a thread of its own, more than
// MaxAncestors ancestors, a name given twice, another client's thread).
type ParentsError struct{ Reason string }

func (e *ParentsError) Error() string { return "invalid parents: " + e.Reason }

// decodeInherited reads what turn_start or ThreadScopeGet gave of the ancestors of a thread of
// client ("" for none) (nil for none): an ancestor outside every client's namespace is, for a
// client's thread, a shared scope.
func decodeInherited(b []byte, client string) ([]Scope, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var stored []struct {
		Scope       string          `json:"scope"`
		Preferences json.RawMessage `json:"preferences"`
	}
	if err := json.Unmarshal(b, &stored); err != nil {
		return nil, fmt.Errorf("decode inherited preferences: %w", err)
	}
	out := make([]Scope, 0, len(stored))
	for _, s := range stored {
		id, err := ParseThreadID(s.Scope)
		if err != nil {
			return nil, fmt.Errorf("decode inherited preferences: scope %q: %w", s.Scope, err)
		}
		prefs, err := decodeSnapshotPreferences(s.Preferences)
		if err != nil {
			return nil, err
		}
		out = append(out, Scope{Thread: id, Shared: client != "" && id.Client == "", Preferences: prefs})
	}
	return out, nil
}

// shownInherited is what a thread's block shows of what its ancestors give: each ancestor's
// preferences but those whose title equals one nearer (the thread's own list included), and only
// the ancestors left with some. A locked one is shown whatever is nearer: no title of the
// thread's, nor of a nearer scope, hides what the user locked (docs/spec.md §19).
func shownInherited(own []Preference, inherited []Scope) []Scope {
	if len(inherited) == 0 {
		return nil
	}
	seen := make(map[string]bool, len(own))
	for _, p := range own {
		seen[normalizeTitle(p.Title)] = true
	}
	var out []Scope
	for _, s := range inherited {
		var kept []Preference
		for _, p := range s.Preferences {
			k := normalizeTitle(p.Title)
			if seen[k] && !p.Locked {
				continue
			}
			seen[k] = true
			kept = append(kept, p)
		}
		if len(kept) > 0 {
			out = append(out, Scope{Thread: s.Thread, Shared: s.Shared, Preferences: kept})
		}
	}
	return out
}

// inheritedCache keeps what a turn start's ancestors gave, decoded and as the block shows it, by
// the bytes it came as (with the thread's own list, which decides what is shown): a turn start
// returns its snapshot's bytes unchanged while neither the thread nor an ancestor changed, so the
// turns of a thread with parents decode nothing of them. It holds maxInheritedCached bytes of
// keys at most (the lists they decode to are smaller), and starts again empty when full.
type inheritedCache struct {
	mu    sync.Mutex
	m     map[string][]Scope
	bytes int
}

const maxInheritedCached = 4 << 20

// shown is shownInherited(own, decodeInherited(raw, client)), from the cache when it was seen;
// rawOwn are the bytes own was decoded from.
func (c *inheritedCache) shown(raw, rawOwn []byte, own []Preference, client string) ([]Scope, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	key := client + "\x00" + string(raw) + "\x00" + string(rawOwn)
	c.mu.Lock()
	s, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return s, nil
	}
	inherited, err := decodeInherited(raw, client)
	if err != nil {
		return nil, err
	}
	s = shownInherited(own, inherited)
	if len(key) > maxInheritedCached/16 { // too large to keep: decoded each time
		return s, nil
	}
	c.mu.Lock()
	if c.m == nil || c.bytes+len(key) > maxInheritedCached {
		c.m, c.bytes = make(map[string][]Scope), 0
	}
	c.m[key] = s
	c.bytes += len(key)
	c.mu.Unlock()
	return s, nil
}

// FindInherited is the scope of the inherited preference whose title equals title, if any.
func FindInherited(inherited []Scope, title string) (Scope, Preference, bool) {
	key := normalizeTitle(title)
	for _, s := range inherited {
		for _, p := range s.Preferences {
			if normalizeTitle(p.Title) == key {
				return s, p, true
			}
		}
	}
	return Scope{}, Preference{}, false
}

// ScopeInfo is a thread's place among its scopes, as the user path shows it.
type ScopeInfo struct {
	Parents []ThreadID
	// Inherited is what the ancestors give, nearest first, as the block shows it (titles the
	// thread or a nearer scope has are left out).
	Inherited []Scope
	// AgentWrites is the review setting in force; OwnAgentWrites the thread's own ("" when it
	// inherits it).
	AgentWrites, OwnAgentWrites string
	// UntrustedWrites is the untrusted_writes in force ("": the deployment's); OwnUntrustedWrites
	// the thread's own ("" when it inherits it) (docs/spec.md §19).
	UntrustedWrites, OwnUntrustedWrites string
	// InheritedBy: other threads name this one among their parents (a write to it reaches them).
	InheritedBy bool
}

// scopeOf reads the thread's parents, ancestors and review setting on q. ErrNotFound when the
// thread does not exist.
func (w *Workspace) scopeOf(ctx context.Context, q db.DBTX, own []Preference) (ScopeInfo, error) {
	r, err := w.store.q.ThreadScopeGet(ctx, q, w.threadID)
	if err != nil {
		return ScopeInfo{}, db.NotFound(err)
	}
	return scopeFrom(r, own, w.id.Client)
}

// scopeFrom is the place among its scopes that r says, for a thread of client whose own list is
// own.
func scopeFrom(r db.ThreadScopeGetRow, own []Preference, client string) (ScopeInfo, error) {
	inherited, err := decodeInherited(r.Inherited, client)
	if err != nil {
		return ScopeInfo{}, err
	}
	info := ScopeInfo{Inherited: shownInherited(own, inherited), AgentWrites: r.AgentWrites, OwnAgentWrites: r.OwnAgentWrites.String,
		UntrustedWrites: r.UntrustedWrites, OwnUntrustedWrites: r.OwnUntrustedWrites.String, InheritedBy: r.InheritedBy}
	for _, p := range r.Parents {
		id, err := ParseThreadID(p)
		if err != nil {
			return ScopeInfo{}, fmt.Errorf("decode parents: %q: %w", p, err)
		}
		info.Parents = append(info.Parents, id)
	}
	return info, nil
}

// Ancestor is one of a thread's ancestors as a live view of the thread watches it: its id, and
// its last event id (0 for none, or one that does not exist).
type Ancestor struct {
	Thread      ThreadID
	LastEventID int64
}

// Ancestors lists the thread's ancestors, nearest first, as its next turn would read them (none
// for a thread that does not exist): a change in one of them is a change of what the thread
// inherits (docs/spec.md §17).
func (w *Workspace) Ancestors(ctx context.Context) (_ []Ancestor, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	r, err := w.store.q.ThreadAncestorVersions(ctx, w.store.pool, w.threadID)
	if err = db.NotFound(err); err != nil {
		if errors.Is(err, db.ErrNotFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("read ancestors: %w", err)
	}
	out := make([]Ancestor, len(r.Ancestors))
	for i, a := range r.Ancestors {
		id, err := ParseThreadID(a)
		if err != nil {
			return nil, fmt.Errorf("decode ancestor %q: %w", a, err)
		}
		out[i] = Ancestor{Thread: id, LastEventID: max(r.Versions[i]-1, 0)}
	}
	return out, nil
}

// storedParents checks parents for the thread: each in the thread's client namespace, or, for a
// client's thread, a workspace outside every client's namespace (a shared scope: whether it is
// shared with the client, the store says as it stores them, docs/spec.md §20). Another client's
// is ErrNotFound: it does not exist for this one.
func (w *Workspace) storedParents(parents []ThreadID) ([]string, error) {
	out := make([]string, len(parents))
	for i, p := range parents {
		if p.Client != w.id.Client && p.Client != "" {
			return nil, ErrNotFound
		}
		out[i] = p.String()
	}
	return out, nil
}

// notSharedRefusal begins the reason thread_set_parents (migration 022) gives for a parent
// outside the thread's client namespace that is not shared with its client: for that client
// it does not exist (ErrNotFound), and nothing was created.
const notSharedRefusal = "not shared: "

// parentsRefused is the error of a list of parents the store refused for reason.
func parentsRefused(reason string) error {
	if strings.HasPrefix(reason, notSharedRefusal) {
		return ErrNotFound
	}
	return &ParentsError{Reason: reason}
}

// SetParents stores the thread's parents, nearest first, as a user change (the thread and each
// parent created when new), with a parents_set event when they differ from the stored ones. A
// *ParentsError for a list that cannot be stored; ErrNotFound for another client's thread.
//
// Two changes of parents that would make a cycle together take turns (the keys of migration 017,
// taken before the thread's row): the later one sees the earlier's list, and is refused. One that
// Postgres rolls back for a race all the same (db.Retryable) is tried again, at most
// maxParentsAttempts times in all.
func (w *Workspace) SetParents(ctx context.Context, parents []ThreadID) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	stored, err := w.storedParents(parents)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err = w.setParents(ctx, stored)
		if attempt == maxParentsAttempts || !db.Retryable(err) {
			return err
		}
	}
}

// maxParentsAttempts bounds the tries of a change of parents that races another.
const maxParentsAttempts = 3

// setParents is one try of SetParents, stored the parents' stored ids.
func (w *Workspace) setParents(ctx context.Context, stored []string) error {
	tx, err := db.BeginParentsLocked(ctx, w.store.pool, w.threadID, stored)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	refused, err := w.store.q.ThreadSetParents(ctx, tx.Conn(), db.ThreadSetParentsParams{ID: w.threadID, Parents: stored, Actor: ByUser, Via: ViaAdmin})
	if err != nil {
		return fmt.Errorf("set parents: %w", err)
	}
	if refused != "" {
		return parentsRefused(refused)
	}
	return tx.Commit(ctx, nil)
}

// Children lists the threads that name this one among their parents, by id, after the cursor
// ("" for none).
func (w *Workspace) Children(ctx context.Context, after string, limit int) (_ []ThreadID, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if err := w.exists(ctx); err != nil {
		return nil, err
	}
	rows, err := w.store.q.ThreadChildren(ctx, w.store.pool, db.ThreadChildrenParams{ID: w.threadID, AfterID: after, MaxRows: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("list children: %w", err)
	}
	out := make([]ThreadID, 0, len(rows))
	for _, r := range rows {
		id, err := ParseThreadID(r)
		if err != nil {
			return nil, fmt.Errorf("decode child %q: %w", r, err)
		}
		out = append(out, id)
	}
	return out, nil
}

// SetAgentWrites sets the thread's own review setting (AgentWritesDirect, AgentWritesPropose, or
// "": as its nearest ancestor's), as a user change with an agent_writes_set event when it
// changes. ErrNotFound when the thread does not exist.
func (w *Workspace) SetAgentWrites(ctx context.Context, mode string) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	switch mode {
	case "", AgentWritesDirect, AgentWritesPropose:
	default:
		return invalid("agent_writes", `must be "direct", "propose" or null`)
	}
	_, err = w.locked(ctx, db.LockThreadTouch, func(tx db.DBTX, _ int64, _ []Preference) ([]Change, error) {
		r, err := w.store.q.ThreadGet(ctx, tx, w.threadID)
		if err != nil {
			return nil, db.NotFound(err)
		}
		if r.AgentWrites.String == mode {
			return nil, nil
		}
		if err := w.store.q.ThreadSetAgentWrites(ctx, tx, db.ThreadSetAgentWritesParams{ID: w.threadID,
			AgentWrites: pgtype.Text{String: mode, Valid: mode != ""}}); err != nil {
			return nil, fmt.Errorf("set agent_writes: %w", err)
		}
		return []Change{{kind: AgentWritesSet, target: Target{Type: TargetThread},
			before: agentWritesState(r.AgentWrites.String), after: agentWritesState(mode)}}, nil
	})
	return err
}

// SetUntrustedWrites sets the thread's own untrusted_writes (UntrustedPropose, UntrustedApply,
// UntrustedRefuse, or "": as its nearest ancestor's, else the deployment's; docs/spec.md §19), as
// a user change with an untrusted_writes_set event when it changes. ErrNotFound when the thread
// does not exist.
func (w *Workspace) SetUntrustedWrites(ctx context.Context, mode string) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	switch mode {
	case "", UntrustedPropose, UntrustedApply, UntrustedRefuse:
	default:
		return invalid("untrusted_writes", `must be "propose", "apply", "refuse" or null`)
	}
	_, err = w.locked(ctx, db.LockThreadTouch, func(tx db.DBTX, _ int64, _ []Preference) ([]Change, error) {
		r, err := w.store.q.ThreadGet(ctx, tx, w.threadID)
		if err != nil {
			return nil, db.NotFound(err)
		}
		if r.UntrustedWrites.String == mode {
			return nil, nil
		}
		if err := w.store.q.ThreadSetUntrustedWrites(ctx, tx, db.ThreadSetUntrustedWritesParams{ID: w.threadID,
			UntrustedWrites: pgtype.Text{String: mode, Valid: mode != ""}}); err != nil {
			return nil, fmt.Errorf("set untrusted_writes: %w", err)
		}
		return []Change{{kind: UntrustedWritesSet, target: Target{Type: TargetThread},
			before: settingState("untrusted_writes", r.UntrustedWrites.String), after: settingState("untrusted_writes", mode)}}, nil
	})
	return err
}

// SharedEveryone in a list of clients a workspace is shared with names every client.
const SharedEveryone = "*"

// SetSharedWith sets the clients this workspace is shared with (docs/spec.md §20): client names,
// or SharedEveryone alone for every client; none unshares it. Only a workspace outside every
// client's namespace (the admin's) can be shared. A user change, with a shared_with_set event when
// it changes (so that the threads that inherit it find a new version at their next turn).
// ErrNotFound when the thread does not exist; a *ValidationError for a client's thread or a
// name that is not a client's.
func (w *Workspace) SetSharedWith(ctx context.Context, clients []string) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if w.id.Client != "" {
		return invalid("shared_with", "only a workspace outside every client's namespace (the admin's) can be shared; %s is client %s's", w.id.Name, w.id.Client)
	}
	want := make([]string, 0, len(clients))
	for _, c := range clients {
		switch {
		case c == SharedEveryone && len(clients) > 1:
			return invalid("shared_with", `"*" shares with every client: it stands alone`)
		case c != SharedEveryone && !ValidClientName(c):
			return invalid("shared_with", "%q: %s", c, ErrInvalidClient.Error())
		}
		if !slices.Contains(want, c) {
			want = append(want, c)
		}
	}
	slices.Sort(want)
	_, err = w.locked(ctx, db.LockThreadTouch, func(tx db.DBTX, _ int64, _ []Preference) ([]Change, error) {
		r, err := w.store.q.ThreadGet(ctx, tx, w.threadID)
		if err != nil {
			return nil, db.NotFound(err)
		}
		before := r.SharedWith
		if before == nil {
			before = []string{}
		}
		if slices.Equal(before, want) {
			return nil, nil
		}
		if err := w.store.q.ThreadSetSharedWith(ctx, tx, db.ThreadSetSharedWithParams{ID: w.threadID, SharedWith: want}); err != nil {
			return nil, fmt.Errorf("set shared_with: %w", err)
		}
		return []Change{{kind: SharedWithSet, target: Target{Type: TargetThread},
			before: sharedWithState(before), after: sharedWithState(want)}}, nil
	})
	return err
}

// sharedWithState is a workspace's sharing as its events show it: {"shared_with": [...]}.
func sharedWithState(clients []string) []byte {
	b, _ := json.Marshal(struct {
		SharedWith []string `json:"shared_with"`
	}{clients})
	return b
}

// SharedWithClient reports whether this workspace is one outside every client's namespace that
// is shared with client (docs/spec.md §20); false for one that does not exist.
func (w *Workspace) SharedWithClient(ctx context.Context, client string) (_ bool, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if w.id.Client != "" || client == "" {
		return false, nil
	}
	shared, err := w.store.q.ThreadSharedWith(ctx, w.store.pool, db.ThreadSharedWithParams{ID: w.threadID, Client: client})
	if err != nil {
		return false, fmt.Errorf("read shared_with: %w", err)
	}
	return shared, nil
}

// settingState is a thread's setting as its events show it: {name: mode}, null for an inherited
// one.
func settingState(name, mode string) []byte {
	v := []byte("null")
	if mode != "" {
		v, _ = json.Marshal(mode)
	}
	k, _ := json.Marshal(name)
	return []byte("{" + string(k) + ":" + string(v) + "}")
}

// agentWritesState is a review setting as its events show it: {"agent_writes": mode}, null for
// an inherited one.
func agentWritesState(mode string) []byte {
	if mode == "" {
		return []byte(`{"agent_writes":null}`)
	}
	b, _ := json.Marshal(struct {
		AgentWrites string `json:"agent_writes"`
	}{mode})
	return b
}

// MovePreference moves preference id of this thread to the thread to (a scope, usually), as a
// user change: removed here and added there with its fields and lock, one preference_moved
// event in each workspace. It returns the preference as it now stands in to. ErrNotFound for an
// unknown preference, or a destination of another client; a *DuplicateError when to already
// has its title; a *ValidationError past to's limits.
func (w *Workspace) MovePreference(ctx context.Context, id int64, to ThreadID) (_ Preference, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if to.Client != w.id.Client { // another client's thread, or a shared scope: read-only to a client
		return Preference{}, ErrNotFound
	}
	if to == w.id {
		return Preference{}, invalid("to", "is the thread the preference is in")
	}
	dest := w.store.Workspace(to)
	// The source must exist; the destination is created when new. Both rows are locked in id
	// order, so that two moves between the same threads, in opposite directions, never deadlock.
	firstID, firstLock, secondID, secondLock := w.threadID, db.LockThreadTouch, dest.threadID, db.LockThreadUpsert
	if dest.threadID < w.threadID {
		firstID, firstLock, secondID, secondLock = secondID, secondLock, firstID, firstLock
	}
	tx, err := db.BeginLocked(ctx, w.store.pool, firstLock, firstID, false)
	if err != nil {
		return Preference{}, err
	}
	defer tx.Rollback(ctx)
	second, err := tx.LockAlso(ctx, secondLock, secondID)
	if err != nil {
		return Preference{}, err
	}
	source, target := tx.LockedThread, second
	if firstID != w.threadID {
		source, target = second, tx.LockedThread
	}
	src, dst := fromRows(source.Preferences), fromRows(target.Preferences)
	i := IndexOf(src, id)
	if i < 0 {
		return Preference{}, ErrNotFound
	}
	p := src[i]
	if existing, ok := findTitle(dst, p.Title, 0); ok {
		return Preference{}, &DuplicateError{Existing: existing}
	}
	if len(dst) >= w.store.limits.PreferencesMax {
		return Preference{}, invalid("to", "%s already holds %d preferences, the most a thread may", to.Name, w.store.limits.PreferencesMax)
	}
	if _, err := w.store.q.PreferenceDelete(ctx, tx.Conn(), db.PreferenceDeleteParams{ThreadID: w.threadID, ID: id}); err != nil {
		return Preference{}, fmt.Errorf("delete preference: %w", err)
	}
	added, err := dest.insert(ctx, tx.Conn(), target.NextPreferenceID, []Preference{p})
	if err != nil {
		return Preference{}, err
	}
	moved := fromRow(len(dst)+1, added[0])
	how := movedState(w.threadID, dest.threadID)
	out := Change{kind: PreferenceMoved, target: Target{Type: TargetPreference, ID: p.ID}, before: PrefState(p), moved: how}
	in := Change{kind: PreferenceMoved, target: Target{Type: TargetPreference, ID: moved.ID}, after: PrefState(moved), moved: how}
	err = tx.Commit(ctx, func(b *pgx.Batch) {
		db.QueueEventInsert(b, w.eventParams(ByUser, ViaAdmin, []Change{out}), nil)
		db.QueueEventInsert(b, dest.eventParams(ByUser, ViaAdmin, []Change{in}), nil)
	})
	if err != nil {
		return Preference{}, err
	}
	return moved, nil
}

// movedState is a move as its events show it: {"from", "to"}, the threads' stored ids.
func movedState(from, to string) []byte {
	b, _ := json.Marshal(struct {
		From string `json:"from"`
		To   string `json:"to"`
	}{from, to})
	return b
}

// AnsweredError: a proposal applied or dismissed already, or replaced by a newer one.
type AnsweredError struct {
	By   int64  // the event that answered it
	Kind string // that event's kind
}

func (e *AnsweredError) Error() string {
	switch e.Kind {
	case ProposalDismissed:
		return fmt.Sprintf("this proposal was dismissed (event %d)", e.By)
	case Proposed: // a newer objective proposal replaced it (docs/spec.md §17)
		return fmt.Sprintf("this proposal was replaced by a newer one (event %d)", e.By)
	}
	return fmt.Sprintf("this proposal was applied already (event %d)", e.By)
}

// answered is the *AnsweredError of proposal id when an event answered it, else nil.
func (w *Workspace) answered(ctx context.Context, tx db.DBTX, id int64) error {
	r, err := w.store.q.EventAnswer(ctx, tx, db.EventAnswerParams{ThreadID: w.threadID, Proposal: pgtype.Int8{Int64: id, Valid: true}})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the proposal's answer: %w", err)
	}
	return &AnsweredError{By: r.ID, Kind: r.Kind}
}

// DismissProposal dismisses the pending proposal event id (review mode's, or a locked item's), as
// a user change: a proposal_dismissed event answers it, nothing else changes, and it can never be
// applied. ErrNotFound for an unknown thread or event; a *ValidationError for an event that is
// not a proposal; an *AnsweredError for one applied or dismissed already.
func (w *Workspace) DismissProposal(ctx context.Context, id int64) (Event, error) {
	return w.changeOnEvent(ctx, id, func(tx db.DBTX, ev Event, _ int64, _ []Preference) (Change, error) {
		if !ev.isProposal() {
			return Change{}, errNotAProposal
		}
		if err := w.answered(ctx, tx, id); err != nil {
			return Change{}, err
		}
		return Change{kind: ProposalDismissed, target: ev.Target, answers: id}, nil
	})
}

// PendingProposals lists the thread's proposals no event answered yet, oldest first.
func (w *Workspace) PendingProposals(ctx context.Context, limit int) (_ []Event, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if err := w.exists(ctx); err != nil {
		return nil, err
	}
	rows, err := w.store.q.EventPendingProposals(ctx, w.store.pool, db.EventPendingProposalsParams{ThreadID: w.threadID, MaxRows: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("list proposals: %w", err)
	}
	out := make([]Event, len(rows))
	for i, r := range rows {
		out[i] = fromEvent(r)
	}
	return out, nil
}
