package tools

import (
	"time"

	"github.com/wsproxy/wsproxy/workspace"
)

// View is the list of preferences as the model was shown it for the current round of a turn
// (docs/spec.md §5): the positions its indices name, each with the preference's stable id and
// the fields shown. A turn's first round shows the list of its start (NewView: the block); a
// list_preferences call shows the list as it stands, for the calls after it in the round;
// NextRound moves on to what the model saw by the round's end: the round's view with the
// round's own calls applied (what their results told it), never an edit of the user's or of
// another turn that committed meanwhile, which the model was not shown. Every call of a round
// resolves all its indices against the view up front and acts on the ids behind them; a
// preference removed or changed (title, subtitle or kind) since it was shown, other than by the
// model's own calls, is reported, never replaced by another. A view belongs to one thread: once
// the thread is deleted (even if created again under its id), its calls run against nothing.
//
// The calls of a turn run one after the other: a View is not for concurrent use.
type View struct {
	created time.Time              // the thread's creation (TurnStart.Created); zero: any
	shown   []workspace.Preference // the round's list, in the order shown
	// own holds what the round's calls did to preferences of shown: the state they left, nil
	// for one they removed.
	own map[int64]*workspace.Preference
	// next is the list as the model knows it after the round's calls so far: shown with their
	// changes applied (a preference it added at the end). The next round's view.
	next []workspace.Preference
	// inherited is what the thread's ancestors gave, as the model was shown it (docs/spec.md
	// §17); propose is review mode: every change a tool would make is a proposal.
	inherited []workspace.Scope
	propose   bool
	// knows is the workspace as the turn's start or its last call left it, on which its next
	// call is planned (the call checks that it still stands); nil: not known, the call reads it.
	knows *workspace.State
	// readingOf is what the turn's model read (SetReading), read into read at the turn's first
	// write, with taints, what its rounds brought (Taint); start is what the turn's start said of
	// the thread; ungrounded: a write of the turn was not grounded, and no later one is
	// (docs/spec.md §19).
	readingOf  func() workspace.Reading
	read       *workspace.Reading
	taints     []workspace.Part
	start      threadPast
	ungrounded bool
	// scope is the workspace's untrusted_writes and whether other threads inherit it, read
	// under the thread's lock for the call being planned (nil: not read); source is the source
	// the call's writes give (writeSource).
	scope  *workspace.ScopeInfo
	source string
}

// threadPast is what a turn's start said of its thread (docs/spec.md §19): an earlier turn read
// untrusted content, or carried the client's own tools; the block shows an unconfirmed item.
type threadPast struct {
	tainted, clientTools, unconfirmed bool
}

// NewView is the view of a turn's first round: the list its start showed the model.
func NewView(start workspace.TurnStart) *View {
	v := &View{created: start.Created, shown: start.Preferences, next: start.Preferences,
		inherited: start.Inherited, propose: start.AgentWrites == workspace.AgentWritesPropose,
		start: threadPast{tainted: start.Tainted, clientTools: start.ClientTools, unconfirmed: start.ShowsUnconfirmed()}}
	if start.Version > 0 {
		v.knows = &workspace.State{Created: start.Created, Version: start.Version, NextID: start.NextPreferenceID,
			Objective: start.Objective, ObjectiveSource: start.ObjectiveSource, List: start.Preferences}
	}
	return v
}

// known is the workspace the view's next call is planned on; nil for none (or no view).
func (v *View) known() *workspace.State {
	if v == nil {
		return nil
	}
	return v.knows
}

// after is the workspace as a call planned on s (out) leaves it, once its statements committed.
func after(s workspace.State, out toolOutput) workspace.State {
	s.Version += int64(len(out.write.Changes))
	s.Book = nil
	if out.write.NextID != 0 {
		s.NextID = out.write.NextID
	}
	if out.write.Objective != nil {
		s.Objective, s.ObjectiveSource = *out.write.Objective, out.write.ObjectiveSource
	}
	s.List = applied(s.List, out.kept, out.removed)
	return s
}

// NextRound moves the view on to the next round: the round's view with its calls applied.
func (v *View) NextRound() {
	v.shown, v.own = v.next, nil
}

// viewOf is the view of a call made outside a turn: the list as the call finds it.
func viewOf(current []workspace.Preference) *View { return &View{shown: current, next: current} }

// show is a list_preferences call: the model is shown current.
func (v *View) show(current []workspace.Preference) {
	v.shown, v.own, v.next = current, nil, current
}

// ran records what a call did: the preferences it added or changed, as it left them, and those
// it removed. The model's list moves on with them alone.
func (v *View) ran(kept []workspace.Preference, removed []int64) {
	if len(kept) == 0 && len(removed) == 0 {
		return
	}
	if v.own == nil {
		v.own = make(map[int64]*workspace.Preference, len(kept)+len(removed))
	}
	for _, id := range removed {
		v.own[id] = nil
	}
	for _, p := range kept {
		v.own[p.ID] = &p
	}
	v.next = applied(v.next, kept, removed)
}

// applied is a copy of list (which stays as it was) without the preferences of removed, and with
// those of kept in place of theirs (by id) or, new, at its end; indexed anew.
func applied(list, kept []workspace.Preference, removed []int64) []workspace.Preference {
	if len(kept) == 0 && len(removed) == 0 {
		return list
	}
	next := without(list, removed)
	for _, p := range kept {
		if i := workspace.IndexOf(next, p.ID); i >= 0 {
			p.Index = i + 1
			next[i] = p
		} else {
			p.Index = len(next) + 1
			next = append(next, p)
		}
	}
	return next
}

// resolve sorts a call's indices (in the order given, each once) into the preferences of current
// they name through the view (open and locked, as they stand, with the index shown), those
// removed or changed since they were shown (as shown), and those out of range.
func (v *View) resolve(current []workspace.Preference, indices []int) targets {
	t := targets{before: make(map[int64]workspace.Preference, len(current))}
	for _, p := range current {
		t.before[p.ID] = p
	}
	seen := make(map[int]bool, len(indices))
	for _, i := range indices {
		if seen[i] {
			continue
		}
		seen[i] = true
		if i > len(v.shown) {
			t.outOfRange = append(t.outOfRange, i)
			continue
		}
		shown := v.shown[i-1]
		want := shown
		if o, ok := v.own[shown.ID]; ok {
			if o == nil {
				t.changed = append(t.changed, shown)
				continue
			}
			want = *o
		}
		p, ok := t.before[shown.ID]
		if !ok || p.Title != want.Title || p.Subtitle != want.Subtitle || p.Kind != want.Kind {
			t.changed = append(t.changed, shown)
			continue
		}
		p.Index = i
		if p.Locked {
			t.locked = append(t.locked, p)
		} else {
			t.open = append(t.open, p)
		}
	}
	return t
}
