package tools

import (
	"encoding/json"
	"strings"

	"github.com/wsproxy/wsproxy/workspace"
)

// The five tools: each plans its call on the workspace as the call finds it and the view its
// indices name (pure, here and in plan.go and view.go): its result, its events, what it added,
// changed and removed, and what it writes, which the workspace sends with its record and events
// in one round trip (call.go).

func (s planner) addPreferences(args json.RawMessage, st workspace.State, view *View) (toolOutput, error) {
	fresh, at, dups, fromScopes, err := s.planAddAt(args, st.NextID, st.List, view.inherited)
	if err != nil {
		return toolOutput{}, err
	}
	var changes []workspace.Change
	if view.propose {
		var adds []string
		var held workspace.HeldProposals
		for _, p := range fresh {
			c, what := workspace.Proposal(workspace.Target{Type: workspace.TargetPreference}, nil, workspace.ProposalState(p)), `add "`+workspace.OneLine(p.Title)+`"`
			if st.Book.Admit(&c, &held, what) {
				changes, adds = append(changes, c), append(adds, what)
			}
		}
		parts := append(adds, fromScopes.parts()...)
		if len(dups) > 0 {
			parts = append(parts, "already recorded: "+strings.Join(dups, ", "))
		}
		parts = append(parts, held.Parts()...)
		return toolOutput{text: proposedText(len(adds) > 0, parts), write: workspace.Write{Changes: changes}, full: held.Full()}, nil
	}
	for i := range fresh {
		fresh[i].Source = view.writeSource()
	}
	out := toolOutput{kept: fresh, at: at}
	if len(fresh) > 0 {
		for _, it := range fresh {
			c, _ := workspace.PrefChange(nil, &it)
			changes = append(changes, c)
		}
		out.write.Insert, out.write.NextID = fresh, st.NextID+int64(len(fresh))
	}
	parts := []string{"recorded " + plural(len(fresh), "preference")}
	if len(dups) > 0 {
		parts = append(parts, "already recorded: "+strings.Join(dups, ", "))
	}
	parts = append(parts, fromScopes.parts()...)
	out.text, out.write.Changes = strings.Join(parts, "; "), changes
	return out, nil
}

// Review mode (docs/spec.md §17): a tool's change becomes a proposal event, nothing changes; at
// most workspace.MaxPendingProposals wait for the user, none twice (workspace.ProposalBook).

// proposedText is a review-mode call's result: what it proposed, and the rest of its summary.
func proposedText(proposed bool, parts []string) string {
	if !proposed {
		return "nothing to propose; " + strings.Join(parts, "; ")
	}
	return "proposed; the user will review it: " + strings.Join(parts, "; ")
}

// proposeEdits is a review-mode update or removal: a proposal per open target that book admits
// (its fields now, what the call asked), a locked_skip per locked one as in direct mode, nothing
// written.
func proposeEdits(t targets, updated bool, book *workspace.ProposalBook) toolOutput {
	verb := "remove"
	if updated {
		verb = "update"
	}
	var changes []workspace.Change
	var held workspace.HeldProposals
	proposed := t
	proposed.open = nil
	for _, p := range t.open {
		want := []byte("null")
		if updated {
			want = workspace.ProposalState(t.proposed[p.ID])
		}
		c := workspace.Proposal(workspace.Target{Type: workspace.TargetPreference, ID: p.ID}, workspace.PrefState(t.before[p.ID]), want)
		if book.Admit(&c, &held, verb+" "+ref(p)) {
			changes, proposed.open = append(changes, c), append(proposed.open, p)
		}
	}
	locked := t
	locked.open = nil
	skips := locked.changes(updated)
	book.AdmitSkips(skips)
	changes = append(changes, skips...)
	var parts []string
	if len(proposed.open)+len(t.locked)+len(t.changed)+len(t.outOfRange) > 0 || held.Empty() {
		parts = append(parts, proposed.summary(verb))
	}
	parts = append(parts, held.Parts()...)
	return toolOutput{text: proposedText(len(proposed.open) > 0, parts), lockedSkips: len(t.locked), write: workspace.Write{Changes: changes},
		full: held.Full()}
}

func (s planner) updatePreferences(args json.RawMessage, st workspace.State, view *View) (toolOutput, error) {
	t, err := s.planUpdate(args, view, st.List)
	if err != nil {
		return toolOutput{}, err
	}
	if view.propose {
		return proposeEdits(t, true, st.Book), nil
	}
	for i, p := range t.open {
		t.open[i] = view.sourced(t.before[p.ID], p)
	}
	out := toolOutput{text: t.summary("updated"), lockedSkips: len(t.locked), kept: t.open,
		write: workspace.Write{Update: t.open, Changes: t.changes(true)}}
	st.Book.AdmitSkips(out.write.Changes)
	return out, nil
}

func (s planner) removePreferences(args json.RawMessage, st workspace.State, view *View) (toolOutput, error) {
	var a struct {
		Indices *[]index `json:"indices"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return toolOutput{}, err
	}
	if a.Indices == nil {
		return toolOutput{}, invalid("indices", "is required")
	}
	if len(*a.Indices) == 0 {
		return toolOutput{}, invalid("indices", "must hold at least one index")
	}
	if err := s.checkItems("indices", len(*a.Indices), "removed"); err != nil {
		return toolOutput{}, err
	}
	indices := make([]int, len(*a.Indices))
	for i, n := range *a.Indices {
		indices[i] = int(n)
	}
	t := view.resolve(st.List, indices)
	if view.propose {
		return proposeEdits(t, false, st.Book), nil
	}
	removed := idsOf(t.open)
	out := toolOutput{text: t.summary("removed"), lockedSkips: len(t.locked), removed: removed,
		write: workspace.Write{Delete: removed, Changes: t.changes(false)}}
	st.Book.AdmitSkips(out.write.Changes)
	return out, nil
}

// idsOf are the stable ids of prefs.
func idsOf(prefs []workspace.Preference) []int64 {
	out := make([]int64, len(prefs))
	for i, p := range prefs {
		out[i] = p.ID
	}
	return out
}

func (s planner) setObjective(args json.RawMessage, st workspace.State, view *View) (toolOutput, error) {
	var a struct {
		Text *string `json:"text"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return toolOutput{}, err
	}
	if a.Text == nil {
		return toolOutput{}, invalid("text", "is required")
	}
	text, err := cleaned(s.limits.CheckObjective, s.limits.ObjectiveMax)("text", *a.Text)
	if err != nil {
		return toolOutput{}, err
	}
	if view.propose {
		c, what := workspace.Proposal(workspace.Target{Type: workspace.TargetObjective}, workspace.ObjectiveState(st.Objective), workspace.ObjectiveState(text)), "objective: "+text
		var held workspace.HeldProposals
		if !st.Book.Admit(&c, &held, what) {
			return toolOutput{text: proposedText(false, held.Parts()), full: held.Full()}, nil
		}
		parts := []string{what}
		if c.Answers() != 0 {
			parts = append(parts, "it replaces the objective proposed before")
		}
		return toolOutput{text: proposedText(true, parts), write: workspace.Write{Changes: []workspace.Change{c}}}, nil
	}
	source := st.ObjectiveSource
	if text != st.Objective {
		source = workspace.LowerSource(st.ObjectiveSource, view.writeSource())
	}
	out := toolOutput{text: "objective set: " + text, write: workspace.Write{Objective: &text, ObjectiveSource: source}}
	if c, ok := workspace.ObjectiveSourcedChange(st.Objective, st.ObjectiveSource, text, source); ok {
		out.write.Changes = []workspace.Change{c}
	}
	return out, nil
}
