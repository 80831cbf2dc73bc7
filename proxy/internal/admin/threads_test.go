package admin

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/workspace"
)

// TestLinkListsItsThreadAlone: a link's holder lists its one thread, exactly — never another
// whose id starts with the link's (a client's alice~… threads under a link to the plain thread
// alice), whichever was updated last.
func TestLinkListsItsThreadAlone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, th := range []string{"alice~a1", "alice", "alice~a2"} {
		e.admin("PUT", "/admin/v1/threads/"+th+"/objective", map[string]any{"text": "goal of " + th}, 200, nil)
	}
	var l struct {
		URL string `json:"url"`
	}
	e.admin("POST", "/admin/v1/threads/alice/links", nil, 201, &l)
	visitor := e.panelClient()
	code, _ := visitor.do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 200, code)
	list := func(query string) []workspace.Thread {
		code, body := visitor.do("GET", "/admin/v1/threads"+query, "", nil)
		require.Equal(t, 200, code, body)
		var p page[workspace.Thread]
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		require.False(t, p.HasMore)
		return p.Data
	}
	ids := func(threads []workspace.Thread) []string {
		out := []string{}
		for _, th := range threads {
			out = append(out, th.ID)
		}
		return out
	}

	// alice~a2 is the most recent: the link still lists alice, and only alice.
	require.Equal(t, []string{"alice"}, ids(list("")))
	// alice the most recent: alice~a1 and alice~a2 stay hidden.
	e.admin("PUT", "/admin/v1/threads/alice/objective", map[string]any{"text": "newer goal"}, 200, nil)
	got := list("")
	require.Equal(t, []string{"alice"}, ids(got))
	require.Equal(t, "newer goal", *got[0].Objective)
	require.Equal(t, []string{"alice"}, ids(list("?q=ali")))
	require.Empty(t, list("?q=alice~"))
	require.Empty(t, list("?q=bob"))
	require.Equal(t, []string{"alice"}, ids(list("?limit=1")))
	require.Empty(t, list("?after="+url.QueryEscape(got[0].Cursor)), "one page")
}

// TestThreadPagesKeepTheirPlace: the thread list pages by the last row it returned (its
// updated_at and id, in its cursor): the cursor's thread deleted, or moved to the top by an edit,
// the next page goes on where the last one ended, without a gap or a repeat.
func TestThreadPagesKeepTheirPlace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, th := range []string{"p0", "p1", "p2", "p3", "p4", "p5"} {
		e.admin("PUT", "/admin/v1/threads/"+th+"/objective", map[string]any{"text": "goal"}, 200, nil)
	}
	pageOf := func(after string) (ids []string, cursor string) {
		var p page[map[string]any]
		e.admin("GET", "/admin/v1/threads?limit=2&after="+after, nil, 200, &p)
		for _, th := range p.Data {
			ids = append(ids, th["id"].(string))
		}
		last := p.Data[len(p.Data)-1]
		return ids, last["cursor"].(string)
	}
	ids, cursor := pageOf("")
	require.Equal(t, []string{"p5", "p4"}, ids)
	e.admin("DELETE", "/admin/v1/threads/p4", nil, 204, nil)
	ids, cursor = pageOf(cursor)
	require.Equal(t, []string{"p3", "p2"}, ids, "the cursor's thread was deleted")
	e.admin("PUT", "/admin/v1/threads/p2/objective", map[string]any{"text": "moved to the top"}, 200, nil)
	ids, _ = pageOf(cursor)
	require.Equal(t, []string{"p1", "p0"}, ids, "the cursor's thread moved")

	// A bare thread id still pages from that thread's place as it is now; a broken cursor is a 400.
	ids, _ = pageOf("p3")
	require.Equal(t, []string{"p1", "p0"}, ids)
	e.admin("GET", "/admin/v1/threads?after=x,p3", nil, 400, nil)
}
