package admin

import (
	"encoding/json"
	"net/url"
	"slices"
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
	code, _ := visitor.Do("GET", strings.TrimPrefix(l.URL, e.srv.URL), "", nil)
	require.Equal(t, 200, code)
	list := func(query string) []workspace.Thread {
		code, body := visitor.Do("GET", "/admin/v1/threads"+query, "", nil)
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

// TestThreadListTellsSessionsApart (docs/spec.md §13, §17; #56): the list gives each thread its
// title, parents, children's count (a scope has some) and waiting proposals; ?parent= lists a
// scope's sessions (in the caller's namespace), ?search= finds a thread by its title, objective or
// a part of its name; PATCH {"title"} names a thread (null clears it) without moving it in the
// list; PUT creates an empty thread (201, then 200); PATCH of a preference's source "confirmed"
// confirms it, any other source is a 400.
func TestThreadListTellsSessionsApart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.admin("PUT", "/admin/v1/threads/repo-x", nil, 201, nil)
	e.admin("PUT", "/admin/v1/threads/repo-x", nil, 200, nil)
	e.admin("PUT", "/admin/v1/threads/b9f1-session/objective", map[string]any{"text": "Fix the Safari login loop"}, 200, nil)
	e.admin("PUT", "/admin/v1/threads/b9f1-session/parents", map[string]any{"parents": []string{"repo-x"}}, 200, nil)
	e.admin("PUT", "/admin/v1/threads/c2aa-session/parents", map[string]any{"parents": []string{"repo-x"}}, 200, nil)
	e.admin("PUT", "/admin/v1/threads/other/objective", map[string]any{"text": "Unrelated"}, 200, nil)
	_, err := e.pool.Exec(t.Context(), `INSERT INTO events (thread_id, id, actor, via, kind, target_type, proposed) VALUES
		('c2aa-session', 100, 'agent', 'proxy', 'proposed', 'preference', '{"title":"A","subtitle":"","kind":"soft"}'),
		('c2aa-session', 101, 'agent', 'proxy', 'proposed', 'preference', '{"title":"B","subtitle":"","kind":"soft"}')`)
	require.NoError(t, err)
	list := func(query string) map[string]workspace.Thread {
		var p page[workspace.Thread]
		e.admin("GET", "/admin/v1/threads"+query, nil, 200, &p)
		out := map[string]workspace.Thread{}
		for _, th := range p.Data {
			out[th.ID] = th
		}
		return out
	}
	all := list("")
	require.Len(t, all, 4)
	require.Equal(t, 2, all["repo-x"].Children, "a scope")
	require.Equal(t, []string{}, all["repo-x"].Parents)
	require.Equal(t, []string{"repo-x"}, all["c2aa-session"].Parents)
	require.Equal(t, 2, all["c2aa-session"].PendingProposals)
	require.Zero(t, all["b9f1-session"].PendingProposals)
	require.Nil(t, all["b9f1-session"].Title)
	require.Nil(t, all["b9f1-session"].Agent, "no turn yet")

	keys := func(m map[string]workspace.Thread) []string {
		out := []string{}
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	require.Equal(t, []string{"b9f1-session", "c2aa-session"}, keys(list("?parent=repo-x")))
	require.Equal(t, []string{"b9f1-session"}, keys(list("?search=safari")), "by its objective")
	require.Equal(t, []string{"b9f1-session", "c2aa-session"}, keys(list("?search=SESSION")), "past the id's start")
	e.admin("GET", "/admin/v1/threads?parent=alice~repo-x", nil, 400, nil)

	// A title names it, and does not move it in the list.
	before := list("")["c2aa-session"].UpdatedAt
	var d map[string]any
	e.admin("PATCH", "/admin/v1/threads/c2aa-session", map[string]any{"title": "  Payments refactor "}, 200, &d)
	th := list("?search=payments")["c2aa-session"]
	require.Equal(t, "Payments refactor", *th.Title)
	require.Equal(t, before, th.UpdatedAt)
	e.admin("PATCH", "/admin/v1/threads/c2aa-session", map[string]any{"title": strings.Repeat("x", 201)}, 400, nil)
	e.admin("PATCH", "/admin/v1/threads/c2aa-session", map[string]any{"title": 7}, 400, nil)
	e.admin("PATCH", "/admin/v1/threads/c2aa-session", map[string]any{"title": nil}, 200, nil)
	require.Nil(t, list("")["c2aa-session"].Title)
	e.admin("PATCH", "/admin/v1/threads/nobody", map[string]any{"title": "x"}, 404, nil)

	// Confirming an item: the one source the user path sets.
	var p workspace.Preference
	e.admin("POST", "/admin/v1/threads/other/preferences", map[string]any{"title": "Tabs"}, 201, &p)
	_, err = e.pool.Exec(t.Context(), `UPDATE preferences SET source = 'unconfirmed' WHERE thread_id = 'other'`)
	require.NoError(t, err)
	e.admin("PATCH", "/admin/v1/threads/other/preferences/1", map[string]any{"source": "user"}, 400, nil)
	e.admin("PATCH", "/admin/v1/threads/other/preferences/1", map[string]any{"source": "confirmed"}, 200, &p)
	require.Equal(t, "confirmed", p.Source)
	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/other/events?order=desc&limit=1", nil, 200, &evs)
	require.Equal(t, "preference_updated", evs.Data[0].Kind, "a change of its source, in the history")
}
