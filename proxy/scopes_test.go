package proxy

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
)

// scoped gives e the scopes of docs/spec.md §17: repo-x and alice, each with a preference, and
// thread t whose parents are repo-x then alice.
func (e *env) scoped() {
	e.t.Helper()
	e.admin("POST", "/admin/v1/threads/repo-x/preferences", map[string]any{"title": "Go 1.26, no cgo", "kind": "hard", "locked": true}, 201, nil)
	e.admin("POST", "/admin/v1/threads/alice/preferences", map[string]any{"title": "Tabs over spaces", "kind": "hard"}, 201, nil)
	e.admin("PUT", "/admin/v1/threads/t/parents", map[string]any{"parents": []string{"repo-x", "alice"}}, 200, nil)
}

const scopedBlock = "<workspace>\nObjective: (none yet)\nPreferences: (none yet)\n" +
	"From repo-x (the user's; ask the user to change these):\n- [hard] Go 1.26, no cgo (locked)\n" +
	"From alice (the user's; ask the user to change these):\n- [hard] Tabs over spaces\n</workspace>"

// TestScopesOnTheAdminREST: parents, what they give, children, a move, and the refusals.
func TestScopesOnTheAdminREST(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.scoped()

	var d tools.Detail
	e.admin("GET", "/admin/v1/threads/t", nil, 200, &d)
	require.Equal(t, []string{"repo-x", "alice"}, d.Parents)
	require.Equal(t, scopedBlock, d.Block)
	var raw map[string]json.RawMessage
	e.admin("GET", "/admin/v1/threads/t", nil, 200, &raw)
	require.JSONEq(t, `[{"scope":"repo-x","preferences":[{"id":1,"index":1,"title":"Go 1.26, no cgo","subtitle":"","kind":"hard","locked":true}]},`+
		`{"scope":"alice","preferences":[{"id":1,"index":1,"title":"Tabs over spaces","subtitle":"","kind":"hard","locked":false}]}]`, string(raw["inherited"]))

	var children page[struct{ ID string }]
	e.admin("GET", "/admin/v1/threads/alice/children", nil, 200, &children)
	require.Equal(t, "t", children.Data[0].ID)

	var eb struct{ Error map[string]any }
	e.admin("PUT", "/admin/v1/threads/alice/parents", map[string]any{"parents": []string{"t"}}, 400, &eb)
	require.Equal(t, "invalid_parents", eb.Error["code"])
	e.admin("PUT", "/admin/v1/threads/t/parents", map[string]any{"parents": []string{"bad id"}}, 400, nil)

	// A thread's own item moves to alice: both histories show it, t's block inherits it.
	var p, moved tools.Preference
	e.admin("POST", "/admin/v1/threads/t/preferences", map[string]any{"title": "Answer in French"}, 201, &p)
	e.admin("POST", "/admin/v1/threads/t/preferences/"+id(p)+"/move", map[string]any{"to": "alice"}, 200, &moved)
	require.Equal(t, 2, moved.Index)
	e.admin("GET", "/admin/v1/threads/t", nil, 200, &d)
	require.Empty(t, d.Preferences)
	require.Contains(t, d.Block, "- [hard] Tabs over spaces\n- [soft] Answer in French\n</workspace>")
	for _, thread := range []string{"t", "alice"} {
		var evs page[tools.Event]
		e.admin("GET", "/admin/v1/threads/"+thread+"/events?order=desc&limit=1", nil, 200, &evs)
		require.Equal(t, tools.PreferenceMoved, evs.Data[0].Kind, thread)
	}

	// Review mode, set on alice, is inherited by t.
	e.admin("PATCH", "/admin/v1/threads/alice", map[string]any{"agent_writes": "propose"}, 200, &d)
	require.Equal(t, "propose", d.AgentWrites)
	e.admin("GET", "/admin/v1/threads/t", nil, 200, &d)
	require.Equal(t, "propose", d.AgentWrites)
	require.True(t, d.AgentWritesInherited)
	e.admin("PATCH", "/admin/v1/threads/t", map[string]any{"agent_writes": "sometimes"}, 400, nil)
}

// TestScopesWithClientKeys: a client's parents are in its own namespace; another client's
// thread is not found.
func TestScopesWithClientKeys(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=alice-client-key-000000,bob=bob-client-key-00000000")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys = keys; o.UpstreamAPIKey = "sk-upstream" })
	e.admin("POST", "/admin/v1/threads/bob~secret/preferences", map[string]any{"title": "Bob's"}, 201, nil)
	e.admin("PUT", "/admin/v1/threads/alice~t/parents", map[string]any{"parents": []string{"bob~secret"}}, 404, nil)
	e.admin("PUT", "/admin/v1/threads/alice~t/parents", map[string]any{"parents": []string{"repo-x"}}, 200, nil)
	var d tools.Detail
	e.admin("GET", "/admin/v1/threads/alice~t", nil, 200, &d)
	require.Equal(t, []string{"repo-x"}, d.Parents)
	e.workspace("alice~repo-x") // created empty, in alice's namespace

	// A turn's header names parents in the client's namespace.
	e.up.Script(reply(cmpl("ok")))
	resp := e.post("/v1/chat/completions", map[string]string{"Authorization": "Bearer alice-client-key-000000", "X-Thread-Id": "u",
		"X-Workspace-Parents": "repo-x"}, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, readBody(t, resp))
	require.Equal(t, []string{"repo-x"}, e.workspace("alice~u").Parents)
}

// TestScopesInEveryWireAPI: the inherited block reaches the upstream in chat completions, the
// Responses API and the Messages API; the model's add_preferences of an inherited title records
// nothing and names its scope.
func TestScopesInEveryWireAPI(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.scoped()
	addTabs := args(map[string]any{"items": []map[string]any{{"title": "tabs over spaces"}, {"title": "Short answers"}}, "action_and_reasoning": "r"})

	e.up.Script(reply(cmpl("", call{ID: "c1", Name: "add_preferences", Arguments: addTabs})), reply(cmpl("ok")))
	resp := e.post("/threads/t/v1/chat/completions", nil, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, readBody(t, resp))
	msgs := messages(e.upstreamRequest(0))
	require.Equal(t, "hi\n\nINSTR\n\n"+scopedBlock, msgs[0]["content"])
	msgs = messages(e.upstreamRequest(1))
	require.Equal(t, `{"ok":true,"result":"recorded 1 preference; already recorded (from alice): \"Tabs over spaces\""}`, msgs[2]["content"])
	require.Equal(t, []string{"Short answers"}, e.titles("t"), "the thread's own list only")

	e.up.Script(rspec{ID: "resp_1", Items: []upstreamtest.Item{msgItem("msg_1", "ok")}}.Reply())
	resp = e.post("/threads/t/v1/responses", nil, `{"model":"m","input":"hi"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, readBody(t, resp))
	body, _ := json.Marshal(e.upstreamRequest(2))
	require.Contains(t, string(body), `From repo-x (the user's; ask the user to change these):\n- [hard] Go 1.26, no cgo (locked)`)

	e.up.Script(upstreamtest.Messages(upstreamtest.MessageReply{ID: "msg_1", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("ok")}}))
	_, _, err := runMessages(t, e.anthropicClient("t"), messagesParams("hi"), false)
	require.NoError(t, err)
	body, _ = json.Marshal(e.messagesRequests()[0])
	require.Contains(t, string(body), `From alice (the user's; ask the user to change these):\n- [hard] Tabs over spaces`)
}

// TestThreadParentsForASession: with THREAD_HEADER and THREAD_PARENTS, a new session's thread
// starts with its parents, and its own add_preferences lands in the session's thread.
func TestThreadParentsForASession(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) {
		o.ThreadHeader = "X-Claude-Code-Session-Id"
		o.ThreadParents = []string{"repo-x"}
	})
	e.admin("POST", "/admin/v1/threads/repo-x/preferences", map[string]any{"title": "Go 1.26, no cgo", "kind": "hard"}, 201, nil)
	add := args(map[string]any{"items": []map[string]any{{"title": "Short answers"}}, "action_and_reasoning": "r"})
	e.up.Script(reply(cmpl("", call{ID: "c1", Name: "add_preferences", Arguments: add})), reply(cmpl("ok")))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Claude-Code-Session-Id": "s-1"}, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, readBody(t, resp))
	require.Contains(t, messages(e.upstreamRequest(0))[0]["content"], "From repo-x (the user's; ask the user to change these):\n- [hard] Go 1.26, no cgo")
	require.Equal(t, []string{"Short answers"}, e.titles("s-1"))
	require.Equal(t, []string{"Go 1.26, no cgo"}, e.titles("repo-x"))
	require.Equal(t, []string{"repo-x"}, e.workspace("s-1").Parents)

	// A thread named by the request itself is not a session's: THREAD_PARENTS does not apply.
	e.up.Script(reply(cmpl("ok")))
	resp = e.post("/threads/own/v1/chat/completions", nil, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, readBody(t, resp))
	require.Empty(t, e.workspace("own").Parents)
}
