package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
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

	var d workspace.Detail
	e.admin("GET", "/admin/v1/threads/t", nil, 200, &d)
	require.Equal(t, []string{"repo-x", "alice"}, d.Parents)
	require.Equal(t, scopedBlock, d.Block)
	var raw map[string]json.RawMessage
	e.admin("GET", "/admin/v1/threads/t", nil, 200, &raw)
	require.JSONEq(t, `[{"scope":"repo-x","preferences":[{"id":1,"index":1,"title":"Go 1.26, no cgo","subtitle":"","kind":"hard","locked":true,"source":"user"}]},`+
		`{"scope":"alice","preferences":[{"id":1,"index":1,"title":"Tabs over spaces","subtitle":"","kind":"hard","locked":false,"source":"user"}]}]`, string(raw["inherited"]))

	var children page[struct{ ID string }]
	e.admin("GET", "/admin/v1/threads/alice/children", nil, 200, &children)
	require.Equal(t, "t", children.Data[0].ID)

	var eb struct{ Error map[string]any }
	e.admin("PUT", "/admin/v1/threads/alice/parents", map[string]any{"parents": []string{"t"}}, 400, &eb)
	require.Equal(t, "invalid_parents", eb.Error["code"])
	e.admin("PUT", "/admin/v1/threads/t/parents", map[string]any{"parents": []string{"bad id"}}, 400, nil)

	// A thread's own item moves to alice: both histories show it, t's block inherits it.
	var p, moved workspace.Preference
	e.admin("POST", "/admin/v1/threads/t/preferences", map[string]any{"title": "Answer in French"}, 201, &p)
	e.admin("POST", "/admin/v1/threads/t/preferences/"+id(p)+"/move", map[string]any{"to": "alice"}, 200, &moved)
	require.Equal(t, 2, moved.Index)
	e.admin("GET", "/admin/v1/threads/t", nil, 200, &d)
	require.Empty(t, d.Preferences)
	require.Contains(t, d.Block, "- [hard] Tabs over spaces\n- [soft] Answer in French\n</workspace>")
	for _, thread := range []string{"t", "alice"} {
		var evs page[workspace.Event]
		e.admin("GET", "/admin/v1/threads/"+thread+"/events?order=desc&limit=1", nil, 200, &evs)
		require.Equal(t, workspace.PreferenceMoved, evs.Data[0].Kind, thread)
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
	var d workspace.Detail
	e.admin("GET", "/admin/v1/threads/alice~t", nil, 200, &d)
	require.Equal(t, []string{"repo-x"}, d.Parents)
	e.workspace("alice~repo-x") // created empty, in alice's namespace

	// A turn's header names parents in the client's namespace.
	e.up.Script(reply(cmpl("ok")))
	resp := e.post("/v1/chat/completions", map[string]string{"Authorization": "Bearer alice-client-key-000000", "X-Thread-Id": "u",
		"X-Workspace-Parents": "repo-x"}, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, testkit.ReadBody(t, resp))
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
	require.Equal(t, http.StatusOK, resp.StatusCode, testkit.ReadBody(t, resp))
	msgs := messages(e.upstreamRequest(0))
	require.Equal(t, "hi\n\nINSTR\n\n"+scopedBlock, msgs[0]["content"])
	msgs = messages(e.upstreamRequest(1))
	require.Equal(t, `{"ok":true,"result":"recorded 1 preference; already recorded (from alice): \"Tabs over spaces\""}`, msgs[2]["content"])
	require.Equal(t, []string{"Short answers"}, e.titles("t"), "the thread's own list only")

	e.up.Script(rspec{ID: "resp_1", Items: []upstreamtest.Item{msgItem("msg_1", "ok")}}.Reply())
	resp = e.post("/threads/t/v1/responses", nil, `{"model":"m","input":"hi"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, testkit.ReadBody(t, resp))
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
		o.ThreadHeaders = []string{"X-Claude-Code-Session-Id"}
		o.ThreadParents = []string{"repo-x"}
	})
	e.admin("POST", "/admin/v1/threads/repo-x/preferences", map[string]any{"title": "Go 1.26, no cgo", "kind": "hard"}, 201, nil)
	add := args(map[string]any{"items": []map[string]any{{"title": "Short answers"}}, "action_and_reasoning": "r"})
	e.up.Script(reply(cmpl("", call{ID: "c1", Name: "add_preferences", Arguments: add})), reply(cmpl("ok")))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Claude-Code-Session-Id": "s-1"}, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Contains(t, messages(e.upstreamRequest(0))[0]["content"], "From repo-x (the user's; ask the user to change these):\n- [hard] Go 1.26, no cgo")
	require.Equal(t, []string{"Short answers"}, e.titles("s-1"))
	require.Equal(t, []string{"Go 1.26, no cgo"}, e.titles("repo-x"))
	require.Equal(t, []string{"repo-x"}, e.workspace("s-1").Parents)

	// A thread named by the request itself is not a session's: THREAD_PARENTS does not apply.
	e.up.Script(reply(cmpl("ok")))
	resp = e.post("/threads/own/v1/chat/completions", nil, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Empty(t, e.workspace("own").Parents)
}

// nextScope reads s up to its next event `scope` (skipping the thread's own) and returns its
// data.
func nextScope(t testing.TB, s *testkit.EventStream) (scope string, event int64) {
	t.Helper()
	named := false
	for {
		line, err := s.RD.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "event: scope":
			named = true
		case strings.HasPrefix(line, "id: "):
			require.False(t, named, "a scope event carries no id")
		case strings.HasPrefix(line, "data: ") && named:
			var d struct {
				Scope string
				Event int64
			}
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d), line)
			return d.Scope, d.Event
		}
	}
}

// TestScopeChangeWakesChildren: a change of a scope, made on one replica, wakes the event stream
// and the MCP subscription of a thread that inherits it — a grandchild too — on another replica
// (same database; only Postgres's notifications wake them: no heartbeat); after the thread's
// parents change, the stream follows its new ancestors.
func TestScopeChangeWakesChildren(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	a.admin("POST", "/admin/v1/threads/alice/preferences", map[string]any{"title": "Tabs over spaces"}, 201, nil)
	a.admin("PUT", "/admin/v1/threads/repo-x/parents", map[string]any{"parents": []string{"alice"}}, 200, nil)
	a.admin("PUT", "/admin/v1/threads/t/parents", map[string]any{"parents": []string{"repo-x"}}, 200, nil)

	// The admin event stream, on a: an event `scope` without an id, naming the ancestor and its event.
	s := a.openStream(a.srv.URL, "t", "", "")
	b.admin("POST", "/admin/v1/threads/alice/preferences", map[string]any{"title": "Answer in French"}, 201, nil)
	var evs page[workspace.Event]
	b.admin("GET", "/admin/v1/threads/alice/events?order=desc&limit=1", nil, 200, &evs)
	scope, event := nextScope(t, s)
	require.Equal(t, "alice", scope, "a grandparent's change")
	require.Equal(t, evs.Data[0].ID, event)
	b.admin("PUT", "/admin/v1/threads/repo-x/objective", map[string]any{"text": "Ship it"}, 200, nil)
	scope, _ = nextScope(t, s)
	require.Equal(t, "repo-x", scope)

	// New parents: the thread's own event; then the stream watches bob, and no longer alice.
	b.admin("PUT", "/admin/v1/threads/t/parents", map[string]any{"parents": []string{"bob"}}, 200, nil)
	id, ev := s.Next()
	require.Equal(t, workspace.ParentsSet, ev.Kind)
	// An event of t's own, read after parents_set, was read by a later wake-up of the stream:
	// the one that read the new ancestors has ended.
	b.admin("PUT", "/admin/v1/threads/t/objective", map[string]any{"text": "Mine"}, 200, nil)
	next, _ := s.Next()
	require.Equal(t, itoa(mustInt(t, id)+1), next)
	b.admin("POST", "/admin/v1/threads/alice/preferences", map[string]any{"title": "No longer t's"}, 201, nil)
	b.admin("POST", "/admin/v1/threads/bob/preferences", map[string]any{"title": "Bob's"}, 201, nil)
	scope, event = nextScope(t, s)
	require.Equal(t, "bob", scope, "the first scope event after the parents changed is bob's, not alice's")
	b.admin("GET", "/admin/v1/threads/bob/events?order=desc&limit=1", nil, 200, &evs)
	require.Equal(t, evs.Data[0].ID, event)

	// An MCP subscription on a, to t's resource, is told of a change of t's scope made on b.
	updated := make(chan string, 100)
	cs := testkit.MCPConnect(t, a.srv.URL, adminToken, testkit.MCPLatest, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) { updated <- req.Params.URI },
	})
	require.NoError(t, cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "workspace://t"}))
	awaitSubscribed(t, a, "t", "workspace://t", updated)
	b.admin("PUT", "/admin/v1/threads/bob/parents", map[string]any{"parents": []string{"carol"}}, 200, nil)
	awaitUpdate(t, updated, "workspace://t")
	b.admin("POST", "/admin/v1/threads/carol/preferences", map[string]any{"title": "Carol's"}, 201, nil)
	awaitUpdate(t, updated, "workspace://t") // a grandparent that became one after the subscription
	read, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://t"})
	require.NoError(t, err)
	require.Contains(t, read.Contents[0].Text, "From carol (the user's; ask the user to change these):\n- [soft] Carol's\n")
}

func mustInt(t *testing.T, s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// TestScopesOverMCP: over MCP (the Go SDK's client), a thread's resource shows what it
// inherits; add_preferences of an inherited title names its scope and adds nothing; in review
// mode a call is a proposal, and writes nothing else.
func TestScopesOverMCP(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.scoped()
	cs := testkit.MCPConnect(t, e.srv.URL, adminToken, testkit.MCPLatest, nil)
	read, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://t"})
	require.NoError(t, err)
	require.Contains(t, read.Contents[0].Text, strings.TrimSuffix(scopedBlock, "</workspace>"))

	text, isError := testkit.MCPCall(t, cs, "add_preferences", map[string]any{"thread": "t",
		"items": []any{map[string]any{"title": "tabs over spaces"}}, "action_and_reasoning": "the user said so"})
	require.False(t, isError, text)
	// As for a title of the thread's own list: "recorded 0 preferences; already recorded: …".
	require.Equal(t, `recorded 0 preferences; already recorded (from alice): "Tabs over spaces"`, text)
	require.Empty(t, e.titles("t"))

	e.admin("PATCH", "/admin/v1/threads/alice", map[string]any{"agent_writes": "propose"}, 200, nil)
	var before page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/t/events", nil, 200, &before)
	text, isError = testkit.MCPCall(t, cs, "add_preferences", map[string]any{"thread": "t",
		"items": []any{map[string]any{"title": "Bullet points"}}, "action_and_reasoning": "the user asked"})
	require.False(t, isError, text)
	require.Equal(t, `proposed; the user will review it: add "Bullet points"`, text)
	require.Empty(t, e.titles("t"))
	var after page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/t/events", nil, 200, &after)
	require.Len(t, after.Data, len(before.Data)+1, "one event: the proposal")
	proposal := after.Data[len(after.Data)-1]
	require.Equal(t, workspace.Proposed, proposal.Kind)
	require.Equal(t, workspace.ViaMCP, proposal.Via)
	var pending page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/t/proposals", nil, 200, &pending)
	require.Len(t, pending.Data, 1)
	require.Equal(t, proposal.ID, pending.Data[0].ID)
	for _, scope := range []string{"alice", "repo-x"} {
		require.Len(t, e.workspace(scope).Preferences, 1, "a scope is untouched: %s", scope)
	}
}

// allocatedBy is the bytes the process allocates while fn runs (runtime.MemStats.TotalAlloc).
// Its callers are not parallel: nothing else of the tests runs meanwhile.
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestParentsBoundedBeforeSplit: a list of parents past 8 names, or past workspace.MaxParentsBytes,
// is refused (400 invalid_parents, in the client's wire format) before it is split or decoded:
// a 960 KB X-Workspace-Parents header or a 7.4 MB admin body costs what its refusal costs, not
// a parse of every name (docs/spec.md §17). Not parallel: it measures the process's
// allocations.
func TestParentsBoundedBeforeSplit(t *testing.T) {
	nine := "p1, p2, p3, p4, p5, p6, p7, p8, p9"
	huge := strings.Repeat("a,", 480_000) // 960 KB
	s := &Server{}
	for name, v := range map[string]string{"nine names": nine, "960 KB": huge} {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		r.Header.Set(parentsHeader, v)
		var err error
		allocated := allocatedBy(func() { _, err = s.parentsOf(r, "alice") })
		require.Error(t, err, name)
		e := apierr.From(err)
		require.Equal(t, http.StatusBadRequest, e.Status, name)
		require.Equal(t, "invalid_parents", e.Code, name)
		require.Less(t, allocated, uint64(64<<10), "%s: refused before the split", name)
	}

	e := setup(t, withGemini(""))
	e.up.Fallback = reply(cmpl("ok"))
	for path, h := range map[string]map[string]string{
		"/v1/chat/completions": {"X-Thread-Id": "bounded"},
		"/threads/bounded/v1beta/models/gemini-2.5-pro:generateContent": {},
	} {
		h[parentsHeader] = nine
		body := `{"messages":[{"role":"user","content":"hi"}]}`
		if strings.Contains(path, "v1beta") {
			body = `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`
		}
		resp, got := e.do("POST", path, h, body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", path, got)
		require.Contains(t, got, "more than 8", path)
		if strings.Contains(path, "v1beta") {
			require.Contains(t, got, `"status":"INVALID_ARGUMENT"`, "Google's shape")
		} else {
			testkit.RequireErrorBody(t, got, "invalid_request_error", "invalid_parents")
		}
	}
	require.Empty(t, e.up.Requests(), "no turn began")

	names := make([]string, 0, 800_000)
	for i := range 800_000 {
		names = append(names, "p"+strconv.Itoa(i%10))
	}
	b, err := json.Marshal(map[string]any{"parents": names})
	require.NoError(t, err)
	big := string(b)
	var status int
	var got string
	allocated := allocatedBy(func() {
		resp, body := e.do("PUT", "/admin/v1/threads/bounded/parents", map[string]string{"Authorization": "Bearer " + adminToken}, big)
		status, got = resp.StatusCode, body
	})
	require.Equal(t, http.StatusBadRequest, status, got)
	testkit.RequireErrorBody(t, got, "invalid_request_error", "invalid_parents")
	require.Less(t, allocated, uint64(len(big)), "a %d-byte body is refused before it is decoded", len(big))
	e.admin("PUT", "/admin/v1/threads/bounded/parents", map[string]any{"parents": strings.Split(strings.ReplaceAll(nine, " ", ""), ",")}, 400, nil)
}
