package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

// recordingModel answers a turn's first call by recording the user's message as a preference,
// and the call after the tool's result with text.
func recordingModel(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if bytes.Contains(body, []byte(`"role":"tool"`)) {
		reply(cmpl("recorded"))(w, r)
		return
	}
	title := upstreamtest.LastUserMessage(body)
	reply(cmpl("", call{ID: "c", Name: "add_preferences", Arguments: args(map[string]any{"items": []map[string]string{{"title": title}}})}))(w, r)
}

// TestConcurrentTurns runs 50 turns at once on one thread, while users add, lock and rename
// preferences of it through the admin REST, and 50 turns on 50 threads: the result is one a
// serial execution gives — every write once, turn numbers 1..50, indices contiguous.
func TestConcurrentTurns(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.up.Fallback = recordingModel
	const n = 50
	var wg sync.WaitGroup
	turn := func(thread, title string) {
		resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": thread},
			fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, title))
		if resp.StatusCode != 200 {
			t.Errorf("turn %s: %d %s", title, resp.StatusCode, testkit.ReadBody(t, resp))
		}
	}
	for i := range n {
		wg.Go(func() { turn("one", fmt.Sprintf("Agent %02d", i)) })
		wg.Go(func() { turn(fmt.Sprintf("many-%02d", i), "Only") })
	}
	for i := range 10 {
		wg.Go(func() {
			var p workspace.Preference
			e.admin("POST", "/admin/v1/threads/one/preferences", map[string]any{"title": fmt.Sprintf("User %02d", i)}, 201, &p)
			e.admin("PATCH", "/admin/v1/threads/one/preferences/"+strconv.FormatInt(p.ID, 10),
				map[string]any{"locked": true, "title": fmt.Sprintf("User %02d (renamed)", i)}, 200, nil)
		})
	}
	wg.Wait()

	d := e.workspace("one")
	var titles []string
	for i, p := range d.Preferences {
		require.Equal(t, i+1, p.Index, "indices are contiguous")
		if i > 0 {
			require.Greater(t, p.ID, d.Preferences[i-1].ID, "creation order")
		}
		titles = append(titles, p.Title)
	}
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("Agent %02d", i))
	}
	for i := range 10 {
		want = append(want, fmt.Sprintf("User %02d (renamed)", i))
	}
	sort.Strings(titles)
	require.Equal(t, want, titles, "every write exactly once")

	// Turns 1..n, each with the workspace of the snapshot that applies to it: snapshots in turn
	// order, each different from the one before (a turn that found no change stored none).
	require.Equal(t, n, e.turns("one"))
	var snaps page[workspace.Snapshot]
	e.admin("GET", "/admin/v1/threads/one/snapshots?limit=500", nil, 200, &snaps)
	require.Equal(t, 1, snaps.Data[0].Turn)
	for i := 1; i < len(snaps.Data); i++ {
		require.Greater(t, snaps.Data[i].Turn, snaps.Data[i-1].Turn)
		require.LessOrEqual(t, snaps.Data[i].Turn, n)
		require.NotEqual(t, snaps.Data[i-1].Preferences, snaps.Data[i].Preferences)
	}
	for i := range n {
		require.Len(t, e.workspace(fmt.Sprintf("many-%02d", i)).Preferences, 1)
	}
}
