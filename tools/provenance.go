package tools

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
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
// proposes), or not made. A call whose first items are grounded and a later one is not is
// decided per item (perItem). Every write's events carry the context it was decided in. book is
// the proposals' book as the tool's plan found it.
func (s planner) untrusted(c Call, args json.RawMessage, st workspace.State, view *View, out toolOutput, book *workspace.ProposalBook) (toolOutput, error) {
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
	words := &userWords{r: r}
	rule, missing := grounding(c, direct, st, view, words)
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
	// Planned again on the book as the tool's plan found it (the first plan admitted its own
	// proposals, a locked item's skip among them), per item on a copy of it.
	fresh := st
	fresh.Book = book.Clone()
	if p, ok := s.perItem(c, args, fresh, view, words, direct, mode); ok {
		return p, nil
	}
	fresh.Book = book
	p, err := s.ungrounded(mode, c.Name, args, fresh, view)
	if err != nil {
		return toolOutput{}, err
	}
	if p.outcome != OutcomeRefused {
		p.write.Context = context
	}
	return p, nil
}

// ungrounded plans a tainted turn's ungrounded write as mode says (docs/spec.md §19): as
// proposals (past the bound of proposals waiting, none, and the model is told as a refused
// write is), applied as unconfirmed, or not made.
func (s planner) ungrounded(mode, name string, args json.RawMessage, st workspace.State, view *View) (toolOutput, error) {
	switch mode {
	case workspace.UntrustedApply:
		marked := *view
		marked.source = workspace.SourceUnconfirmed
		p, err := s.planTool(name, args, st, &marked)
		if err != nil {
			return toolOutput{}, err
		}
		p.outcome, p.ungrounded = OutcomeUnconfirmed, true
		return p, nil
	case workspace.UntrustedRefuse:
		return toolOutput{text: refusedUntrusted, outcome: OutcomeRefused, ungrounded: true}, nil
	}
	proposing := *view
	proposing.propose = true
	p, err := s.planTool(name, args, st, &proposing)
	if err != nil {
		return toolOutput{}, err
	}
	p.outcome, p.ungrounded = OutcomeProposed, true
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

// perItem decides an add, update or removal item by item (docs/spec.md §19): the items before
// the first one whose write is not grounded (an update's edits of one index are one item) apply
// as the agent's; that item and every one after it are planned again, on what the first part
// leaves, as mode says; the result is the first part's, then the rest's. Each event carries its
// item's context: grounded, the first ungrounded item's rule and tokens, RuleAfterUngrounded.
// ok is false, and the call is decided whole, when its first write is not grounded (nor, then,
// any after it), or when its parts cannot be planned apart (an update that swaps two titles
// across them).
func (s planner) perItem(c Call, args json.RawMessage, st workspace.State, view *View, words *userWords, direct toolOutput, mode string) (toolOutput, bool) {
	first, rule, missing := -1, "", []string(nil)
	for i, u := range units(direct) {
		if rule, missing = grounding(c, u, st, view, words); rule != "" {
			first = i
			break
		}
	}
	if first <= 0 {
		return toolOutput{}, false
	}
	head, rest, item, ok := splitItems(c.Name, args, direct, first, view)
	if !ok {
		return toolOutput{}, false
	}
	pre, err := s.planTool(c.Name, head, st, view)
	if err != nil {
		return toolOutput{}, false
	}
	next := after(st, pre)
	next.Book = st.Book
	moved := *view
	moved.own = maps.Clone(view.own)
	moved.ran(pre.kept, pre.removed)
	p, err := s.ungrounded(mode, c.Name, rest, next, &moved)
	if err != nil {
		return toolOutput{}, false
	}
	// What the first ungrounded item alone writes, to give its events their own context.
	alone := next
	alone.Book = nil
	mine := map[string]bool{}
	switch mode {
	case workspace.UntrustedRefuse:
		// Nothing is written; the result names what was not.
		proposing := moved
		proposing.propose = true
		if named, err := s.planTool(c.Name, rest, alone, &proposing); err == nil {
			p.text += ": " + strings.TrimPrefix(strings.TrimPrefix(named.text, "proposed; the user will review it: "), "nothing to propose; ")
		}
	default:
		if mode == workspace.UntrustedApply {
			p.text = "unconfirmed (this turn read content the user did not write): " + p.text
		}
		if one, err := s.ungrounded(mode, c.Name, item, alone, &moved); err == nil {
			for _, ch := range one.write.Changes {
				mine[ch.Key()] = true
			}
		}
	}
	r := words.r
	grounded, own, later := r.Context("", nil).JSON(), r.Context(rule, missing).JSON(), r.Context(RuleAfterUngrounded, nil).JSON()
	w := &p.write
	contexts := make([][]byte, 0, len(pre.write.Changes)+len(w.Changes))
	for range pre.write.Changes {
		contexts = append(contexts, grounded)
	}
	for _, ch := range w.Changes {
		if mine[ch.Key()] {
			contexts = append(contexts, own)
		} else {
			contexts = append(contexts, later)
		}
	}
	p.text = pre.text + "; " + p.text
	p.lockedSkips += pre.lockedSkips
	p.kept = append(slices.Clip(pre.kept), p.kept...)
	p.removed = append(slices.Clip(pre.removed), p.removed...)
	w.Insert = append(slices.Clip(pre.write.Insert), w.Insert...)
	w.NextID = cmp.Or(w.NextID, pre.write.NextID)
	w.Update = append(slices.Clip(pre.write.Update), w.Update...)
	w.Delete = append(slices.Clip(pre.write.Delete), w.Delete...)
	w.Changes = append(slices.Clip(pre.write.Changes), w.Changes...)
	w.Context, w.Contexts = own, contexts
	return p, true
}

// units are a planned add's, update's or removal's writes one by one, in the order of the
// call's items; none for another tool's.
func units(out toolOutput) []toolOutput {
	w := out.write
	var us []toolOutput
	for _, p := range w.Insert {
		us = append(us, toolOutput{write: workspace.Write{Insert: []workspace.Preference{p}}})
	}
	for _, p := range w.Update {
		us = append(us, toolOutput{write: workspace.Write{Update: []workspace.Preference{p}}})
	}
	for _, id := range w.Delete {
		us = append(us, toolOutput{write: workspace.Write{Delete: []int64{id}}})
	}
	if w.Objective != nil {
		return nil
	}
	return us
}

// splitItems splits a call's arguments at the item of its write's unit n: head, the items
// before it; rest, it and those after; item, it alone. An update's edits of one index stay
// together (in the order sent), and a removal names in rest no index head names. ok is false
// for a tool of no items.
func splitItems(name string, args json.RawMessage, direct toolOutput, n int, view *View) (head, rest, item json.RawMessage, ok bool) {
	member := map[string]string{AddPreferences: "items", UpdatePreferences: "updates", RemovePreferences: "indices"}[name]
	var fields map[string]json.RawMessage
	var elems []json.RawMessage
	if member == "" || json.Unmarshal(args, &fields) != nil || json.Unmarshal(fields[member], &elems) != nil {
		return nil, nil, nil, false
	}
	var h, r, it []json.RawMessage
	switch name {
	case AddPreferences:
		at := direct.at[n]
		h, r, it = elems[:at], elems[at:], elems[at:at+1]
	default:
		// The index of each element, and the one of unit n.
		idx := make([]index, len(elems))
		for i, e := range elems {
			if name == UpdatePreferences {
				var u struct {
					Index index `json:"index"`
				}
				if json.Unmarshal(e, &u) != nil {
					return nil, nil, nil, false
				}
				idx[i] = u.Index
			} else if json.Unmarshal(e, &idx[i]) != nil {
				return nil, nil, nil, false
			}
		}
		var target index
		if name == UpdatePreferences {
			target = index(direct.write.Update[n].Index)
		} else {
			target = index(view.shownAs(direct.write.Delete[n]))
		}
		before := map[index]bool{}
		for _, x := range idx {
			if x == target {
				break
			}
			before[x] = true
		}
		for i, e := range elems {
			switch {
			case before[idx[i]]:
				h = append(h, e)
			default:
				r = append(r, e)
				if idx[i] == target {
					it = append(it, e)
				}
			}
		}
	}
	encode := func(part []json.RawMessage) json.RawMessage {
		f := maps.Clone(fields)
		f[member], _ = json.Marshal(part)
		b, _ := json.Marshal(f)
		return b
	}
	return encode(h), encode(r), encode(it), true
}

// grounding is whether a planned write rests on the user's own words (docs/spec.md §19): "" when
// it does, else the first rule it fails, with the tokens that failed (for RuleWords and
// RuleNaming). An add's and an objective's every token, an update's tokens added or deleted (for
// a change of kind, the item's title in the last message), a removal's title in the last
// message or the #N it was shown as (an unconfirmed item's removal is always grounded). Never
// grounded: an MCP write, a write after the turn's first ungrounded one, a write to a workspace
// other threads inherit, a change of the user's own items.
func grounding(c Call, out toolOutput, st workspace.State, view *View, r *userWords) (rule string, missing []string) {
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
	vocabulary := r.vocabulary()
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
	last, refs := r.lastWords()
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

// userWords are the user's words a turn's writes are grounded on (docs/spec.md §19), read from
// what the turn read once for all the writes of a call.
type userWords struct {
	r          *workspace.Reading
	vocab      map[string]bool
	last       map[string]bool
	refs       map[int]bool
	lastIsRead bool
}

// vocabulary is the tokens of the user's last two messages.
func (u *userWords) vocabulary() map[string]bool {
	if u.vocab == nil {
		u.vocab = u.r.Vocabulary()
	}
	return u.vocab
}

// lastWords is the words of the user's last message, and the #N it names.
func (u *userWords) lastWords() (map[string]bool, map[int]bool) {
	if !u.lastIsRead {
		u.last, u.refs = u.r.LastWords()
		u.lastIsRead = true
	}
	return u.last, u.refs
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
