package tools

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/wsproxy/wsproxy/db"
)

// Indices over MCP (docs/spec.md §15). MCP keeps no round: what the agent was shown is named by
// the version a list_preferences result or the workspace resource ends with (as of change N, N
// the thread's latest event id), and an update or removal with as_of N names the list as it stood
// after event N, rebuilt from the events since.

// AsOfChange is text (a list or a block) ending with its version: the thread's latest event id
// when it was read.
func AsOfChange(text string, lastEvent int64) string {
	return text + "\nas of change " + strconv.FormatInt(lastEvent, 10)
}

// viewAsOf is the view of an MCP call's indices: the list as it stood after the event its as_of
// names, or the list as it stands (list, as of the thread's latest event, last) when the call
// gives none. A *ValidationError for an as_of that names no change of the thread, or one whose
// later history was pruned.
func (w *Workspace) viewAsOf(ctx context.Context, q db.DBTX, args json.RawMessage, list []Preference, last int64) (*View, error) {
	var a struct {
		AsOf *int64 `json:"as_of"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	if a.AsOf == nil {
		return viewOf(list), nil
	}
	n := *a.AsOf
	switch {
	case n < 0 || n > last:
		return nil, invalid("as_of", "must be a change of this thread, 0 to %d (got %d); call list_preferences", last, n)
	case n == last:
		return viewOf(list), nil
	}
	// The events after n are all there when the first of them is: history is pruned oldest first.
	if _, err := w.store.q.EventGet(ctx, q, db.EventGetParams{ThreadID: w.threadID, ID: n + 1}); errors.Is(err, pgx.ErrNoRows) {
		return nil, invalid("as_of", "the history after change %d is no longer kept; call list_preferences", n)
	} else if err != nil {
		return nil, fmt.Errorf("read event %d: %w", n+1, err)
	}
	states, err := w.store.q.EventPreferenceStatesAfter(ctx, q, db.EventPreferenceStatesAfterParams{ThreadID: w.threadID, AfterID: n})
	if err != nil {
		return nil, fmt.Errorf("read the events after change %d: %w", n, err)
	}
	then := make(map[int64]Preference, len(list)+len(states))
	for _, p := range list {
		then[p.ID] = p
	}
	for _, s := range states {
		if s.Before == nil { // added since
			delete(then, s.ID)
			continue
		}
		var p Preference
		if err := json.Unmarshal(s.Before, &p); err != nil {
			return nil, fmt.Errorf("decode event: %w", err)
		}
		p.ID = s.ID
		then[s.ID] = p
	}
	shown := make([]Preference, 0, len(then))
	for _, p := range then {
		shown = append(shown, p)
	}
	slices.SortFunc(shown, func(a, b Preference) int { return cmp.Compare(a.ID, b.ID) })
	for i := range shown {
		shown[i].Index = i + 1
	}
	return viewOf(shown), nil
}
