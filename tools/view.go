package tools

import "time"

// View is the list of preferences as the model was shown it for the current round of a turn
// (docs/spec.md §5): the positions its indices name, each with the preference's stable id and
// the fields shown. A turn's first round shows the list of its start (NewView: the block); a
// list_preferences call shows the list as it stands, for the calls after it in the round;
// NextRound moves on to the list as the round's calls left it (the list the last call's
// transaction read, with that call's changes: no read of its own). Every call of a round
// resolves all its indices against the view up front and acts on the ids behind them; a
// preference removed or changed (title, subtitle or kind) since it was shown, other than by the
// round's own calls, is reported, never replaced by another. A view belongs to one thread: once
// the thread is deleted (even if created again under its id), its calls run against nothing.
//
// The calls of a turn run one after the other: a View is not for concurrent use.
type View struct {
	created time.Time    // the thread's creation (TurnStart.Created); zero: any
	shown   []Preference // the round's list, in the order shown
	// own holds what the round's calls did to preferences of shown: the state they left, nil
	// for one they removed.
	own  map[int64]*Preference
	next []Preference // the list as the latest call left it: the next round's
	// inherited is what the thread's ancestors gave, as the model was shown it (docs/spec.md
	// §17); propose is review mode: every change a tool would make is a proposal.
	inherited []Scope
	propose   bool
}

// NewView is the view of a turn's first round: the list its start showed the model.
func NewView(start TurnStart) *View {
	return &View{created: start.Created, shown: start.Preferences, next: start.Preferences,
		inherited: start.Inherited, propose: start.AgentWrites == AgentWritesPropose}
}

// NextRound moves the view on to the next round: the list as the last call left it.
func (v *View) NextRound() {
	v.shown, v.own = v.next, nil
}

// viewOf is the view of a call made outside a turn: the list as the call finds it.
func viewOf(current []Preference) *View { return &View{shown: current, next: current} }

// show is a list_preferences call: the model is shown current.
func (v *View) show(current []Preference) {
	v.shown, v.own, v.next = current, nil, current
}

// ran records what a call left: the list after it, and the preferences it changed or removed.
func (v *View) ran(after []Preference, touched []int64) {
	v.next = after
	if len(touched) == 0 {
		return
	}
	if v.own == nil {
		v.own = make(map[int64]*Preference, len(touched))
	}
	for _, id := range touched {
		v.own[id] = nil
		if i := indexOf(after, id); i >= 0 {
			p := after[i]
			v.own[id] = &p
		}
	}
}

// resolve sorts a call's indices (in the order given, each once) into the preferences of current
// they name through the view (open and locked, as they stand, with the index shown), those
// removed or changed since they were shown (as shown), and those out of range.
func (v *View) resolve(current []Preference, indices []int) targets {
	t := targets{before: make(map[int64]Preference, len(current))}
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
