package tools

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/wsproxy/wsproxy/workspace"
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
// names (read under the thread's lock, l), or the list as it stands (list, as of the thread's
// latest event, last) when the call gives none. A *ValidationError for an as_of that names no
// change of the thread, or one whose later history was pruned.
func viewAsOf(ctx context.Context, l *workspace.Locked, args json.RawMessage, list []workspace.Preference, last int64) (*View, error) {
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
	shown, err := l.ListAfter(ctx, n)
	if errors.Is(err, workspace.ErrPruned) {
		return nil, invalid("as_of", "the history after change %d is no longer kept; call list_preferences", n)
	}
	if err != nil {
		return nil, err
	}
	return viewOf(shown), nil
}
