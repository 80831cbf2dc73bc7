package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// preferencesOf adds titles to a new thread through the admin REST and returns them.
func (e *env) preferencesOf(thread string, titles ...string) []workspace.Preference {
	e.t.Helper()
	out := make([]workspace.Preference, len(titles))
	for i, title := range titles {
		e.admin("POST", "/admin/v1/threads/"+thread+"/preferences", map[string]any{"title": title}, 201, &out[i])
	}
	return out
}

func (e *env) titles(thread string) []string {
	e.t.Helper()
	return testkit.Titles(e.t, e.store, thread)
}

// toolResults are the tool messages of the n-th upstream request, after its last assistant
// message.
func (e *env) toolResults(n int) []string {
	e.t.Helper()
	msgs := messages(e.upstreamRequest(n))
	var out []string
	for i := len(msgs) - 1; i >= 0 && msgs[i]["role"] == "tool"; i-- {
		out = append([]string{msgs[i]["content"].(string)}, out...)
	}
	return out
}

// TestIndicesOfOneRoundNameTheListShown: the calls of one round name the list the model was
// shown: "remove #1" and "update #2" in one round remove A and update B, whatever the first did
// to the positions; the next round names the list as the round's calls left the model's view.
func TestIndicesOfOneRoundNameTheListShown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.preferencesOf("shown", "A", "B", "C")
	e.up.Script(
		reply(cmpl("", call{ID: "r", Name: "remove_preferences", Arguments: `{"indices":[1]}`},
			call{ID: "u", Name: "update_preferences", Arguments: `{"updates":[{"index":2,"title":"B2"}]}`})),
		reply(cmpl("", call{ID: "u2", Name: "update_preferences", Arguments: `{"updates":[{"index":2,"subtitle":"now #2"}]}`})),
		reply(cmpl("Done.")),
	)
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "shown"}, `{"model":"m","messages":[{"role":"user","content":"go"}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Equal(t, []string{`{"ok":true,"result":"removed #1 \"A\""}`, `{"ok":true,"result":"updated #2 \"B2\""}`}, e.toolResults(1))
	require.Equal(t, []string{`{"ok":true,"result":"updated #2 \"C\""}`}, e.toolResults(2))
	d := e.workspace("shown")
	require.Equal(t, []string{"B2", "C"}, e.titles("shown"))
	require.Equal(t, "now #2", d.Preferences[1].Subtitle)
}

// TestALaterRoundNamesWhatTheModelSaw: through a real turn, round 2's indices name round 1's
// view with round 1's own calls applied, never the user's edit that committed during round 1:
// with A, B, C shown, the user removing B while round 1 removes A, round 2's "update #1" is B as
// the model knows it, reported as changed, and C stays as it was.
func TestALaterRoundNamesWhatTheModelSaw(t *testing.T) {
	t.Parallel()
	e := setup(t)
	prefs := e.preferencesOf("later", "A", "B", "C")
	deleted := make(chan int, 1) // the user's DELETE's status
	e.up.Script(
		func(w http.ResponseWriter, r *http.Request) {
			// The model is thinking; the user deletes B in the panel.
			req, _ := http.NewRequest("DELETE", e.srv.URL+"/admin/v1/threads/later/preferences/"+strconv.FormatInt(prefs[1].ID, 10), nil)
			req.Header.Set("Authorization", "Bearer "+adminToken)
			status := 0
			if resp, err := http.DefaultClient.Do(req); err == nil {
				status = resp.StatusCode
				resp.Body.Close()
			}
			deleted <- status
			reply(cmpl("", call{ID: "r", Name: "remove_preferences", Arguments: `{"indices":[1]}`}))(w, r)
		},
		reply(cmpl("", call{ID: "u", Name: "update_preferences", Arguments: `{"updates":[{"index":1,"title":"Renamed"}]}`})),
		reply(cmpl("Done.")),
	)
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "later"}, `{"model":"m","messages":[{"role":"user","content":"go"}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Equal(t, 204, <-deleted, "the user's removal of B")
	require.Equal(t, []string{`{"ok":true,"result":"removed #1 \"A\""}`}, e.toolResults(1))
	require.Equal(t, []string{`{"ok":true,"result":"changed since it was shown; call list_preferences: #1 \"B\""}`}, e.toolResults(2))
	require.Equal(t, []string{"C"}, e.titles("later"), "C is not the model's #1")
}

// TestIndicesSurviveAUserEdit: a user's edit between the turn's start and the model's call
// (the panel is live while the agent works) moves no index onto another preference: the call
// acts on the preference the model was shown, and one the user changed since is reported, not
// replaced by another.
func TestIndicesSurviveAUserEdit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	prefs := e.preferencesOf("edited", "A", "B", "C", "D")
	userEdit := func(method, path, body string) {
		req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	e.up.Script(
		func(w http.ResponseWriter, r *http.Request) {
			// The model is thinking; the user deletes A and renames D in the panel.
			userEdit("DELETE", "/admin/v1/threads/edited/preferences/"+strconv.FormatInt(prefs[0].ID, 10), "")
			userEdit("PATCH", "/admin/v1/threads/edited/preferences/"+strconv.FormatInt(prefs[3].ID, 10), `{"title":"D, renamed"}`)
			reply(cmpl("", call{ID: "r", Name: "remove_preferences", Arguments: `{"indices":[2,1]}`},
				call{ID: "u", Name: "update_preferences", Arguments: `{"updates":[{"index":4,"kind":"hard"},{"index":3,"kind":"hard"}]}`}))(w, r)
		},
		reply(cmpl("Done.")),
	)
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "edited"}, `{"model":"m","messages":[{"role":"user","content":"go"}]}`)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	require.Equal(t, []string{
		`{"ok":true,"result":"removed #2 \"B\"; changed since it was shown; call list_preferences: #1 \"A\""}`,
		`{"ok":true,"result":"updated #3 \"C\"; changed since it was shown; call list_preferences: #4 \"D\""}`,
	}, e.toolResults(1))
	d := e.workspace("edited")
	require.Equal(t, []string{"C", "D, renamed"}, e.titles("edited"))
	require.Equal(t, workspace.Hard, d.Preferences[0].Kind)
	require.Equal(t, workspace.Soft, d.Preferences[1].Kind, "the user's renamed D is not the model's to change unseen")
}
