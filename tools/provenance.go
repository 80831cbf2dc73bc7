package tools

import (
	"encoding/json"
	"strings"

	"github.com/wsproxy/wsproxy/workspace"
)

// Provenance (docs/spec.md §19): an agent's write in a turn that read content the user did not
// write applies only when the user's own words ground it; otherwise the store's untrusted_writes
// decides — a proposal (the default), an applied write, or nothing. Every MCP call counts as
// tainted. Pure: the decision is part of the call's plan.

// Outcomes of a tainted turn's write (Result.Untrusted, wsproxy_untrusted_writes_total).
const (
	OutcomeGrounded    = "grounded"
	OutcomeProposed    = "proposed"
	OutcomeUnconfirmed = "unconfirmed"
	OutcomeRefused     = "refused"
	OutcomeOverLimit   = "over_limit"
)

// Results of a write that waits for the user, or that was not made.
const (
	proposedUntrusted = "proposed; the user will review it (this turn read content the user did not write)"
	refusedUntrusted  = "not recorded: this turn read content the user did not write; the user can add it in the panel"
)

// SetReading has the view's calls read what the turn's model read (docs/spec.md §19): reading is
// called at the turn's first write, not before.
func (v *View) SetReading(reading func() workspace.Reading) { v.readingOf = reading }

// reading is what the call's turn read: over MCP, content no one vouches for; in a turn, what
// SetReading gives (nothing untrusted without it).
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
		v.read = &r
	}
	return v.read
}

// writes reports whether a plan changes the workspace.
func (out toolOutput) writes() bool {
	w := out.write
	return len(w.Insert)+len(w.Update)+len(w.Delete) > 0 || w.Objective != nil
}

// untrusted decides a planned write of a call in a turn that read untrusted content: the plan
// as it is when the user's words ground it (and no earlier write of the turn was ungrounded),
// else what the store's setting says: re-planned as proposals, applied, or not made.
func (s planner) untrusted(c Call, args json.RawMessage, st workspace.State, view *View, out toolOutput) (toolOutput, error) {
	if view.propose || !out.writes() {
		return out, nil
	}
	r := view.reading(c)
	if !r.Tainted {
		return out, nil
	}
	if !view.ungrounded && c.via() != workspace.ViaMCP && len(ungrounded(out, st, view, r)) == 0 {
		out.outcome = OutcomeGrounded
		return out, nil
	}
	switch s.untrustedWrites {
	case workspace.UntrustedApply:
		out.outcome, out.ungrounded = OutcomeUnconfirmed, true
		return out, nil
	case workspace.UntrustedRefuse:
		return toolOutput{text: refusedUntrusted, outcome: OutcomeRefused, ungrounded: true}, nil
	}
	proposing := *view
	proposing.propose = true
	p, err := s.planTool(c.Name, args, st, &proposing)
	if err != nil {
		return toolOutput{}, err
	}
	p.text = strings.Replace(p.text, "proposed; the user will review it", proposedUntrusted, 1)
	p.outcome, p.ungrounded = OutcomeProposed, true
	if !workspace.Proposes(p.write.Changes) {
		p.outcome = OutcomeOverLimit
	}
	return p, nil
}

// ungrounded are the tokens of what the plan writes that the user's last two messages do not
// hold (docs/spec.md §19): an add's and an objective's every token; an update's tokens added or
// deleted, and for a change of kind the item's title in the last message; a removal's title in
// the last message, or the #N it was shown as.
func ungrounded(out toolOutput, st workspace.State, view *View, r *workspace.Reading) []string {
	vocabulary := r.Vocabulary()
	words, refs := r.LastWords()
	var missing []string
	add := func(m []string, ok bool) {
		if !ok {
			missing = append(missing, m...)
		}
	}
	for _, p := range out.write.Insert {
		add(workspace.GroundedText(p.Title, vocabulary))
		if p.Subtitle != "" {
			add(workspace.GroundedText(p.Subtitle, vocabulary))
		}
	}
	if o := out.write.Objective; o != nil {
		add(workspace.GroundedText(*o, vocabulary))
	}
	before := map[int64]workspace.Preference{}
	for _, p := range st.List {
		before[p.ID] = p
	}
	for _, p := range out.write.Update {
		was := before[p.ID]
		add(workspace.GroundedEdit(was.Title, p.Title, vocabulary))
		add(workspace.GroundedEdit(was.Subtitle, p.Subtitle, vocabulary))
		if p.Kind != was.Kind {
			add(workspace.GroundedNaming(was.Title, view.shownAs(p.ID), words, refs))
		}
	}
	for _, id := range out.write.Delete {
		add(workspace.GroundedNaming(before[id].Title, view.shownAs(id), words, refs))
	}
	return missing
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
