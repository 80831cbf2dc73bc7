package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// docsPicture saves what the tab shows as the docs' picture name.png, in the folder
// WSPROXY_SCREENSHOTS names (docs/ for docs/panel.md's pictures), and in the test's log.
func docsPicture(t *testing.T, ctx context.Context, name, what string) {
	t.Helper()
	saveScreenshot(t, ctx, name, what)
	dir := os.Getenv("WSPROXY_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// pendingItem is the expression of the pending proposal whose text holds what.
func pendingItem(what string) string {
	return `[...document.querySelectorAll("#proposals li.pending")].find(li => li.textContent.includes(` + jsString(what) + `))`
}

// setSelect chooses value in the select sel, as the keyboard would (a change event).
func setSelect(sel, value string) chromedp.Action[chromedp.Void] {
	return waitFor(`(() => { const s = document.querySelector(` + jsString(sel) + `); if (!s) return false; s.value = ` + jsString(value) +
		`; s.dispatchEvent(new Event("change")); return true; })()`)
}

// TestPanelScopesAndReview (docs/spec.md §17): a thread's parents set in the page; its inherited
// items read-only under "From <scope>", nearest first, each heading a link to the scope's page;
// "Move to…" moves an own item to alice (both pages and histories show it, and alice's page lists
// the thread among those that inherit it); the review setting, inherited and the thread's own;
// review mode's proposals, made by a real turn, shown first and applied or dismissed from the
// page; a link's holder sees what it inherits and cannot name other threads; 360 px wide.
func TestPanelScopesAndReview(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	m, _ := MustRunMain(t, func(c *Config) { c.UpstreamBaseURL = up.URL })
	user := newBrowser(t)
	ctx := user()
	for _, c := range []struct{ thread, body string }{
		{"alice", `{"title":"Tabs over spaces","kind":"hard"}`},
		{"alice", `{"title":"Answer in English"}`},
		{"repo-x", `{"title":"Go 1.26, no cgo","subtitle":"Static binaries","kind":"hard","locked":true}`},
		{"fix-login", `{"title":"Short paragraphs"}`},
		{"fix-login", `{"title":"Answer in French","kind":"hard"}`},
	} {
		require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/"+c.thread+"/preferences", c.body, nil))
	}
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/fix-login/objective", `{"text":"Fix the login redirect loop"}`, nil))

	// The parents, typed in the page: what they give shows under their headings, nearest first.
	signIn(t, ctx, m.URL, m.AdminToken)
	within(t, ctx,
		chromedp.Navigate(m.URL+"/ui/#/t/fix-login"),
		chromedp.WaitVisible(chromedp.CSS("#parents-form")),
		chromedp.SendKeys(chromedp.CSS("#parents-text"), "repo-x, alice"),
		click(`document.querySelector("#parents-form button[type=submit]")`),
		waitFor(`document.querySelectorAll("h3.scope").length === 2`),
		waitFor(eventItem("parents_set", "Set the parents: repo-x, alice")+` !== undefined`),
	)
	require.Equal(t, []any{"From repo-x", "From alice"}, eval[[]any](t, ctx, `[...document.querySelectorAll("h3.scope")].map(h => h.textContent)`))
	require.Equal(t, []any{"#/t/repo-x", "#/t/alice"}, eval[[]any](t, ctx, `[...document.querySelectorAll("h3.scope a")].map(a => a.getAttribute("href"))`))
	require.Equal(t, []any{"Go 1.26, no cgo — Static binarieshardlocked"}, eval[[]any](t, ctx, `[...document.querySelectorAll('ul.inherited[data-scope="repo-x"] li')].map(li => li.textContent)`))
	// Read-only: no control on an inherited item.
	require.True(t, eval[bool](t, ctx, `document.querySelector("ul.inherited button, ul.inherited input, ul.inherited select") === null`))
	var d struct {
		Parents              []string `json:"parents"`
		AgentWrites          string   `json:"agent_writes"`
		AgentWritesInherited bool     `json:"agent_writes_inherited"`
	}
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/fix-login", "", &d))
	require.Equal(t, []string{"repo-x", "alice"}, d.Parents)

	// Move to alice: the parents are offered, nearest first; alice is typed.
	within(t, ctx,
		click(prefItem("Answer in French")+`.querySelector("button.move")`),
		waitFor(`document.activeElement && document.activeElement.classList.contains("move-to")`))
	require.Equal(t, "repo-x", eval[string](t, ctx, `document.querySelector("input.move-to").value`))
	require.Equal(t, []any{"repo-x", "alice"}, eval[[]any](t, ctx, `[...document.querySelector("input.move-to").list.options].map(o => o.value)`))
	within(t, ctx,
		chromedp.SetValue(chromedp.CSS("input.move-to"), "alice"),
		click(`document.querySelector(".move-form button[type=submit]")`),
		waitFor(prefItem("Answer in French")+` === undefined`),
		waitFor(`document.querySelector('ul.inherited[data-scope="alice"]').textContent.includes("Answer in French")`),
		waitFor(eventItem("preference_moved", "Moved “Answer in French” to alice")+` !== undefined`),
		waitFor(`document.querySelectorAll(".fresh").length === 0`),
	)
	docsPicture(t, ctx, "panel-scopes", "a thread's inherited preferences, after a move to alice")

	// alice's page, by its heading's link: the item is its own now, its history says from where,
	// and it lists the thread among those that inherit it.
	within(t, ctx,
		click(`document.querySelector('h3.scope a[href="#/t/alice"]')`),
		waitFor(`location.hash === "#/t/alice"`),
		waitFor(prefItem("Answer in French")+` !== undefined`),
		waitFor(eventItem("preference_moved", "Moved #3 “Answer in French” here from fix-login")+` !== undefined`),
		waitFor(`document.querySelector('#children a[href="#/t/fix-login"]') !== null`),
	)
	var evs struct {
		Data []struct {
			Kind  string `json:"kind"`
			Moved struct{ From, To string }
		} `json:"data"`
	}
	for _, thread := range []string{"alice", "fix-login"} {
		require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+thread+"/events?order=desc&limit=1", "", &evs))
		require.Equal(t, "preference_moved", evs.Data[0].Kind, thread)
		require.Equal(t, "alice", evs.Data[0].Moved.To, thread)
	}

	// Review mode, set on alice: fix-login inherits it, and its page says so; the thread's own
	// setting, then the parents' again, from the page.
	require.Equal(t, 200, adminCall(t, m, "PATCH", "/admin/v1/threads/alice", `{"agent_writes":"propose"}`, nil))
	within(t, ctx,
		chromedp.Navigate(m.URL+"/ui/#/t/fix-login"),
		waitFor(`document.querySelector("#agent-writes-now") !== null && document.querySelector("#agent-writes-now").textContent === "Review mode is on, inherited from the parents (or the default)."`))
	require.Equal(t, "as the parents say (now: propose)", eval[string](t, ctx, `document.querySelector("#agent-writes").selectedOptions[0].textContent`))
	require.False(t, eval[bool](t, ctx, `document.querySelector("#review-mode").hidden`))
	within(t, ctx, setSelect("#agent-writes", "direct"),
		waitFor(`document.querySelector("#agent-writes-now").textContent === "Review mode is off, set on this thread."`),
		waitFor(eventItem("agent_writes_set", "direct")+` !== undefined`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/fix-login", "", &d))
	require.Equal(t, "direct", d.AgentWrites)
	require.False(t, d.AgentWritesInherited)
	within(t, ctx, setSelect("#agent-writes", ""),
		waitFor(`document.querySelector("#agent-writes-now").textContent.startsWith("Review mode is on, inherited")`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/fix-login", "", &d))
	require.Equal(t, "propose", d.AgentWrites)
	require.True(t, d.AgentWritesInherited)

	// A turn: the assistant's three changes are proposals, shown first, live; nothing changed.
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("",
		upstreamtest.Call{ID: "c1", Name: "add_preferences", Arguments: `{"items":[{"title":"Run the tests before answering"}],"action_and_reasoning":"The user asked for tested answers."}`},
		upstreamtest.Call{ID: "c2", Name: "update_preferences", Arguments: `{"updates":[{"index":1,"title":"One-line answers"}],"action_and_reasoning":"The user finds the answers too long."}`},
		upstreamtest.Call{ID: "c3", Name: "set_objective", Arguments: `{"text":"Fix the login redirect loop on Safari","action_and_reasoning":"The user narrowed it to Safari."}`})),
		upstreamtest.JSON(200, upstreamtest.Completion("I proposed these; please review them.")))
	threadTurn(t, m, "fix-login", "Only Safari loops. Keep answers to one line, and run the tests first.")
	within(t, ctx, waitFor(`document.querySelectorAll("#proposals li.pending").length === 3`))
	require.Equal(t, []any{
		"The assistant proposes: add “Run the tests before answering” [soft]",
		"The assistant proposes: update #1: “Short paragraphs” → “One-line answers”",
		"The assistant proposes: objective: “Fix the login redirect loop on Safari”",
	}, eval[[]any](t, ctx, `[...document.querySelectorAll("#proposals li.pending .what")].map(e => e.textContent)`))
	require.Equal(t, "The user finds the answers too long.", eval[string](t, ctx, pendingItem("One-line answers")+`.querySelector(".reason").textContent`))
	require.True(t, eval[bool](t, ctx, `document.querySelector("#proposals .ungrounded, #proposals .tainted") === null`), "a turn that read nothing untrusted: review mode's proposals, no why")
	require.True(t, eval[bool](t, ctx, `!!(document.querySelector("#review").compareDocumentPosition(document.querySelector("#objective")) & Node.DOCUMENT_POSITION_FOLLOWING)`), "proposals first")
	require.NotNil(t, eval[any](t, ctx, eventItem("proposed", "The assistant proposed: add “Run the tests before answering”")))
	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/fix-login", "", &ws))
	require.Len(t, ws.Preferences, 1)
	require.Equal(t, "Fix the login redirect loop", ws.Objective.Text)
	within(t, ctx, waitFor(`document.querySelectorAll(".fresh").length === 0`))
	docsPicture(t, ctx, "panel-review", "review mode: the assistant's proposals, first on the page")

	// Apply the addition, dismiss the update, apply the objective: the list follows each.
	within(t, ctx,
		click(pendingItem("Run the tests")+`.querySelector("button.apply")`),
		waitFor(prefItem("Run the tests before answering")+` !== undefined`),
		waitFor(`document.querySelectorAll("#proposals li.pending").length === 2`),
		click(pendingItem("One-line answers")+`.querySelector("button.dismiss")`),
		waitFor(`document.querySelectorAll("#proposals li.pending").length === 1`),
		waitFor(eventItem("proposal_dismissed", "Dismissed: The assistant proposed: update #1: “Short paragraphs” → “One-line answers”")+` !== undefined`),
		click(pendingItem("Safari")+`.querySelector("button.apply")`),
		waitFor(`document.querySelector("#objective").textContent === "Fix the login redirect loop on Safari"`),
		waitFor(`document.querySelector("#review").hidden`),
	)
	require.False(t, eval[bool](t, ctx, eventItem("proposed", "One-line answers")+`.querySelector("button") !== null`), "a dismissed proposal has no button")
	require.Equal(t, "The user asked for tested answers.",
		eval[string](t, ctx, eventItem("preference_added", "Applied the assistant's proposal: add “Run the tests before answering” [soft]")+`.querySelector(".reason").textContent`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/fix-login", "", &ws))
	require.Equal(t, "Fix the login redirect loop on Safari", ws.Objective.Text)
	require.Len(t, ws.Preferences, 2)
	require.Equal(t, "Short paragraphs", ws.Preferences[0].Title)
	require.Equal(t, "Run the tests before answering", ws.Preferences[1].Title)
	var pending struct{ Data []any }
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/fix-login/proposals", "", &pending))
	require.Empty(t, pending.Data)

	// A link's holder: what the thread inherits, without links to other threads, and no control
	// that names them.
	var l struct {
		URL string `json:"url"`
	}
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/fix-login/links", `{"ttl_seconds":600}`, &l))
	visitor := user()
	within(t, visitor, chromedp.Navigate(l.URL), waitFor(`document.querySelectorAll("h3.scope").length === 2`))
	require.True(t, eval[bool](t, visitor, `document.querySelector("#parents-form, #children, button.move, h3.scope a") === null`))
	require.Equal(t, "", eval[string](t, visitor, `document.querySelector("#error").textContent`))

	// 360 px wide: nothing wider than the screen.
	phone := user()
	signIn(t, phone, m.URL, m.AdminToken)
	within(t, phone,
		chromedp.EmulateViewport(360, 740),
		chromedp.Navigate(m.URL+"/ui/#/t/fix-login"),
		waitFor(`document.querySelectorAll("h3.scope").length === 2`),
		click(prefItem("Short paragraphs")+`.querySelector("button.move")`),
		waitFor(`document.querySelector("input.move-to") !== null`))
	require.LessOrEqual(t, eval[float64](t, phone, `document.documentElement.scrollWidth`), 360.0)
	require.True(t, eval[bool](t, phone, `[...document.querySelectorAll("button, input, select")].every(e => e.getBoundingClientRect().right <= 361)`))
}

// TestPanelScopeChangeLive: the thread's event stream says a scope changed (an event named
// "scope", no id): the open page reads what it inherits again; an event of a name it does not
// know is ignored. The stream's answer is the browser's (the DevTools protocol's Fetch domain),
// holding those two events, while alice gains a preference; then the real stream resumes.
func TestPanelScopeChangeLive(t *testing.T) {
	t.Parallel()
	m, _ := MustRunMain(t, nil)
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/alice/preferences", `{"title":"Tabs over spaces"}`, nil))
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/fix-login/parents", `{"parents":["alice"]}`, nil))
	ctx := newBrowser(t)()
	signIn(t, ctx, m.URL, m.AdminToken)
	within(t, ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		paused, stop := context.WithCancel(ctx)
		defer stop()
		held := cdp.Events(paused, tg, fetch.RequestPaused)
		if _, err := cdp.Call(ctx, tg, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/events/stream*"}}}); err != nil {
			return err
		}
		if _, err := chromedp.Navigate(m.URL+"/ui/#/t/fix-login")(ctx, tg); err != nil {
			return err
		}
		for ev, err := range held {
			if err != nil {
				return err
			}
			require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/alice/preferences", `{"title":"Answer in French"}`, nil))
			body := "event: someday\ndata: {\"what\":\"not known yet\"}\n\n" + `event: scope` + "\n" + `data: {"scope":"alice","event":2}` + "\n\n"
			if _, err := cdp.Call(ctx, tg, fetch.FulfillRequest, fetch.FulfillRequestParams{RequestID: ev.RequestID, ResponseCode: 200,
				ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "text/event-stream"}}, Body: []byte(body)}); err != nil {
				return err
			}
			break
		}
		_, err := cdp.Call(ctx, tg, fetch.Disable, cdp.Empty{})
		return err
	}),
		waitFor(`document.querySelector('ul.inherited[data-scope="alice"]') !== null && document.querySelector('ul.inherited[data-scope="alice"]').textContent.includes("Answer in French")`))
	require.True(t, eval[bool](t, ctx, `document.querySelector("#error").hidden`), "an unknown event is ignored")
}

// TestPanelSharedScopeForAClient: signed in with alice's key, the panel's parents field names the
// admin's repo-x, shared with her, as ~repo-x (docs/spec.md §20): its item shows read-only under
// ~repo-x, with no link to the scope's page (the admin's); a ~name not shared is refused in the
// page and the parents stay as they were.
func TestPanelSharedScopeForAClient(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	m, _ := MustRunMain(t, func(c *Config) {
		c.UpstreamBaseURL = up.URL
		c.UpstreamAPIKey = "sk-upstream"
		c.ClientKeys = "alice=" + aliceKey
	})
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/repo-x/preferences", `{"title":"Go 1.26, no cgo","kind":"hard","locked":true}`, nil))
	require.Equal(t, 200, adminCall(t, m, "PATCH", "/admin/v1/threads/repo-x", `{"shared_with":["alice"]}`, nil))
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("ok")))
	clientTurn(t, m, aliceKey, "lisbon", "hi")

	ctx := newBrowser(t)()
	signIn(t, ctx, m.URL, aliceKey)
	const inherited = `document.querySelector('ul.inherited[data-scope="~repo-x"]')`
	save := func(parents string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](`(() => { const i = document.querySelector("#parents-text"); i.value = ` + jsString(parents) +
			`; document.querySelector("#parents-form").requestSubmit(); })()`)
	}
	within(t, ctx,
		chromedp.Navigate(m.URL+"/ui/#/t/alice~lisbon"),
		chromedp.WaitVisible(chromedp.CSS("#parents-text")),
		save("~repo-x, me"),
		waitFor(inherited+` !== null && `+inherited+`.textContent.includes("Go 1.26, no cgo")`))
	require.Equal(t, "~repo-x", eval[string](t, ctx, `document.querySelector("h3.scope .scope-name").textContent`))
	require.Equal(t, "SPAN", eval[string](t, ctx, `document.querySelector("h3.scope .scope-name").tagName`), "no link to the admin's page")
	var ws struct {
		Parents []string `json:"parents"`
	}
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/alice~lisbon", "", &ws))
	require.Equal(t, []string{"~repo-x", "me"}, ws.Parents)

	within(t, ctx, waitFor(`[...document.querySelectorAll('li.event[data-kind="parents_set"]')].some(li => li.textContent.includes("~repo-x, me"))`)) // the history names it as alice does
	within(t, ctx, save("~other"), waitFor(`[...document.querySelectorAll("p.error")].some(p => !p.hidden && p.textContent.includes("not found"))`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/alice~lisbon", "", &ws))
	require.Equal(t, []string{"~repo-x", "me"}, ws.Parents, "a ~name not shared changes nothing")
}
