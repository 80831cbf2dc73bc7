package admin

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestRevertThroughLatest (docs/spec.md §13): a revert in the way of later changes is a 409 that
// names the latest of them; ?through=latest reverts them newest first and then the change, each a
// revert event, and answers their list; ?through=<id> of a change that is no longer the latest
// is a 409 naming the newer one, with nothing written.
func TestRevertThroughLatest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var p workspace.Preference
	e.admin("POST", "/admin/v1/threads/trip/preferences", map[string]any{"title": "Gardens"}, 201, &p) // 1
	pref := fmt.Sprintf("/admin/v1/threads/trip/preferences/%d", p.ID)
	e.admin("PATCH", pref, map[string]any{"title": "Botanical gardens"}, 200, nil) // 2
	e.admin("PATCH", pref, map[string]any{"locked": true}, 200, nil)               // 3

	call := func(path string) (int, string) { return e.call("POST", path, nil) }
	code, body := call("/admin/v1/threads/trip/events/1/revert")
	require.Equal(t, 409, code)
	eb := testkit.RequireErrorBody(t, body, "invalid_request_error", "changed_since")
	require.Contains(t, eb["message"], "latest: event 3")
	require.Contains(t, eb["message"], "?through=latest")

	// Seen up to event 2: event 3 is newer, nothing is reverted.
	code, body = call("/admin/v1/threads/trip/events/1/revert?through=2")
	require.Equal(t, 409, code, body)
	require.Contains(t, testkit.RequireErrorBody(t, body, "invalid_request_error", "changed_since")["message"], "latest: event 3")
	for _, bad := range []string{"", "0", "first", "-1"} {
		code, body = call("/admin/v1/threads/trip/events/1/revert?through=" + bad)
		require.Equal(t, 400, code, body)
		require.Equal(t, "through", testkit.RequireErrorBody(t, body, "invalid_request_error", "invalid_value")["param"])
	}
	require.Len(t, e.workspace("trip").Preferences, 1)

	var got page[workspace.Event]
	e.admin("POST", "/admin/v1/threads/trip/events/1/revert?through=latest", nil, 200, &got)
	require.False(t, got.HasMore)
	var reverts []string
	for _, ev := range got.Data {
		require.Equal(t, workspace.Revert, ev.Kind)
		require.Equal(t, workspace.ByUser, ev.Actor)
		reverts = append(reverts, fmt.Sprintf("%d reverts %d", ev.ID, *ev.Reverts))
	}
	require.Equal(t, []string{"4 reverts 3", "5 reverts 2", "6 reverts 1"}, reverts)
	require.Empty(t, e.workspace("trip").Preferences)

	// With nothing later, through names the change itself (or latest): its one revert, listed.
	e.admin("POST", "/admin/v1/threads/trip/events/6/revert?through=6", nil, 200, &got)
	require.Len(t, got.Data, 1)
	require.Equal(t, int64(6), *got.Data[0].Reverts)
	require.Equal(t, "Gardens", e.workspace("trip").Preferences[0].Title)
	e.admin("POST", "/admin/v1/threads/trip/events/99/revert?through=latest", nil, 404, nil)
}
