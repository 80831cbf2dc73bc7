package tools

import (
	"cmp"
	"encoding/json"
	"strings"

	"github.com/wsproxy/wsproxy/workspace"
)

// Provenance (docs/spec.md §19): an agent's write in a turn that read content the user did not
// write applies only when the user's own words ground it; otherwise the workspace's
// untrusted_writes decides — a proposal (the default), a write marked unconfirmed, or nothing.
// Every MCP call counts as tainted. Pure: the decision is part of the call's plan, made on the
// workspace as the call finds it, the view of the turn and what the turn read.

// Outcomes of a tainted turn's write (Result.Untrusted, wsproxy_untrusted_writes_total).
const (
	OutcomeGrounded    = "grounded"
	OutcomeProposed    = "proposed"
	OutcomeUnconfirmed = "unconfirmed"
	OutcomeRefused     = "refused"
	OutcomeOverLimit   = "over_limit"
)

// The rules a write that is not grounded failed first (WriteContext.Rule, in the events' context:
// what the panel and the poisoning scorecard report a write by).
const (
	// RuleMCP: a write over MCP, which no user message vouches for.
	RuleMCP = "mcp"
	// RuleAfterUngrounded: a write of a turn after its first ungrounded one.
	RuleAfterUngrounded = "after_ungrounded"
	// RuleInheritedBy: a write to a workspace other threads inherit.
	RuleInheritedBy = "inherited_by"
	// RuleUsersItem: a change of an item or objective the user wrote or confirmed.
	RuleUsersItem = "users_item"
	// RuleWords: a token it writes, adds or deletes is not among the user's last two messages.
	RuleWords = "words"
	// RuleNaming: a removal or change of kind of an item the user's last message does not name.
	RuleNaming = "naming"
)

// Results of a write that waits for the user, or that was not made.
const (
	proposedUntrusted = "proposed; the user will review it (this turn read content the user did not write)"
	refusedUntrusted  = "not recorded: this turn read content the user did not write; the user can add it in the panel"
)

// SetReading has the view's calls read what the turn's model read (docs/spec.md §19): reading is
// called at the turn's first write, not before. What the turn's start says of the thread (an
// earlier turn tainted it, or carried the client's tools; its block shows an unconfirmed item)
// is added to it then.
func (v *View) SetReading(reading func() workspace.Reading) { v.readingOf = reading }

// Taint adds to what the turn read an untrusted part a round of it brought (a server tool's
// result, an item or block of a type wsproxy does not know): its later writes are tainted.
func (v *View) Taint(p workspace.Part) {
	v.taints = append(v.taints, p)
	if v.read != nil {
		v.read.Read(p)
	}
}

// Tainted reports whether the turn's writes are tainted: what it read, and what the thread had.
func (v *View) Tainted() bool { return v != nil && v.reading(Call{}).Tainted }

// reading is what the call's turn read: over MCP, content no one vouches for; in a turn, what
// SetReading gives (nothing untrusted without it), and what the thread's start says.
func (v *View) reading(c Call) *workspace.Reading {
	if c.via() == workspace.ViaMCP {
		return &workspace.Reading{Tainted: true, Sources: []workspace.Source{{Type: workspace.SourceMCP, Count: 1}},
			Nearest: &workspace.Part{Type: workspace.SourceMCP}}
	}
	if v.read == nil {
		r := workspace.Reading{}
		if v.readingOf != nil {
			r = v.readingOf()
		}
		// An earlier turn read untrusted content (the client may have dropped it since), the
		// client dropped the tools its earlier turns carried, or the block shows what an
		// untrusted write left: the turn is tainted by the thread's past.
		if !r.Tainted && (v.start.tainted || (v.start.clientTools && !r.ClientTools) || v.start.unconfirmed) {
			r.Read(workspace.Part{Type: workspace.SourceEarlierTurn})
		}
		for _, p := range v.taints {
			r.Read(p)
		}
		v.read = &r
	}
	return v.read
}

// writes reports whether a plan changes the workspace.
func (out toolOutput) writes() bool {
	w := out.write
	return len(w.Insert)+len(w.Update)+len(w.Delete) > 0 || w.Objective != nil
}

// untrusted decides a planned write (docs/spec.md §19). In a turn that is not tainted it applies
// as planned, the agent's. In a tainted one (every MCP call), with the workspace's settings known
// (else the call is planned again once they are read: out.needsScope), a grounded write applies;
// any other is what untrusted_writes says — planned again as proposals, applied as unconfirmed
// (but a change of the user's own items, or of a workspace other threads inherit, which
// proposes), or not made. Every write's events carry the context it was decided in.
func (s planner) untrusted(c Call, args json.RawMessage, st workspace.State, view *View, out toolOutput) (toolOutput, error) {
	direct := out
	if view.propose && workspace.Proposes(out.write.Changes) { // review mode: what it would write
		plain := *view
		plain.propose = false
		var err error
		if direct, err = s.planTool(c.Name, args, st, &plain); err != nil {
			return toolOutput{}, err
		}
	}
	if !direct.writes() { // list_preferences, a call that names only locked items: as it is
		return out, nil
	}
	r := view.reading(c)
	if r.Tainted && !view.propose && view.scope == nil {
		out.needsScope = true
		return out, nil
	}
	rule, missing := grounding(c, direct, st, view, r)
	context := r.Context(rule, missing).JSON()
	if !r.Tainted || view.propose {
		out.write.Context = context
		return out, nil
	}
	if rule == "" {
		out.write.Context, out.outcome = context, OutcomeGrounded
		return out, nil
	}
	mode := cmp.Or(view.scope.UntrustedWrites, s.untrustedWrites, workspace.UntrustedPropose)
	if mode == workspace.UntrustedApply && (rule == RuleUsersItem || rule == RuleInheritedBy) {
		mode = workspace.UntrustedPropose
	}
	switch mode {
	case workspace.UntrustedApply:
		marked := *view
		marked.source = workspace.SourceUnconfirmed
		p, err := s.planTool(c.Name, args, st, &marked)
		if err != nil {
			return toolOutput{}, err
		}
		p.write.Context, p.outcome, p.ungrounded = context, OutcomeUnconfirmed, true
		return p, nil
	case workspace.UntrustedRefuse:
		return toolOutput{text: refusedUntrusted, outcome: OutcomeRefused, ungrounded: true}, nil
	}
	proposing := *view
	proposing.propose = true
	p, err := s.planTool(c.Name, args, st, &proposing)
	if err != nil {
		return toolOutput{}, err
	}
	p.write.Context, p.outcome, p.ungrounded = context, OutcomeProposed, true
	switch {
	case workspace.Proposes(p.write.Changes):
		p.text = strings.Replace(p.text, "proposed; the user will review it", proposedUntrusted, 1)
	case p.full:
		// Past the bound of proposals waiting: nothing is proposed, and the model is told as a
		// refused write is (docs/spec.md §19).
		p.text, p.outcome = refusedUntrusted+"; "+strings.TrimPrefix(p.text, "nothing to propose; "), OutcomeOverLimit
	}
	return p, nil
}

// grounding is whether a planned write rests on the user's own words (docs/spec.md §19): "" when
// it does, else the first rule it fails, with the tokens that failed (for RuleWords and
// RuleNaming). An add's and an objective's every token, an update's tokens added or deleted (for
// a change of kind, the item's title in the last message), a removal's title in the last
// message or the #N it was shown as (an unconfirmed item's removal is always grounded). Never
// grounded: an MCP write, a write after the turn's first ungrounded one, a write to a workspace
// other threads inherit, a change of the user's own items.
func grounding(c Call, out toolOutput, st workspace.State, view *View, r *workspace.Reading) (rule string, missing []string) {
	switch {
	case c.via() == workspace.ViaMCP:
		return RuleMCP, nil
	case view.ungrounded:
		return RuleAfterUngrounded, nil
	case view.scope != nil && view.scope.InheritedBy:
		return RuleInheritedBy, nil
	}
	w := out.write
	before := make(map[int64]workspace.Preference, len(st.List))
	for _, p := range st.List {
		before[p.ID] = p
	}
	for _, p := range w.Update {
		if was := before[p.ID]; workspace.UsersOwn(was.Source) && fieldsChanged(was, p) {
			return RuleUsersItem, nil
		}
	}
	for _, id := range w.Delete {
		if workspace.UsersOwn(before[id].Source) {
			return RuleUsersItem, nil
		}
	}
	if w.Objective != nil && *w.Objective != st.Objective && workspace.UsersOwn(st.ObjectiveSource) {
		return RuleUsersItem, nil
	}
	vocabulary := r.Vocabulary()
	var words, naming []string
	word := func(m []string, ok bool) {
		if !ok {
			words = append(words, m...)
		}
	}
	name := func(m []string, ok bool) {
		if !ok {
			naming = append(naming, m...)
		}
	}
	for _, p := range w.Insert {
		word(workspace.GroundedText(strings.TrimSpace(p.Title+"\n"+p.Subtitle), vocabulary))
	}
	if w.Objective != nil && *w.Objective != st.Objective {
		word(workspace.GroundedText(*w.Objective, vocabulary))
	}
	last, refs := r.LastWords()
	for _, p := range w.Update {
		was := before[p.ID]
		word(workspace.GroundedEdit(was.Title, p.Title, vocabulary))
		word(workspace.GroundedEdit(was.Subtitle, p.Subtitle, vocabulary))
		if p.Kind != was.Kind {
			name(workspace.GroundedNaming(was.Title, view.shownAs(p.ID), last, refs))
		}
	}
	for _, id := range w.Delete {
		if was := before[id]; !was.Unconfirmed() {
			name(workspace.GroundedNaming(was.Title, view.shownAs(id), last, refs))
		}
	}
	switch {
	case len(words) > 0:
		return RuleWords, append(words, naming...)
	case len(naming) > 0:
		return RuleNaming, naming
	}
	return "", nil
}

// fieldsChanged reports whether after writes another title, subtitle or kind than before's.
func fieldsChanged(before, after workspace.Preference) bool {
	return before.Title != after.Title || before.Subtitle != after.Subtitle || before.Kind != after.Kind
}

// writeSource is the source the view's writes give what they add (docs/spec.md §19): the agent's,
// or unconfirmed under untrusted_writes apply.
func (v *View) writeSource() string { return cmp.Or(v.source, workspace.SourceAgent) }

// sourced is p as a write of the view leaves it, was as it stood: its fields changed, its source is
// the lower of the two (never raised); unchanged, its own.
func (v *View) sourced(was, p workspace.Preference) workspace.Preference {
	if fieldsChanged(was, p) {
		p.Source = workspace.LowerSource(was.Source, v.writeSource())
	} else {
		p.Source = was.Source
	}
	return p
}

// shownAs is the #N the model was shown a preference as; 0 when it was not shown.
func (v *View) shownAs(id int64) int {
	for i, p := range v.shown {
		if p.ID == id {
			return i + 1
		}
	}
	return 0
}
