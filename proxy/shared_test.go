package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// Shared scopes (docs/spec.md §20): the admin's repo-x, shared with alice and bob.

const (
	aliceKey = "sk-alice-secret"
	bobKey   = "sk-bob-secret"
	// sharedHeading is repo-x's heading and item in a client's block: the scope as the client
	// names it.
	sharedHeading = "From ~repo-x (the user's; ask the user to change these):\n- [hard] Go 1.26, no cgo (locked)"
)

// shared gives e the admin's repo-x, with a locked item, shared with alice and bob.
func (e *env) shared() {
	e.t.Helper()
	e.admin("POST", "/admin/v1/threads/repo-x/preferences", map[string]any{"title": "Go 1.26, no cgo", "kind": "hard", "locked": true}, 201, nil)
	var d workspace.Detail
	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"shared_with": []string{"bob", "alice", "bob"}}, 200, &d)
	require.Equal(e.t, []string{"alice", "bob"}, d.SharedWith)
}

// asClient calls the admin REST with a client's key; it returns the status and the body.
func (e *env) asClient(key, method, path string, body any) (int, string) {
	e.t.Helper()
	b := ""
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(e.t, err)
		b = string(raw)
	}
	resp, got := e.do(method, path, map[string]string{"Authorization": "Bearer " + key, "Content-Type": "application/json"}, b)
	return resp.StatusCode, got
}

// turn posts a chat turn of thread with a client's key, naming parents (none when empty).
func (e *env) turn(key, thread, parents string) (int, string) {
	e.t.Helper()
	h := map[string]string{"Authorization": "Bearer " + key, "X-Thread-Id": thread, "Content-Type": "application/json"}
	if parents != "" {
		h["X-Workspace-Parents"] = parents
	}
	resp, body := e.do("POST", "/v1/chat/completions", h, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	return resp.StatusCode, body
}

// TestSharedScopeReachesClients: the admin shares repo-x with alice and bob (GET shows it); a
// turn of each that names ~repo-x carries its item in the block, under its heading, and the
// thread's GET names it ~repo-x; a plain repo-x stays the client's own. Only the admin shares,
// and only a workspace outside every client's namespace.
func TestSharedScopeReachesClients(t *testing.T) {
	t.Parallel()
	e, _ := setupAliceAndBob(t)
	e.shared()
	var d workspace.Detail
	e.admin("GET", "/admin/v1/threads/repo-x", nil, 200, &d)
	require.Equal(t, []string{"alice", "bob"}, d.SharedWith)

	for i, key := range []string{aliceKey, bobKey} {
		e.up.Script(reply(cmpl("ok")))
		status, body := e.turn(key, "session", "~repo-x, me")
		require.Equal(t, http.StatusOK, status, body)
		require.Contains(t, messages(e.upstreamRequest(i))[0]["content"], sharedHeading)
	}
	for _, client := range []string{"alice", "bob"} {
		got := e.workspace(client + "~session")
		require.Equal(t, []string{"~repo-x", "me"}, got.Parents, client)
		require.Len(t, got.Inherited, 1)
		raw, err := json.Marshal(got.Inherited[0])
		require.NoError(t, err)
		require.Contains(t, string(raw), `"scope":"~repo-x"`)
		require.Contains(t, got.Block, sharedHeading)
	}
	e.workspace("alice~me") // a plain name: the client's own, created empty
	var set page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/alice~session/events", nil, 200, &set)
	require.Equal(t, workspace.ParentsSet, set.Data[0].Kind)
	require.JSONEq(t, `{"parents":["~repo-x","me"]}`, string(set.Data[0].After), "the history names them as alice does")

	// A plain repo-x is alice's own, not the shared one.
	e.up.Script(reply(cmpl("ok")))
	status, body := e.turn(aliceKey, "plain", "repo-x")
	require.Equal(t, http.StatusOK, status, body)
	require.NotContains(t, messages(e.upstreamRequest(2))[0]["content"], "Go 1.26")
	require.Equal(t, []string{"repo-x"}, e.workspace("alice~plain").Parents)

	// Only the admin shares, and only the admin's workspaces.
	status, body = e.asClient(aliceKey, "PATCH", "/admin/v1/threads/alice~plain", map[string]any{"shared_with": []string{"bob"}})
	require.Equal(t, http.StatusForbidden, status, body)
	require.Contains(t, body, `"code":"admin_only"`)
	var eb struct{ Error map[string]any }
	e.admin("PATCH", "/admin/v1/threads/alice~plain", map[string]any{"shared_with": []string{"bob"}}, 400, &eb)
	require.Equal(t, "shared_with", eb.Error["param"])
	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"shared_with": []string{"*", "bob"}}, 400, nil)
	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"shared_with": []string{"no~pe"}}, 400, nil)
	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"shared_with": "alice"}, 400, nil)
	e.admin("PATCH", "/admin/v1/threads/nowhere", map[string]any{"shared_with": []string{"alice"}}, 404, nil)
	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/repo-x/events?order=desc&limit=1", nil, 200, &evs)
	require.Equal(t, workspace.SharedWithSet, evs.Data[0].Kind)
	require.JSONEq(t, `{"shared_with":["alice","bob"]}`, string(evs.Data[0].After))
}

// TestSharedScopeReadOnlyToClients: neither alice nor bob changes repo-x — not by a turn's tool
// call (its item has no index; an equal title is "already recorded (from ~repo-x)"), not over
// MCP (naming ~repo-x: a tool error), not over the admin REST (403 on every route of it, its
// history and children included, and on a move into it) — and neither sees the other's threads
// through it.
func TestSharedScopeReadOnlyToClients(t *testing.T) {
	t.Parallel()
	e, _ := setupAliceAndBob(t)
	e.shared()
	e.up.Script(reply(cmpl("ok")))
	status, body := e.turn(bobKey, "bobs", "~repo-x")
	require.Equal(t, http.StatusOK, status, body)
	before := e.workspace("repo-x")

	// A turn: the model's add_preferences of repo-x's title records nothing; its update of #1
	// names the thread's own list, which is empty.
	add := args(map[string]any{"items": []map[string]any{{"title": "go 1.26, NO cgo"}}, "action_and_reasoning": "r"})
	update := args(map[string]any{"updates": []map[string]any{{"index": 1, "title": "Go 1.25"}}, "action_and_reasoning": "r"})
	e.up.Script(reply(cmpl("", call{ID: "c1", Name: "add_preferences", Arguments: add}, call{ID: "c2", Name: "update_preferences", Arguments: update})),
		reply(cmpl("ok")))
	status, body = e.turn(aliceKey, "alices", "~repo-x")
	require.Equal(t, http.StatusOK, status, body)
	results := e.toolResults(2)
	require.Contains(t, results[0], `already recorded (from ~repo-x)`)
	require.Contains(t, results[1], "out of range: #1")
	require.Empty(t, e.workspace("alice~alices").Preferences)

	// MCP: a client's tool call naming ~repo-x is refused, as one naming a scope not shared is
	// an unknown thread.
	cs := testkit.MCPConnect(t, e.srv.URL, aliceKey, testkit.MCPLatest, nil)
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"add_preferences", map[string]any{"thread": "~repo-x", "items": []map[string]any{{"title": "Tabs"}}, "action_and_reasoning": "r"}},
		{"remove_preferences", map[string]any{"thread": "~repo-x", "indices": []int{1}, "action_and_reasoning": "r"}},
		{"set_objective", map[string]any{"thread": "~repo-x", "text": "Take over", "action_and_reasoning": "r"}},
	} {
		text, isErr := testkit.MCPCall(t, cs, c.tool, c.args)
		require.True(t, isErr, text)
		require.Contains(t, text, "shared scope is read-only", c.tool)
	}
	text, isErr := testkit.MCPCall(t, cs, "add_preferences", map[string]any{"thread": "~other", "items": []map[string]any{{"title": "Tabs"}}, "action_and_reasoning": "r"})
	require.True(t, isErr)
	require.Contains(t, text, `unknown thread "~other"`)

	// The admin REST: every route of repo-x is 403 to a client it is shared with (by either
	// name), and 404 to one it is not.
	pref := id(before.Preferences[0])
	for _, path := range []string{"repo-x", "~repo-x"} {
		for _, r := range []struct {
			method, path string
			body         any
		}{
			{"GET", "", nil},
			{"PATCH", "", map[string]any{"agent_writes": "propose"}},
			{"DELETE", "", nil},
			{"PUT", "/objective", map[string]any{"text": "Take over"}},
			{"PUT", "/parents", map[string]any{"parents": []string{}}},
			{"POST", "/preferences", map[string]any{"title": "Tabs"}},
			{"PATCH", "/preferences/" + pref, map[string]any{"locked": false}},
			{"DELETE", "/preferences/" + pref, nil},
			{"GET", "/events", nil},
			{"GET", "/snapshots", nil},
			{"GET", "/tool-calls", nil},
			{"GET", "/children", nil},
			{"POST", "/links", map[string]any{}},
		} {
			status, body := e.asClient(aliceKey, r.method, "/admin/v1/threads/"+path+r.path, r.body)
			require.Equal(t, http.StatusForbidden, status, "%s %s%s: %s", r.method, path, r.path, body)
			require.Contains(t, body, `"code":"shared_scope_read_only"`)
		}
	}
	status, body = e.asClient(aliceKey, "GET", "/admin/v1/threads/other", nil)
	require.Equal(t, http.StatusNotFound, status, body)
	var mine workspace.Preference
	status, body = e.asClient(aliceKey, "POST", "/admin/v1/threads/alice~alices/preferences", map[string]any{"title": "Mine"})
	require.Equal(t, http.StatusCreated, status, body)
	require.NoError(t, json.Unmarshal([]byte(body), &mine))
	status, body = e.asClient(aliceKey, "POST", "/admin/v1/threads/alice~alices/preferences/"+id(mine)+"/move", map[string]any{"to": "~repo-x"})
	require.Equal(t, http.StatusForbidden, status, body)
	status, body = e.asClient(aliceKey, "PUT", "/admin/v1/threads/alice~alices/parents", map[string]any{"parents": []string{"~repo-x"}})
	require.Equal(t, http.StatusOK, status, "naming it as a parent is reading it: %s", body)

	after := e.workspace("repo-x")
	require.Equal(t, before.Preferences, after.Preferences, "repo-x is unchanged")
	require.Equal(t, before.Objective, after.Objective)
	require.Equal(t, before.LastEventID, after.LastEventID, "no event in repo-x")

	// Neither sees the other's threads: each lists its own; what each reads of its thread names
	// repo-x's items, never the other's thread.
	var threads page[workspace.Thread]
	status, body = e.asClient(aliceKey, "GET", "/admin/v1/threads?limit=500", nil)
	require.Equal(t, http.StatusOK, status, body)
	require.NoError(t, json.Unmarshal([]byte(body), &threads))
	for _, th := range threads.Data {
		require.True(t, strings.HasPrefix(th.ID, "alice~"), th.ID)
	}
	status, body = e.asClient(aliceKey, "GET", "/admin/v1/threads/alice~alices", nil)
	require.Equal(t, http.StatusOK, status, body)
	require.NotContains(t, body, "bob")
	status, body = e.asClient(aliceKey, "GET", "/admin/v1/threads/bob~bobs", nil)
	require.Equal(t, http.StatusNotFound, status, body)
	var children page[struct{ ID string }]
	e.admin("GET", "/admin/v1/threads/repo-x/children", nil, 200, &children)
	require.Len(t, children.Data, 2, "the admin sees both")
}

// TestSharedScopeNotSharedOrUnshared: a ~name not shared with the client is 404 and creates
// nothing (neither the thread of the turn nor the scope); shared with another client only, the
// same; unsharing ends the inheritance at the next turn, for the client it no longer names
// alone; "*" shares with every client.
func TestSharedScopeNotSharedOrUnshared(t *testing.T) {
	t.Parallel()
	e, _ := setupAliceAndBob(t)
	e.admin("POST", "/admin/v1/threads/repo-x/preferences", map[string]any{"title": "Go 1.26, no cgo", "kind": "hard", "locked": true}, 201, nil)

	for _, parents := range []string{"~repo-x", "~nowhere", "me, ~nowhere"} {
		status, body := e.turn(aliceKey, "s1", parents)
		require.Equal(t, http.StatusNotFound, status, "%s: %s", parents, body)
	}
	require.Empty(t, e.up.Requests(), "nothing reached the upstream")
	for _, thread := range []string{"alice~s1", "nowhere", "alice~me"} {
		e.admin("GET", "/admin/v1/threads/"+thread, nil, 404, nil)
	}
	status, body := e.asClient(aliceKey, "PUT", "/admin/v1/threads/alice~s2/parents", map[string]any{"parents": []string{"~repo-x"}})
	require.Equal(t, http.StatusNotFound, status, body)

	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"shared_with": []string{"bob"}}, 200, nil)
	status, body = e.turn(aliceKey, "s1", "~repo-x")
	require.Equal(t, http.StatusNotFound, status, "shared with bob only: %s", body)

	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"shared_with": []string{"*"}}, 200, nil)
	for i, key := range []string{aliceKey, bobKey} {
		e.up.Script(reply(cmpl("ok")))
		status, body = e.turn(key, "s1", "~repo-x")
		require.Equal(t, http.StatusOK, status, body)
		require.Contains(t, messages(e.upstreamRequest(i))[0]["content"], sharedHeading)
	}

	// Unshared from alice: her next turn inherits nothing (its header unchanged), bob's still.
	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"shared_with": []string{"bob"}}, 200, nil)
	for i, key := range []string{aliceKey, bobKey} {
		e.up.Script(reply(cmpl("ok")))
		status, body = e.turn(key, "s1", "~repo-x")
		require.Equal(t, http.StatusOK, status, body)
		content := messages(e.upstreamRequest(2 + i))[0]["content"]
		if key == aliceKey {
			require.NotContains(t, content, "Go 1.26")
		} else {
			require.Contains(t, content, sharedHeading)
		}
	}
	require.Empty(t, e.workspace("alice~s1").Inherited)
	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"shared_with": nil}, 200, nil)
	e.up.Script(reply(cmpl("ok")))
	status, body = e.turn(bobKey, "s1", "")
	require.Equal(t, http.StatusOK, status, body)
	require.NotContains(t, messages(e.upstreamRequest(4))[0]["content"], "Go 1.26")
}
