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

func (w *Workspace) addPreferences(ctx context.Context, tx db.DBTX, args json.RawMessage, nextID int64, list []Preference) (toolOutput, error) {
	fresh, dups, err := w.store.planAdd(args, nextID, list)
	if err != nil {
		return toolOutput{}, err
	}
	var changes []change
	var added []Preference
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
	text := "recorded " + plural(len(fresh), "preference")
	if len(dups) > 0 {
		text += "; already recorded: " + strings.Join(dups, ", ")
	}
	return toolOutput{text: text, changes: changes, kept: added}, nil
}

func (w *Workspace) updatePreferences(ctx context.Context, tx db.DBTX, args json.RawMessage, view *View, list []Preference) (toolOutput, error) {
	t, err := w.store.planUpdate(args, view, list)
	if err != nil {
		return toolOutput{}, err
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

func (w *Workspace) setObjective(ctx context.Context, tx db.DBTX, args json.RawMessage) (toolOutput, error) {
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
