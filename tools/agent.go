package tools

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/wsproxy/wsproxy/db"
)

// The five tools: each plans its call on the workspace as the call finds it and the view its
// indices name (pure, here and in plan.go and view.go): its result, its events, what it added,
// changed and removed, and the statement that writes it, which the call sends with its record
// and events in one round trip (call.go).

func (w *Workspace) addPreferences(args json.RawMessage, st state, view *View) (toolOutput, error) {
	fresh, dups, fromScopes, err := w.store.planAdd(args, st.nextID, st.list, view.inherited)
	if err != nil {
		return toolOutput{}, err
	}
	var changes []change
	if view.propose {
		var adds []string
		var held heldProposals
		for _, p := range fresh {
			c, what := proposal(Target{Type: TargetPreference}, nil, proposalState(p)), `add "`+oneLine(p.Title)+`"`
			if st.book.admit(&c, &held, what) {
				changes, adds = append(changes, c), append(adds, what)
			}
		}
		parts := append(adds, fromScopes.parts()...)
		if len(dups) > 0 {
			parts = append(parts, "already recorded: "+strings.Join(dups, ", "))
		}
		parts = append(parts, held.parts()...)
		return toolOutput{text: proposedText(len(adds) > 0, parts), changes: changes}, nil
	}
	out := toolOutput{kept: fresh}
	if len(fresh) > 0 {
		p := db.PreferenceInsertBatchParams{ThreadID: w.threadID, NextPreferenceID: st.nextID + int64(len(fresh))}
		for _, it := range fresh {
			c, _ := prefChange(nil, &it)
			changes = append(changes, c)
			p.Ids = append(p.Ids, it.ID)
			p.Titles = append(p.Titles, it.Title)
			p.Subtitles = append(p.Subtitles, it.Subtitle)
			p.Kinds = append(p.Kinds, it.Kind)
			p.Locks = append(p.Locks, it.Locked)
		}
		out.write = func(b *pgx.Batch) { db.QueuePreferenceInsertBatch(b, p) }
		out.nextID = p.NextPreferenceID
	}
	parts := []string{"recorded " + plural(len(fresh), "preference")}
	if len(dups) > 0 {
		parts = append(parts, "already recorded: "+strings.Join(dups, ", "))
	}
	parts = append(parts, fromScopes.parts()...)
	out.text, out.changes = strings.Join(parts, "; "), changes
	return out, nil
}

// Review mode (docs/spec.md §17): a tool's change becomes a proposal event, nothing changes; at
// most MaxPendingProposals wait for the user, none twice (proposals.go).

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

// proposeEdits is a review-mode update or removal: a proposal per open target that book admits
// (its fields now, what the call asked), a locked_skip per locked one as in direct mode, nothing
// written.
func proposeEdits(t targets, updated bool, book *proposalBook) toolOutput {
	verb := "remove"
	if updated {
		verb = "update"
	}
	var changes []change
	var held heldProposals
	proposed := t
	proposed.open = nil
	for _, p := range t.open {
		want := []byte("null")
		if updated {
			want = proposalState(t.proposed[p.ID])
		}
		c := proposal(Target{Type: TargetPreference, ID: p.ID}, prefState(t.before[p.ID]), want)
		if book.admit(&c, &held, verb+" "+ref(p)) {
			changes, proposed.open = append(changes, c), append(proposed.open, p)
		}
	}
	locked := t
	locked.open = nil
	skips := locked.changes(updated)
	book.admitSkips(skips)
	changes = append(changes, skips...)
	var parts []string
	if len(proposed.open)+len(t.locked)+len(t.changed)+len(t.outOfRange) > 0 || held.empty() {
		parts = append(parts, proposed.summary(verb))
	}
	parts = append(parts, held.parts()...)
	return toolOutput{text: proposedText(len(proposed.open) > 0, parts), lockedSkips: len(t.locked), changes: changes}
}

func (w *Workspace) updatePreferences(args json.RawMessage, st state, view *View) (toolOutput, error) {
	t, err := w.store.planUpdate(args, view, st.list)
	if err != nil {
		return toolOutput{}, err
	}
	if view.propose {
		return proposeEdits(t, true, st.book), nil
	}
	out := toolOutput{text: t.summary("updated"), lockedSkips: len(t.locked), changes: t.changes(true), kept: t.open}
	st.book.admitSkips(out.changes)
	if len(t.open) > 0 {
		p := db.PreferenceUpdateUnlockedParams{ThreadID: w.threadID}
		for _, u := range t.open {
			p.Ids = append(p.Ids, u.ID)
			p.Titles = append(p.Titles, u.Title)
			p.Subtitles = append(p.Subtitles, u.Subtitle)
			p.Kinds = append(p.Kinds, u.Kind)
		}
		out.rows, out.write = p.Ids, func(b *pgx.Batch) { db.QueuePreferenceUpdateUnlocked(b, p, wrote(p.Ids)) }
	}
	return out, nil
}

func (w *Workspace) removePreferences(args json.RawMessage, st state, view *View) (toolOutput, error) {
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
	t := view.resolve(st.list, indices)
	if view.propose {
		return proposeEdits(t, false, st.book), nil
	}
	out := toolOutput{text: t.summary("removed"), lockedSkips: len(t.locked), changes: t.changes(false), removed: idsOf(t.open)}
	st.book.admitSkips(out.changes)
	if len(t.open) > 0 {
		p := db.PreferenceDeleteUnlockedParams{ThreadID: w.threadID, Ids: out.removed}
		out.rows, out.write = p.Ids, func(b *pgx.Batch) { db.QueuePreferenceDeleteUnlocked(b, p, wrote(p.Ids)) }
	}
	return out, nil
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

// idsOf are the stable ids of prefs.
func idsOf(prefs []Preference) []int64 {
	out := make([]int64, len(prefs))
	for i, p := range prefs {
		out[i] = p.ID
	}
	return out
}

func (w *Workspace) setObjective(args json.RawMessage, st state, view *View) (toolOutput, error) {
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
		c, what := proposal(Target{Type: TargetObjective}, objectiveState(st.objective), objectiveState(text)), "objective: "+text
		var held heldProposals
		if !st.book.admit(&c, &held, what) {
			return toolOutput{text: proposedText(false, held.parts())}, nil
		}
		parts := []string{what}
		if c.answers != 0 {
			parts = append(parts, "it replaces the objective proposed before")
		}
		return toolOutput{text: proposedText(true, parts), changes: []change{c}}, nil
	}
	p := db.ObjectiveUpsertParams{ThreadID: w.threadID, Text: text, UpdatedBy: ByAgent}
	out := toolOutput{text: "objective set: " + text, objective: &text, write: func(b *pgx.Batch) { db.QueueObjectiveUpsert(b, p) }}
	if c, ok := objectiveChange(st.objective, text); ok {
		out.changes = []change{c}
	}
	return out, nil
}
