package proxy

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/workspace"
)

func id(p workspace.Preference) string { return strconv.FormatInt(p.ID, 10) }

func TestAdminPagination(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Fallback = reply(cmpl("ok"))
	for i := range 5 {
		e.up.Script(reply(cmpl("ok")), reply(cmpl("", call{ID: "x", Name: "list_preferences", Arguments: "{}"})), reply(cmpl("ok")))
		th := map[string]string{"X-Thread-Id": fmt.Sprintf("p%d", i)}
		require.Equal(t, 200, e.post("/v1/chat/completions", th, `{"messages":[]}`).StatusCode)
		require.Equal(t, 200, e.post("/v1/chat/completions", th, `{"messages":[]}`).StatusCode)
	}
	var got []string
	after := ""
	for {
		var pg page[map[string]any]
		e.admin("GET", "/admin/v1/threads?limit=2&after="+after, nil, 200, &pg)
		for _, th := range pg.Data {
			got = append(got, th["id"].(string))
		}
		if !pg.HasMore {
			break
		}
		after = pg.Data[len(pg.Data)-1]["id"].(string)
	}
	require.Equal(t, []string{"p4", "p3", "p2", "p1", "p0"}, got)

	var rawSnaps page[map[string]any]
	e.admin("POST", "/admin/v1/threads/p4/preferences", map[string]any{"title": "Kept"}, 201, nil)
	e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "p4"}, `{"messages":[]}`)
	e.admin("GET", "/admin/v1/threads/p4/snapshots", nil, 200, &rawSnaps)
	// p4: turns 1 and 2 on an empty workspace (one snapshot), turn 3 after the user's addition.
	require.Len(t, rawSnaps.Data, 2)
	require.ElementsMatch(t, []string{"turn", "created_at", "objective", "preferences", "inherited"}, keys(rawSnaps.Data[1]))
	require.ElementsMatch(t, []string{"id", "index", "title", "subtitle", "kind", "locked", "source"},
		keys(rawSnaps.Data[1]["preferences"].([]any)[0].(map[string]any)))

	var snaps page[workspace.Snapshot]
	e.admin("GET", "/admin/v1/threads/p4/snapshots?limit=1", nil, 200, &snaps)
	require.True(t, snaps.HasMore)
	require.Equal(t, 1, snaps.Data[0].Turn)
	e.admin("GET", "/admin/v1/threads/p4/snapshots?after=1", nil, 200, &snaps)
	require.False(t, snaps.HasMore)
	require.Equal(t, 3, snaps.Data[0].Turn)
	for turn, want := range map[string]int{"1": 1, "2": 1, "3": 3} {
		var snap workspace.Snapshot
		e.admin("GET", "/admin/v1/threads/p4/snapshots?turn="+turn, nil, 200, &snap)
		require.Equal(t, want, snap.Turn, "the snapshot of turn %s", turn)
	}
	e.admin("GET", "/admin/v1/threads/p4/snapshots?turn=4", nil, 404, nil)
	e.admin("GET", "/admin/v1/threads/p4/snapshots?turn=0", nil, 400, nil)

	var calls page[map[string]any]
	e.admin("GET", "/admin/v1/threads/p0/tool-calls?limit=500", nil, 200, &calls)
	require.Len(t, calls.Data, 1)
	c := calls.Data[0]
	require.Equal(t, map[string]any{}, c["arguments"])
	require.Equal(t, map[string]any{"ok": true, "result": "no preferences recorded yet"}, c["result"])
	require.Equal(t, float64(2), c["turn"])
	require.Equal(t, float64(1), c["round"])
	require.Equal(t, "list_preferences", c["tool"])
	e.admin("GET", "/admin/v1/threads/p0/tool-calls?after="+strconv.Itoa(int(c["id"].(float64))), nil, 200, &calls)
	require.Empty(t, calls.Data)

	for _, bad := range []string{"limit=0", "limit=x", "after=-1", "after=x"} {
		e.admin("GET", "/admin/v1/threads/p0/tool-calls?"+bad, nil, 400, nil)
	}
	e.admin("GET", "/admin/v1/threads?limit=100000", nil, 200, nil)
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
