package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// callAs calls the admin REST with token as the bearer: the answer's status and body.
func (e *env) callAs(token, method, path, body string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// exported reads a thread's export as a generic document, without its thread name (which an
// import into another thread does not keep).
func (e *env) exported(thread string) map[string]any {
	e.t.Helper()
	var doc map[string]any
	e.admin("GET", "/admin/v1/threads/"+thread+"/export", nil, 200, &doc)
	delete(doc, "thread")
	return doc
}

// seed is a document with every kind of source, a lock, parents and both settings.
const seed = `{"format":"wsproxy.workspace/1",
 "objective":{"text":"Ship the CLI","source":"agent"},
 "preferences":[
  {"title":"Go 1.26, no cgo","subtitle":"","kind":"hard","locked":true,"source":"user"},
  {"title":"Short commits","subtitle":"under 76 characters","kind":"soft","locked":false,"source":"agent"},
  {"title":"Use the staging bucket","subtitle":"","kind":"soft","locked":false,"source":"unconfirmed"},
  {"title":"Table tests","subtitle":"","kind":"soft","locked":false,"source":"confirmed"}],
 "parents":["alice"],
 "agent_writes":"propose",
 "untrusted_writes":null}`

// TestExportImportRoundTrip: a workspace exported, imported into another thread and exported
// again is the same document: objective and preferences with their sources and locks, in order,
// parents and the thread's own settings.
func TestExportImportRoundTrip(t *testing.T) {
	t.Parallel()
	e := setup(t)
	code, body := e.callAs(adminToken, "POST", "/admin/v1/threads/repo-x/import", seed)
	require.Equal(t, 201, code, body)
	var want map[string]any
	require.NoError(t, json.Unmarshal([]byte(seed), &want))
	want["untrusted_writes"] = nil
	require.Equal(t, want, e.exported("repo-x"), "the document as imported")

	// Changed by the user after its import: a lock confirms the agent's item, an edit.
	d := e.workspace("repo-x")
	e.admin("PATCH", "/admin/v1/threads/repo-x/preferences/"+id(d.Preferences[1]), map[string]any{"locked": true}, 200, nil)
	e.admin("PATCH", "/admin/v1/threads/repo-x", map[string]any{"untrusted_writes": "refuse"}, 200, nil)
	first := e.exported("repo-x")
	require.Equal(t, "confirmed", first["preferences"].([]any)[1].(map[string]any)["source"])
	require.Equal(t, "refuse", first["untrusted_writes"])

	// Export, import into another thread, export again: equal.
	var raw json.RawMessage
	e.admin("GET", "/admin/v1/threads/repo-x/export", nil, 200, &raw)
	code, body = e.callAs(adminToken, "POST", "/admin/v1/threads/repo-y/import", string(raw))
	require.Equal(t, 201, code, body)
	require.Equal(t, first, e.exported("repo-y"))
	y := e.workspace("repo-y")
	require.Equal(t, e.workspace("repo-x").Block, y.Block, "the same block")
	require.Equal(t, []string{"alice"}, y.Parents)
	require.Equal(t, "propose", y.AgentWrites)
	require.False(t, y.AgentWritesInherited)

	// The answer of an import is the thread's export; the import's changes are user changes in
	// its history.
	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/repo-y/events", nil, 200, &evs)
	kinds := map[string]int{}
	for _, ev := range evs.Data {
		require.Equal(t, workspace.ByUser, ev.Actor)
		kinds[ev.Kind]++
	}
	require.Equal(t, 4, kinds[workspace.PreferenceAdded], kinds)
	require.Equal(t, 1, kinds[workspace.ObjectiveSet], kinds)

	// ?history=1 adds the events, oldest first; an import reads such an export too.
	var withHistory struct {
		History []workspace.Event `json:"history"`
	}
	e.admin("GET", "/admin/v1/threads/repo-y/export?history=1", nil, 200, &withHistory)
	require.Len(t, withHistory.History, len(evs.Data))
	require.Less(t, withHistory.History[0].ID, withHistory.History[len(withHistory.History)-1].ID)
	e.admin("GET", "/admin/v1/threads/repo-y/export?history=2", nil, 400, nil)
	e.admin("GET", "/admin/v1/threads/repo-y/export?history=1", nil, 200, &raw)
	code, body = e.callAs(adminToken, "POST", "/admin/v1/threads/repo-z/import", string(raw))
	require.Equal(t, 201, code, body)
	require.Equal(t, first, e.exported("repo-z"))

	e.admin("GET", "/admin/v1/threads/nothing-here/export", nil, 404, nil)
}

// TestImportIntoAThreadThatHoldsSomething: an import goes into a new or empty thread (a scope
// named as a parent before it holds anything is empty); into one that holds an objective or a
// preference it is 409 thread_not_empty, unless ?replace=1, which replaces them as user changes
// that can be reverted.
func TestImportIntoAThreadThatHoldsSomething(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// repo-x exists, empty: a session named it as its parent.
	e.admin("PUT", "/admin/v1/threads/session-1/parents", map[string]any{"parents": []string{"repo-x"}}, 200, nil)
	code, body := e.callAs(adminToken, "POST", "/admin/v1/threads/repo-x/import", seed)
	require.Equal(t, 200, code, body)
	require.Len(t, e.workspace("session-1").Inherited, 1, "the session inherits the imported scope")

	doc := `{"format":"wsproxy.workspace/1","objective":null,"preferences":[{"title":"Tabs"}],"parents":[],"agent_writes":null,"untrusted_writes":null}`
	code, body = e.callAs(adminToken, "POST", "/admin/v1/threads/repo-x/import", doc)
	require.Equal(t, 409, code, body)
	testkit.RequireErrorBody(t, body, "invalid_request_error", "thread_not_empty")
	require.Len(t, e.workspace("repo-x").Preferences, 4, "nothing changed")

	code, body = e.callAs(adminToken, "POST", "/admin/v1/threads/repo-x/import?replace=1", doc)
	require.Equal(t, 200, code, body)
	d := e.workspace("repo-x")
	require.Nil(t, d.Objective)
	require.Len(t, d.Preferences, 1)
	require.Equal(t, "Tabs", d.Preferences[0].Title)
	require.Equal(t, workspace.SourceUser, d.Preferences[0].Source, "no source: the user's")
	require.Empty(t, d.Parents)
	require.Equal(t, "direct", d.AgentWrites)
	require.True(t, d.AgentWritesInherited)

	// The objective's removal is an event of its own, and can be reverted.
	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/repo-x/events?target=objective&order=desc&limit=1", nil, 200, &evs)
	require.Len(t, evs.Data, 1)
	e.admin("POST", "/admin/v1/threads/repo-x/events/"+itoa(evs.Data[0].ID)+"/revert", nil, 200, nil)
	require.Equal(t, "Ship the CLI", e.workspace("repo-x").Objective.Text)
}

// TestImportRefusesBadDocuments: a document is checked whole before anything is written, and
// its faults are clear errors; a body past 1 MiB is refused before it is read.
func TestImportRefusesBadDocuments(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// a is a child of b: b cannot take a as its parent.
	e.admin("PUT", "/admin/v1/threads/a/parents", map[string]any{"parents": []string{"b"}}, 200, nil)
	for _, tt := range []struct {
		name, doc   string
		status      int
		code, param string
	}{
		{"NoFormat", `{"preferences":[]}`, 400, "missing_required_parameter", "format"},
		{"OtherFormat", `{"format":"other/2"}`, 400, "invalid_value", "format"},
		{"UnknownField", `{"format":"wsproxy.workspace/1","colour":"red"}`, 400, "unknown_parameter", "colour"},
		{"NotJSON", `{"format":`, 400, "invalid_json", ""},
		{"BadSource", `{"format":"wsproxy.workspace/1","preferences":[{"title":"x","source":"robot"}]}`, 400, "invalid_value", "preferences[0].source"},
		{"BadKind", `{"format":"wsproxy.workspace/1","preferences":[{"title":"x","kind":"firm"}]}`, 400, "invalid_value", "preferences[0].kind"},
		{"EmptyTitle", `{"format":"wsproxy.workspace/1","preferences":[{"title":""}]}`, 400, "invalid_value", "preferences[0].title"},
		{"Duplicate", `{"format":"wsproxy.workspace/1","preferences":[{"title":"Tabs"},{"title":"tabs"}]}`, 409, "duplicate_preference", "title"},
		{"BadSetting", `{"format":"wsproxy.workspace/1","agent_writes":"sometimes"}`, 400, "invalid_value", "agent_writes"},
		{"BadParent", `{"format":"wsproxy.workspace/1","parents":["no spaces"]}`, 400, "invalid_thread_id", "parents"},
		{"Cycle", `{"format":"wsproxy.workspace/1","preferences":[{"title":"Tabs"}],"parents":["a"]}`, 400, "invalid_parents", "parents"},
	} {
		code, body := e.callAs(adminToken, "POST", "/admin/v1/threads/b/import", tt.doc)
		require.Equal(t, tt.status, code, "%s: %s", tt.name, body)
		eb := testkit.RequireErrorBody(t, body, "invalid_request_error", tt.code)
		if tt.param != "" {
			require.Equal(t, tt.param, eb["param"], tt.name)
		}
	}
	require.Empty(t, e.workspace("b").Preferences, "nothing was written")

	big := `{"format":"wsproxy.workspace/1","history":"` + strings.Repeat("x", maxImportBytes) + `"}`
	code, body := e.callAs(adminToken, "POST", "/admin/v1/threads/c/import", big)
	require.Equal(t, 413, code, body)
	testkit.RequireErrorBody(t, body, "invalid_request_error", "import_too_large")
	e.admin("GET", "/admin/v1/threads/c", nil, 404, nil)
}

// TestClientExportsItsOwn: with client keys, a client exports and imports its own threads
// (parents in its namespace); another client's thread does not exist for it.
func TestClientExportsItsOwn(t *testing.T) {
	t.Parallel()
	e := setup(t, withClientKeys(t, "alice=sk-alice-secret,bob=sk-bob-secret"))
	code, body := e.callAs("sk-alice-secret", "POST", "/admin/v1/threads/alice~repo-x/import", seed)
	require.Equal(t, 201, code, body)
	require.Equal(t, []string{"alice"}, e.workspace("alice~repo-x").Parents, "alice~alice, by its name in alice's namespace")
	code, body = e.callAs("sk-alice-secret", "GET", "/admin/v1/threads/alice~repo-x/export", "")
	require.Equal(t, 200, code, body)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	require.Equal(t, "repo-x", doc["thread"])
	require.Equal(t, []any{"alice"}, doc["parents"])

	code, _ = e.callAs("sk-bob-secret", "GET", "/admin/v1/threads/alice~repo-x/export", "")
	require.Equal(t, 404, code)
	code, _ = e.callAs("sk-bob-secret", "POST", "/admin/v1/threads/alice~repo-y/import", seed)
	require.Equal(t, 404, code)
	code, body = e.callAs("sk-bob-secret", "POST", "/admin/v1/threads/bob~repo-y/import",
		`{"format":"wsproxy.workspace/1","parents":["alice~repo-x"]}`)
	require.Equal(t, 404, code, "another client's parent does not exist for bob: %s", body)
	e.admin("GET", "/admin/v1/threads/bob~repo-y", nil, 404, nil)
}

// TestClientNotFoundHints: a client's key naming a thread without its client~ prefix gets a 404
// that says how its threads are named.
func TestClientNotFoundHints(t *testing.T) {
	t.Parallel()
	e := setup(t, withClientKeys(t, "alice=sk-alice-secret"))
	e.admin("PUT", "/admin/v1/threads/alice~t1/objective", map[string]any{"text": "goal"}, 200, nil)
	code, body := e.callAs("sk-alice-secret", "GET", "/admin/v1/threads/t1", "")
	require.Equal(t, 404, code, body)
	eb := testkit.RequireErrorBody(t, body, "invalid_request_error", "not_found")
	require.Equal(t, `no thread "t1": a client's threads are named with their client, as in "alice~t1"`, eb["message"])
	code, body = e.callAs("sk-alice-secret", "GET", "/admin/v1/threads/alice~t2", "")
	require.Equal(t, 404, code, body)
	require.Equal(t, `no thread "alice~t2"`, testkit.RequireErrorBody(t, body, "invalid_request_error", "not_found")["message"])
	code, body = e.callAs(adminToken, "GET", "/admin/v1/threads/t1", "")
	require.Equal(t, 404, code, body)
	require.Equal(t, `no thread "t1"`, testkit.RequireErrorBody(t, body, "invalid_request_error", "not_found")["message"], "the admin's threads are any")
}

// TestOpenAPIWithoutToken: the OpenAPI document holds no data: it is served without the admin
// token, as a client generator fetches it; every other route still needs one.
func TestOpenAPIWithoutToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	resp, err := http.Get(e.srv.URL + "/admin/v1/openapi.json")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, string(b))
	require.JSONEq(t, string(openAPIDocument), string(b))
	resp, err = http.Get(e.srv.URL + "/admin/v1/threads")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 401, resp.StatusCode)
}
