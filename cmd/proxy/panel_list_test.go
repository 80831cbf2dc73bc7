package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// agentTurn is a chat turn of thread sent by an agent: its User-Agent, and its parents in
// X-Workspace-Parents.
func agentTurn(t *testing.T, m *Main, thread, userAgent, parents, text string) {
	t.Helper()
	req, err := http.NewRequest("POST", m.URL+"/threads/"+thread+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":`+jsString(text)+`}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("X-Workspace-Parents", parents)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, string(b))
}

// threadRow is the expression of the list's row of the thread id.
func threadRow(id string) string {
	return `document.querySelector('#threads li[data-thread=` + jsString(id) + `]')`
}

// TestPanelTellsSessionsApart (docs/spec.md §13, §17; #56 items 2 and 3, #50 item 3): the list
// shows per thread what tells it apart — its title (else its id), a scope's mark and a link to
// its sessions, the proposals waiting in it, the user's first words, its objective, its agent
// (from the first turn's User-Agent), its parents as links to their sessions, its last
// activity; a scope's sessions listed by its parent link; a search past the id prefix; a title
// given on the thread's page; a scope made by "New scope", and a missing thread made by "Create
// it"; 360 px wide.
func TestPanelTellsSessionsApart(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	m, _ := MustRunMain(t, func(c *Config) { c.UpstreamBaseURL = up.URL })
	require.Equal(t, 201, adminCall(t, m, "PUT", "/admin/v1/threads/repo-x", "", nil))
	require.Equal(t, 200, adminCall(t, m, "PATCH", "/admin/v1/threads/repo-x", `{"agent_writes":"propose"}`, nil))
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("It loops on the cookie.")))
	agentTurn(t, m, "3f2a9c", "claude-cli/2.0.14 (external, cli)", "repo-x", "Why does the Safari login loop?")
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("",
		upstreamtest.Call{ID: "c1", Name: "add_preferences", Arguments: `{"items":[{"title":"Retry payments"}],"action_and_reasoning":"The user asked for retries."}`})),
		upstreamtest.JSON(200, upstreamtest.Completion("Proposed.")))
	agentTurn(t, m, "8be01d", "codex_cli_rs/0.41.0 (Linux; x86_64)", "repo-x", "Retry payments that fail, three times.")
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("Hello.")))
	threadTurn(t, m, "scratch", "Hello there")

	var d struct {
		Agent      string `json:"agent"`
		FirstWords string `json:"first_words"`
	}
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/3f2a9c", "", &d))
	require.Equal(t, "claude-cli/2.0.14 (external, cli)", d.Agent)
	require.Equal(t, "Why does the Safari login loop?", d.FirstWords)
	// A later turn keeps the first one's words.
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("Sure.")))
	agentTurn(t, m, "3f2a9c", "claude-cli/2.0.14 (external, cli)", "repo-x", "And on Firefox?")
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/3f2a9c", "", &d))
	require.Equal(t, "Why does the Safari login loop?", d.FirstWords)

	ctx := newBrowser(t)()
	signIn(t, ctx, m.URL, m.AdminToken)
	within(t, ctx, chromedp.Navigate(m.URL+"/ui/#/"), waitFor(threadRow("scratch")+` !== null && `+threadRow("repo-x")+` !== null`))
	require.Equal(t, "scope", eval[string](t, ctx, threadRow("repo-x")+`.querySelector(".badge.scope").textContent`))
	require.Equal(t, "Its 2 sessions", eval[string](t, ctx, threadRow("repo-x")+`.querySelector("a.sessions").textContent`))
	require.True(t, eval[bool](t, ctx, threadRow("3f2a9c")+`.querySelector(".badge.scope") === null`))
	require.Equal(t, "1 proposal waiting", eval[string](t, ctx, threadRow("8be01d")+`.querySelector(".badge.waiting").textContent`))
	require.True(t, eval[bool](t, ctx, threadRow("3f2a9c")+`.querySelector(".badge.waiting") === null`))
	require.Equal(t, "“Why does the Safari login loop?”", eval[string](t, ctx, threadRow("3f2a9c")+`.querySelector(".first-words").textContent`))
	require.Equal(t, "claude-cli/2.0.14", eval[string](t, ctx, threadRow("3f2a9c")+`.querySelector(".agent").textContent`))
	require.Equal(t, "codex_cli_rs/0.41.0", eval[string](t, ctx, threadRow("8be01d")+`.querySelector(".agent").textContent`))
	require.Regexp(t, `^2 turns · 0 preferences · claude-cli/2\.0\.14 · in repo-x · last active `, eval[string](t, ctx, threadRow("3f2a9c")+`.querySelector(".meta").textContent`))
	docsPicture(t, ctx, "panel-threads", "the thread list: sessions told apart, a scope, proposals waiting")

	// The sessions of repo-x, by a session's parent link.
	within(t, ctx, click(threadRow("3f2a9c")+`.querySelector("a.parent")`),
		waitFor(`document.querySelector("h2").textContent === "Sessions of repo-x" && document.querySelectorAll("#threads li[data-thread]").length === 2`))
	require.Equal(t, []any{"8be01d", "3f2a9c"}, eval[[]any](t, ctx, `[...document.querySelectorAll("#threads li[data-thread]")].map(li => li.dataset.thread)`))

	// A search past the id's start: the first words.
	within(t, ctx, chromedp.Navigate(m.URL+"/ui/#/"), waitFor(threadRow("scratch")+` !== null`),
		chromedp.SendKeys(chromedp.CSS("#filter"), "safari"),
		click(`document.querySelector("form[role=search] button")`),
		waitFor(`document.querySelectorAll("#threads li[data-thread]").length === 1 && `+threadRow("3f2a9c")+` !== null`))

	// A title, given on the thread's page, names it in the list.
	within(t, ctx, click(threadRow("3f2a9c")+`.querySelector("a.thread-link")`),
		waitFor(`document.querySelector("#title-form") !== null && document.querySelector("#origin").textContent !== ""`))
	require.Equal(t, "It began with: “Why does the Safari login loop?” · Agent: claude-cli/2.0.14 (external, cli)", eval[string](t, ctx, `document.querySelector("#origin").textContent`))
	within(t, ctx, chromedp.SendKeys(chromedp.CSS("#title-text"), "Safari login loop"),
		click(`document.querySelector("#title-form button")`),
		waitFor(`document.querySelector("#title-text").value === "Safari login loop" && document.activeElement !== document.querySelector("#title-text")`),
		click(`document.querySelector("#back")`),
		waitFor(threadRow("3f2a9c")+` !== null && `+threadRow("3f2a9c")+`.querySelector("a.thread-link").textContent === "Safari login loop"`))
	require.Equal(t, "3f2a9c", eval[string](t, ctx, threadRow("3f2a9c")+`.querySelector(".thread-id").textContent`))

	// New scope, from the list: made empty, its page opened.
	within(t, ctx, click(`document.querySelector("#new-scope")`),
		waitFor(`document.activeElement === document.querySelector("#new-scope-name")`),
		chromedp.SendKeys(chromedp.CSS("#new-scope-name"), "alice"),
		click(`document.querySelector("#new-scope-form button[type=submit]")`),
		waitFor(`location.hash === "#/t/alice" && document.querySelector("#add-form") !== null`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/alice", "", nil))

	// A missing thread: "Create it".
	within(t, ctx, chromedp.Navigate(m.URL+"/ui/#/t/team-y"), waitFor(`document.querySelector("#create-thread") !== null`),
		click(`document.querySelector("#create-thread")`),
		waitFor(`document.querySelector("#add-form") !== null && document.querySelector("h2").textContent.startsWith("Thread team-y")`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/team-y", "", nil))

	// 360 px wide: the list holds.
	phone := newBrowser(t)()
	signIn(t, phone, m.URL, m.AdminToken)
	within(t, phone, chromedp.EmulateViewport(360, 740), chromedp.Navigate(m.URL+"/ui/#/"), waitFor(threadRow("repo-x")+` !== null`))
	require.LessOrEqual(t, eval[float64](t, phone, `document.documentElement.scrollWidth`), 360.0)
}
