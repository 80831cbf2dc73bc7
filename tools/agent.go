package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/wsproxy/wsproxy/db"
)

// The five tools: each plans its call on the list as it stands and the view its indices name
// (pure, in plan.go and view.go), then runs a few lines of SQL inside the call's transaction
// (call.go), and says what it added, changed and removed.

func (w *Workspace) addPreferences(ctx context.Context, tx db.DBTX, args json.RawMessage, nextID int64, view *View, list []Preference) (toolOutput, error) {
	fresh, dups, fromScopes, err := w.store.planAdd(args, nextID, list, view.inherited)
	if err != nil {
		return toolOutput{}, err
	}
	var changes []change
	var added []Preference
	if view.propose {
		var adds []string
		for _, p := range fresh {
			changes = append(changes, proposal(Target{Type: TargetPreference}, nil, proposalState(p)))
			adds = append(adds, `add "`+oneLine(p.Title)+`"`)
		}
		parts := append(adds, fromScopes.parts()...)
		if len(dups) > 0 {
			parts = append(parts, "already recorded: "+strings.Join(dups, ", "))
		}
		return toolOutput{text: proposedText(len(fresh) > 0, parts), changes: changes}, nil
	}
	if len(fresh) > 0 {
		rows, err := w.insert(ctx, tx, nextID, fresh)
		if err != nil {
			return toolOutput{}, err
		}
		for i, r := range rows {
			p := fromRow(len(list)+i+1, r)
			c, _ := prefChange(nil, &p)
			changes = append(changes, c)
			added = append(added, p)
		}
	}
	parts := []string{"recorded " + plural(len(fresh), "preference")}
	if len(dups) > 0 {
		parts = append(parts, "already recorded: "+strings.Join(dups, ", "))
	}
	parts = append(parts, fromScopes.parts()...)
	return toolOutput{text: strings.Join(parts, "; "), changes: changes, kept: added}, nil
}

// Review mode (docs/spec.md §17): a tool's change becomes a proposal event, nothing changes.

// proposedText is a review-mode call's result: what it proposed, and the rest of its summary.
func proposedText(proposed bool, parts []string) string {
	if !proposed {
		return "nothing to propose; " + strings.Join(parts, "; ")
	}
	return "proposed; the user will review it: " + strings.Join(parts, "; ")
}

// proposal is the event of a change proposed to target (before: its fields now, nil for an
// addition; want: the fields it would write, "null" for a removal).
func proposal(target Target, before, want []byte) change {
	return change{kind: Proposed, target: target, before: before, proposed: want}
}

// proposeEdits is a review-mode update or removal: a proposal per open target (its fields now,
// what the call asked), a locked_skip per locked one as in direct mode, nothing written.
func proposeEdits(t targets, updated bool) toolOutput {
	var changes []change
	for _, p := range t.open {
		want := []byte("null")
		if updated {
			want = proposalState(t.proposed[p.ID])
		}
		changes = append(changes, proposal(Target{Type: TargetPreference, ID: p.ID}, prefState(t.before[p.ID]), want))
	}
	locked := t
	locked.open = nil
	changes = append(changes, locked.changes(updated)...)
	verb := "remove"
	if updated {
		verb = "update"
	}
	return toolOutput{text: proposedText(len(t.open) > 0, []string{t.summary(verb)}), lockedSkips: len(t.locked), changes: changes}
}

func (w *Workspace) updatePreferences(ctx context.Context, tx db.DBTX, args json.RawMessage, view *View, list []Preference) (toolOutput, error) {
	t, err := w.store.planUpdate(args, view, list)
	if err != nil {
		return toolOutput{}, err
	}
	if view.propose {
		return proposeEdits(t, true), nil
	}
	if len(t.open) > 0 {
		p := db.PreferenceUpdateUnlockedParams{ThreadID: w.threadID}
		for _, u := range t.open {
			p.Ids = append(p.Ids, u.ID)
			p.Titles = append(p.Titles, u.Title)
			p.Subtitles = append(p.Subtitles, u.Subtitle)
			p.Kinds = append(p.Kinds, u.Kind)
		}
		done, err := w.store.q.PreferenceUpdateUnlocked(ctx, tx, p)
		if err != nil {
			return toolOutput{}, fmt.Errorf("update preferences: %w", err)
		}
		t.applied(done)
	}
	return toolOutput{text: t.summary("updated"), lockedSkips: len(t.locked), changes: t.changes(true),
		kept: t.open}, nil
}

func (w *Workspace) removePreferences(ctx context.Context, tx db.DBTX, args json.RawMessage, view *View, list []Preference) (toolOutput, error) {
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
	if err := w.store.checkItems("indices", len(*a.Indices), "removed"); err != nil {
		return toolOutput{}, err
	}
	indices := make([]int, len(*a.Indices))
	for i, n := range *a.Indices {
		indices[i] = int(n)
	}
	t := view.resolve(list, indices)
	if view.propose {
		return proposeEdits(t, false), nil
	}
	if len(t.open) > 0 {
		deleted, err := w.store.q.PreferenceDeleteUnlocked(ctx, tx, db.PreferenceDeleteUnlockedParams{ThreadID: w.threadID, Ids: idsOf(t.open)})
		if err != nil {
			return toolOutput{}, fmt.Errorf("remove preferences: %w", err)
		}
		t.applied(deleted)
	}
	return toolOutput{text: t.summary("removed"), lockedSkips: len(t.locked), changes: t.changes(false),
		removed: idsOf(t.open)}, nil
}

// idsOf are the stable ids of prefs.
func idsOf(prefs []Preference) []int64 {
	out := make([]int64, len(prefs))
	for i, p := range prefs {
		out[i] = p.ID
	}
	return out
}

func (w *Workspace) setObjective(ctx context.Context, tx db.DBTX, args json.RawMessage, view *View) (toolOutput, error) {
	var a struct {
		Text *string `json:"text"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return toolOutput{}, err
	}
	if a.Text == nil {
		return toolOutput{}, invalid("text", "is required")
	}
	text, err := w.store.checkObjective("text", *a.Text)
	if err != nil {
		return toolOutput{}, err
	}
	if view.propose {
		var before []byte
		if o, err := w.store.q.ObjectiveGet(ctx, tx, w.threadID); err == nil {
			before = objectiveState(o.Text)
		} else if err = db.NotFound(err); err != db.ErrNotFound {
			return toolOutput{}, fmt.Errorf("get objective: %w", err)
		}
		c := proposal(Target{Type: TargetObjective}, before, objectiveState(text))
		return toolOutput{text: proposedText(true, []string{"objective: " + text}), changes: []change{c}}, nil
	}
	r, err := w.store.q.ObjectiveUpsert(ctx, tx, db.ObjectiveUpsertParams{ThreadID: w.threadID, Text: text, UpdatedBy: ByAgent})
	if err != nil {
		return toolOutput{}, fmt.Errorf("set objective: %w", err)
	}
	out := toolOutput{text: "objective set: " + text}
	if c, ok := objectiveChange(r.Previous, text); ok {
		out.changes = []change{c}
	}
	return out, nil
}
