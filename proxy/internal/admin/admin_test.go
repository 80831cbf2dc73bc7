package admin

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

func TestAdminAuth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, auth := range []string{"", "Bearer wrong", adminToken, "Bearer " + adminToken + "x"} {
		req, err := http.NewRequest("GET", e.srv.URL+"/admin/v1/threads", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, auth)
		testkit.RequireErrorBody(t, string(body), "invalid_request_error", "invalid_admin_token")
	}
	// Unknown admin routes need the token too, then 404.
	e.admin("GET", "/admin/v1/nothing", nil, 404, nil)
}

func TestAdminWorkspace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.admin("GET", "/admin/v1/threads/t1", nil, 404, nil)

	var o workspace.Objective
	e.admin("PUT", "/admin/v1/threads/t1/objective", map[string]any{"text": "Write a review"}, 200, &o)
	require.Equal(t, "Write a review", o.Text)
	require.Equal(t, "user", o.UpdatedBy)

	var a, b workspace.Preference
	e.admin("POST", "/admin/v1/threads/t1/preferences", map[string]any{"title": "Academic tone", "subtitle": "Formal", "kind": "hard"}, 201, &a)
	require.Equal(t, 1, a.Index)
	require.Equal(t, "hard", a.Kind)
	require.False(t, a.Locked)
	e.admin("POST", "/admin/v1/threads/t1/preferences", map[string]any{"title": "No jargon", "locked": true}, 201, &b)
	require.Equal(t, 2, b.Index)
	require.Equal(t, "soft", b.Kind)
	require.True(t, b.Locked)

	// The rules of the tools hold on the user path: duplicates 409, limits and kinds 400.
	var eb struct{ Error map[string]any }
	e.admin("POST", "/admin/v1/threads/t1/preferences", map[string]any{"title": " academic  TONE"}, 409, &eb)
	require.Contains(t, eb.Error["message"], `#1 "Academic tone"`)
	e.admin("POST", "/admin/v1/threads/t1/preferences", map[string]any{"title": "x", "kind": "medium"}, 400, &eb)
	require.Equal(t, "kind", eb.Error["param"])
	e.admin("POST", "/admin/v1/threads/t1/preferences", map[string]any{"title": strings.Repeat("x", 201)}, 400, nil)
	e.admin("POST", "/admin/v1/threads/t1/preferences", map[string]any{"subtitle": "no title"}, 400, nil)
	e.admin("POST", "/admin/v1/threads/t1/preferences", map[string]any{"title": "x", "colour": "red"}, 400, &eb)
	require.Equal(t, "colour", eb.Error["param"])
	e.admin("PUT", "/admin/v1/threads/t1/objective", map[string]any{"text": ""}, 400, nil)
	e.admin("PATCH", "/admin/v1/threads/t1/preferences/"+id(b), map[string]any{"title": "Academic tone"}, 409, nil)
	e.admin("POST", "/admin/v1/threads/bad%20id/preferences", map[string]any{"title": "x"}, 400, nil)

	// Locks: the user path ignores them, and is where they are set.
	var p workspace.Preference
	e.admin("PATCH", "/admin/v1/threads/t1/preferences/"+id(b), map[string]any{"title": "Plain words", "kind": "hard"}, 200, &p)
	require.Equal(t, "Plain words", p.Title)
	require.True(t, p.Locked)
	require.Equal(t, 2, p.Index)
	e.admin("PATCH", "/admin/v1/threads/t1/preferences/"+id(a), map[string]any{"locked": true}, 200, &p)
	require.True(t, p.Locked)
	e.admin("PATCH", "/admin/v1/threads/t1/preferences/"+id(a), map[string]any{"locked": false}, 200, &p)
	require.False(t, p.Locked)
	e.admin("PATCH", "/admin/v1/threads/t1/preferences/999", map[string]any{"locked": false}, 404, nil)
	e.admin("PATCH", "/admin/v1/threads/t1/preferences/abc", map[string]any{"locked": false}, 404, nil)
	e.admin("PATCH", "/admin/v1/threads/nope/preferences/1", map[string]any{"locked": false}, 404, nil)

	var d workspace.Detail
	e.admin("GET", "/admin/v1/threads/t1", nil, 200, &d)
	require.Equal(t, "t1", d.ID)
	require.Equal(t, "Write a review", d.Objective.Text)
	require.Len(t, d.Preferences, 2)
	require.Equal(t, "<workspace>\nObjective: Write a review\nPreferences:\n#1 [hard] Academic tone — Formal\n#2 [hard] Plain words (locked)\n</workspace>", d.Block)

	// Raw shape of the thread's GET.
	var raw map[string]any
	e.admin("GET", "/admin/v1/threads/t1", nil, 200, &raw)
	require.ElementsMatch(t, []string{"id", "objective", "preferences", "block", "usage", "parents", "inherited", "agent_writes",
		"agent_writes_inherited", "untrusted_writes", "untrusted_writes_inherited", "inherited_by", "shared_with", "title", "agent", "first_words"}, keys(raw))
	require.Equal(t, "propose", raw["untrusted_writes"], "the deployment's default")
	require.Equal(t, map[string]any{"prompt_tokens": 0.0, "cached_prompt_tokens": 0.0, "completion_tokens": 0.0, "cache_write_tokens": 0.0}, raw["usage"])
	require.ElementsMatch(t, []string{"text", "updated_at", "updated_by", "source"}, keys(raw["objective"].(map[string]any)))
	require.ElementsMatch(t, []string{"id", "index", "title", "subtitle", "kind", "locked", "source", "created_at", "updated_at"},
		keys(raw["preferences"].([]any)[0].(map[string]any)))

	// Stable ids: deleting #1 keeps the other's id; its index moves.
	e.admin("DELETE", "/admin/v1/threads/t1/preferences/"+id(a), nil, 204, nil)
	e.admin("DELETE", "/admin/v1/threads/t1/preferences/"+id(a), nil, 404, nil)
	e.admin("GET", "/admin/v1/threads/t1", nil, 200, &d)
	require.Equal(t, b.ID, d.Preferences[0].ID)
	require.Equal(t, 1, d.Preferences[0].Index)

	var threads page[map[string]any]
	e.admin("GET", "/admin/v1/threads", nil, 200, &threads)
	require.Len(t, threads.Data, 1)
	require.Equal(t, "Write a review", threads.Data[0]["objective"])
	require.Equal(t, float64(1), threads.Data[0]["preference_count"])
	require.Equal(t, float64(0), threads.Data[0]["turns"])
	require.ElementsMatch(t, []string{"id", "created_at", "updated_at", "turns", "objective", "preference_count", "cursor",
		"title", "agent", "first_words", "parents", "children", "pending_proposals"}, keys(threads.Data[0]))

	e.admin("DELETE", "/admin/v1/threads/t1", nil, 204, nil)
	e.admin("DELETE", "/admin/v1/threads/t1", nil, 404, nil)
	e.admin("GET", "/admin/v1/threads/t1/snapshots", nil, 404, nil)
	e.admin("GET", "/admin/v1/threads/t1/tool-calls", nil, 404, nil)
}
