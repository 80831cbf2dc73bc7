package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

// The workspace panel in a real browser: headless Chromium (Debian's chromium; .ci/run installs
// it) driven by chromedp against the whole program and Postgres. Without a browser these tests
// fail: they are how the panel is known to work.

// chromiumPath finds the browser: CHROMIUM_PATH, or chromium / chromium-browser / google-chrome
// on the PATH.
func chromiumPath(t *testing.T) string {
	if p := os.Getenv("CHROMIUM_PATH"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found (install Debian's chromium, or set CHROMIUM_PATH): the panel's browser tests need one")
	return ""
}

// newBrowser starts headless Chromium for the test; each user is a tab in a browser context of
// its own (its own cookies).
func newBrowser(t *testing.T) func() context.Context {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	require.NoError(t, chromedp.Do(browser, chromedp.Navigate("about:blank")))
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	n := 0
	return func() context.Context {
		ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
		// The first action opens the tab, which lives as long as that action's context: this
		// one, not a step's with a deadline.
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")))
		n++
		name := fmt.Sprintf("%s-user%d", strings.ReplaceAll(t.Name(), "/", "-"), n)
		t.Cleanup(func() {
			if t.Failed() {
				screenshot(t, ctx, name)
			}
			cancel()
		})
		return ctx
	}
}

// screenshot saves what the tab shows, for a failed test: under BROWSER_ARTIFACTS, else the
// temporary directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	saveScreenshot(t, ctx, name, "screenshot of the failure")
}

// saveScreenshot saves what the tab shows as name.png under BROWSER_ARTIFACTS (else
// wsproxy-browser in the temporary directory) and logs its path with what it shows.
func saveScreenshot(t *testing.T, ctx context.Context, name, what string) {
	t.Helper()
	dir := os.Getenv("BROWSER_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "wsproxy-browser")
	}
	_ = os.MkdirAll(dir, 0o755)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("no screenshot: %v", err)
		return
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err == nil {
		t.Logf("%s: %s", what, path)
	}
}

// within runs browser steps with a deadline, one generous enough for a machine busy with the
// other tests (a browser, a proxy and Postgres per test, all at once).
func within(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, chromedp.Do(sctx, steps...))
}

// waitFor waits until the JavaScript expression is true in the page, through navigations (a
// page that goes away mid-poll takes its poll with it: the next page is polled anew), until the
// deadline of its steps.
func waitFor(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(time.Minute)
		}
		for {
			_, err := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(time.Until(deadline)))(ctx, tg)
			if err == nil || time.Now().After(deadline) || ctx.Err() != nil ||
				!(strings.Contains(err.Error(), "context") || strings.Contains(err.Error(), "navigated or closed")) {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// eval evaluates a JavaScript expression in the page (awaiting it when it is a promise).
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	return v
}

// jsString quotes s for a JavaScript expression.
func jsString(s string) string { return fmt.Sprintf("%q", s) }

// signIn signs in on the panel's page with the keyboard alone.
func signIn(t *testing.T, ctx context.Context, base, token string) {
	within(t, ctx,
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token+kb.Enter),
		waitFor(`document.querySelector("#who").textContent.startsWith("Signed in")`),
	)
}

// click clicks the element expr finds, as soon as there is one: found and clicked in one step in
// the page, so a live update cannot replace it in between.
func click(expr string) chromedp.Action[chromedp.Void] {
	return waitFor(`(() => { const e = ` + expr + `; if (!e) return false; e.click(); return true; })()`)
}

// prefItem is the expression of the preference list item whose title is title.
func prefItem(title string) string {
	return `[...document.querySelectorAll("li.pref")].find(li => li.querySelector(".title") && li.querySelector(".title").textContent.endsWith(` + jsString(title) + `))`
}

// eventItem is the expression of the newest timeline item of kind whose text holds what.
func eventItem(kind, what string) string {
	return `[...document.querySelectorAll('li.event[data-kind="` + kind + `"]')].find(li => li.textContent.includes(` + jsString(what) + `))`
}

// TestPanelInBrowser: a user signs in, adds and locks a preference, watches an agent's refused
// removal arrive live with its reason, reverts an agent's edit, meets a stale revert's 409 in the
// page; model-written values render as text; writes without the CSRF token or from another
// origin are refused; a signed link opens its thread and no other, and not after it expires; the
// page works at 360 px wide.
func TestPanelInBrowser(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	m, _ := MustRunMain(t, func(c *Config) { c.UpstreamBaseURL = up.URL })
	user := newBrowser(t)
	ctx := user()
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/trip/objective", `{"text":"Plan a trip to Lisbon"}`, nil))

	// Sign in; open the thread from the list; add and lock a preference.
	signIn(t, ctx, m.URL, m.AdminToken)
	within(t, ctx,
		click(`document.querySelector('#threads a[href="#/t/trip"]')`),
		chromedp.WaitVisible(chromedp.CSS("#add-form")),
		chromedp.SendKeys(chromedp.CSS("#new-title"), "Trains only"),
		click(`document.querySelector("#add-form button[type=submit]")`),
		waitFor(prefItem("Trains only")+` !== undefined`),
		click(`document.querySelector('button[aria-label="Lock #1 Trains only"]')`),
		waitFor(prefItem("Trains only")+`.querySelector(".badge.locked") !== null`),
		waitFor(eventItem("preference_locked", "Locked #1 “Trains only”")+` !== undefined`),
	)
	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/trip", "", &ws))
	require.Len(t, ws.Preferences, 1)
	require.True(t, ws.Preferences[0].Locked)

	// A turn whose agent tries to remove it: the refusal arrives live, with the agent's reason,
	// without a reload (the marker survives).
	eval[bool](t, ctx, `window.marker = true`)
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("", upstreamtest.Call{ID: "c1", Name: "remove_preferences",
		Arguments: `{"indices":[1],"action_and_reasoning":"The user said trains are too slow."}`})),
		upstreamtest.JSON(200, upstreamtest.Completion("It is locked.")))
	threadTurn(t, m, "trip", "Forget the trains.")
	within(t, ctx, waitFor(eventItem("locked_skip", "trains are too slow")+` !== undefined`))
	require.True(t, eval[bool](t, ctx, `window.marker === true`), "a live update, not a reload")
	require.Equal(t, "The user said trains are too slow.", eval[string](t, ctx, eventItem("locked_skip", "")+`.querySelector(".reason").textContent`))

	// An agent's addition, reverted from the timeline. What the user is typing meanwhile survives
	// the live update.
	within(t, ctx, chromedp.SendKeys(chromedp.CSS("#new-title"), "Half-typed"))
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("", upstreamtest.Call{ID: "c2", Name: "add_preferences",
		Arguments: `{"items":[{"title":"Museums"}],"action_and_reasoning":"The user likes museums."}`})),
		upstreamtest.JSON(200, upstreamtest.Completion("Noted.")))
	threadTurn(t, m, "trip", "I like museums.")
	within(t, ctx,
		waitFor(prefItem("Museums")+` !== undefined`),
		waitFor(eventItem("preference_added", "likes museums")+` !== undefined`),
	)
	require.Equal(t, "Half-typed", eval[string](t, ctx, `document.querySelector("#new-title").value`))
	eval[bool](t, ctx, `document.querySelector("#add-form").reset() || true`)
	within(t, ctx,
		click(eventItem("preference_added", "likes museums")+`.querySelector("button.revert")`),
		waitFor(prefItem("Museums")+` === undefined`),
		waitFor(eventItem("revert", "Undid: Added “Museums”")+` !== undefined`),
		// The reverted change says so, and has no Revert button any more.
		waitFor(eventItem("preference_added", "likes museums")+`.querySelector(".reverted-by").textContent.startsWith("Reverted by a user")`),
	)
	require.False(t, eval[bool](t, ctx, eventItem("preference_added", "likes museums")+`.querySelector("button.revert") !== null`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/trip", "", &ws))
	require.Len(t, ws.Preferences, 1)

	// A stale revert: the agent adds, the user renames elsewhere; reverting the addition is a
	// 409 shown in the page beside it, naming the later change by what it did.
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("", upstreamtest.Call{ID: "c3", Name: "add_preferences",
		Arguments: `{"items":[{"title":"Gardens"}],"action_and_reasoning":"The user likes gardens."}`})),
		upstreamtest.JSON(200, upstreamtest.Completion("Noted.")))
	threadTurn(t, m, "trip", "I like gardens.")
	within(t, ctx, waitFor(eventItem("preference_added", "likes gardens")+` !== undefined`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/trip", "", &ws))
	gardens := ws.Preferences[len(ws.Preferences)-1]
	require.Equal(t, 200, adminCall(t, m, "PATCH", fmt.Sprintf("/admin/v1/threads/trip/preferences/%d", gardens.ID), `{"title":"Botanical gardens"}`, nil))
	// The list as the page shows it names the preference (#2) once its reload came back.
	within(t, ctx, waitFor(eventItem("preference_updated", "Botanical gardens")+` !== undefined`),
		waitFor(prefItem("Botanical gardens")+` !== undefined`))
	within(t, ctx,
		click(eventItem("preference_added", "likes gardens")+`.querySelector("button.revert")`),
		waitFor(`!`+eventItem("preference_added", "likes gardens")+`.querySelector(".error").hidden`))
	require.Regexp(t, `^This changed again since\. The latest change: Changed #2: “Gardens” → “Botanical gardens” \(a user, .+\)\. Revert that change first, or undo back to this one in one step\.$`,
		eval[string](t, ctx, eventItem("preference_added", "likes gardens")+`.querySelector(".error").textContent`))

	// Values written from chat text render as text, never as markup.
	for _, title := range []string{`<script>window.pwned = 1</script>`, `<img src=x onerror="window.pwned = 2">`} {
		require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/trip/preferences", `{"title":`+jsString(title)+`}`, nil))
		within(t, ctx, waitFor(prefItem(title)+` !== undefined`))
	}
	require.Equal(t, `<img src=x onerror="window.pwned = 2">`,
		strings.SplitN(eval[string](t, ctx, prefItem(`<img src=x onerror="window.pwned = 2">`)+`.querySelector(".title").textContent`), " ", 2)[1])
	require.True(t, eval[bool](t, ctx, `window.pwned === undefined && document.querySelector("#main img") === null && document.querySelector("#main script") === null`))

	// Writes without the CSRF token, or from another origin: refused, nothing written.
	status := eval[float64](t, ctx, `(async () => (await fetch("/admin/v1/threads/trip/preferences", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({title: "No token"})})).status)()`)
	require.Equal(t, 403.0, status)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><title>elsewhere</title><script>
fetch(%q, {method: "POST", credentials: "include", headers: {"Content-Type": "text/plain"}, body: '{"title":"From elsewhere"}'})
  .then(r => document.title = "sent " + r.status, e => document.title = "blocked");
</script>`, m.URL+"/admin/v1/threads/trip/preferences")
	}))
	defer evil.Close()
	within(t, ctx, chromedp.Navigate(evil.URL), waitFor(`document.title !== "elsewhere"`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/trip", "", &ws))
	for _, p := range ws.Preferences {
		require.NotEqual(t, "From elsewhere", p.Title)
		require.NotEqual(t, "No token", p.Title)
	}

	// A signed link, in another browser context: its thread, no other, not after it expires.
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/secret/objective", `{"text":"Someone else's"}`, nil))
	var l struct {
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	// Its life is long enough for a busy machine's browser to open it twice (4 s was not: the
	// link expired before the first page showed its thread), then the test waits it out.
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/trip/links", `{"ttl_seconds":20}`, &l))
	visitor := user()
	within(t, visitor,
		chromedp.Navigate(l.URL),
		waitFor(`location.hash === "#/t/trip" && document.querySelector("#objective") !== null && document.querySelector("#objective").textContent !== ""`),
	)
	require.Equal(t, "Plan a trip to Lisbon", eval[string](t, visitor, `document.querySelector("#objective").textContent`))
	within(t, visitor,
		chromedp.Navigate(m.URL+"/ui/#/t/secret"),
		waitFor(`document.querySelector("#no-thread") !== null`),
	)
	require.False(t, eval[bool](t, visitor, `document.body.textContent.includes("Someone else's")`))
	time.Sleep(time.Until(l.ExpiresAt) + 200*time.Millisecond)
	within(t, visitor, chromedp.Navigate(m.URL+"/ui/#/t/trip"), chromedp.WaitVisible(chromedp.CSS("#token")))
	within(t, visitor, chromedp.Navigate(l.URL), waitFor(`document.body.textContent.includes("expired")`))

	// 360 px wide: nothing wider than the screen; the controls still there.
	phone := user()
	signIn(t, phone, m.URL, m.AdminToken)
	within(t, phone,
		chromedp.EmulateViewport(360, 740),
		chromedp.Navigate(m.URL+"/ui/#/t/trip"),
		waitFor(`document.querySelectorAll("li.pref").length > 0 && document.querySelectorAll("li.event").length > 0`),
	)
	require.LessOrEqual(t, eval[float64](t, phone, `document.documentElement.scrollWidth`), 360.0)
	require.True(t, eval[bool](t, phone, `[...document.querySelectorAll("button, input, select")].every(e => e.getBoundingClientRect().right <= 361)`))

}

// threadTurn runs a thread turn through the program.
func threadTurn(t *testing.T, m *Main, thread, text string) {
	t.Helper()
	clientTurn(t, m, "", thread, text)
}

// TestPanelExplainsItself: the panel in the words of its user. A wrong token's sign-in shows the
// server's message and where the token lives; counts are plural where they should be; a missing
// thread is a page that says so, with no editor; every place names a preference by its position
// (#N) and an event by what it changed; a lock says "locked"; the assistant's refused change of
// a locked preference shows as its proposal, which Apply makes (the lock kept); a reverted change
// says by whom, without a button; a live change is highlighted, then fades; on a phone the
// history is one tap away. Screenshots of each go to the test's log; with WSPROXY_SCREENSHOT=path
// the last one (a real thread at 1280 px) is written there, the README's picture (docs/panel.png).
func TestPanelExplainsItself(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	m, _ := MustRunMain(t, func(c *Config) { c.UpstreamBaseURL = up.URL })
	user := newBrowser(t)
	ctx := user()

	// A wrong token: the server's message, beside the form that sent it, and where the token is.
	within(t, ctx,
		chromedp.Navigate(m.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"+kb.Enter),
		waitFor(`!document.querySelector("#signin-error").hidden`),
	)
	require.Equal(t, "That is neither the admin token nor a client key.", eval[string](t, ctx, `document.querySelector("#signin-error").textContent`))
	help := eval[string](t, ctx, `document.querySelector("#token-help").textContent`)
	require.Contains(t, help, ".data/admin-token")
	require.Contains(t, help, "ADMIN_TOKEN is unset; generated one for this run")
	saveScreenshot(t, ctx, "panel-signin-error", "sign-in with a wrong token")

	// A thread of real content: an objective, three preferences (one locked), the assistant's
	// turns with their reasons.
	trip := "lisbon-trip"
	turn := func(text string, calls ...upstreamtest.Call) {
		t.Helper()
		up.Script(upstreamtest.JSON(200, upstreamtest.Completion("", calls...)), upstreamtest.JSON(200, upstreamtest.Completion("Noted.")))
		threadTurn(t, m, trip, text)
	}
	turn("My goal is a slow trip to Lisbon in May. By train, please; I like small hotels.",
		upstreamtest.Call{ID: "c1", Name: "set_objective", Arguments: `{"text":"Plan a slow trip to Lisbon in May","action_and_reasoning":"The user stated the goal of the conversation."}`},
		upstreamtest.Call{ID: "c2", Name: "add_preferences", Arguments: `{"items":[{"title":"Travel by train","subtitle":"No flights","kind":"hard"},{"title":"Small hotels","subtitle":"Family-run, under €150 a night"},{"title":"Vegetarian restaurants"}],"action_and_reasoning":"The user named how they travel, where they sleep and what they eat."}`})
	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+trip, "", &ws))
	require.Len(t, ws.Preferences, 3)

	signIn(t, ctx, m.URL, m.AdminToken)
	within(t, ctx, waitFor(`document.querySelector('#threads a[href="#/t/`+trip+`"]') !== null`))
	require.Contains(t, eval[string](t, ctx, `document.querySelector("#threads li").textContent`), "1 turn · 3 preferences")

	// A missing thread: a page that says so, and no editor that would make it.
	within(t, ctx, chromedp.Navigate(m.URL+"/ui/#/t/no-such-thread"), waitFor(`document.querySelector("#no-thread") !== null`))
	require.Contains(t, eval[string](t, ctx, `document.querySelector("#no-thread").textContent`), "There is no thread “no-such-thread”")
	require.True(t, eval[bool](t, ctx, `document.querySelector("#add-form") === null && document.querySelector("#objective-form") === null`))
	saveScreenshot(t, ctx, "panel-no-such-thread", "a missing thread")
	within(t, ctx, chromedp.Navigate(m.URL+"/ui/#/t/"+trip), waitFor(prefItem("Travel by train")+` !== undefined`))

	// The user locks "Travel by train": the lock event says so, by position.
	within(t, ctx,
		click(`document.querySelector('button[aria-label="Lock #1 Travel by train"]')`),
		waitFor(eventItem("preference_locked", "Locked #1 “Travel by train”")+` !== undefined`))

	// The assistant removes "Small hotels" (a live change, highlighted until it fades), then tries
	// to change the locked one: its proposal shows on the preference, with Apply.
	eval[bool](t, ctx, `(() => { window.sawFresh = false; new MutationObserver(() => { if (document.querySelector("li.event.fresh")) window.sawFresh = true; })
		.observe(document.body, {subtree: true, childList: true, attributes: true}); return true; })()`)
	turn("Actually, forget the hotels; I will stay with friends. And flying is fine if it is cheaper.",
		upstreamtest.Call{ID: "c3", Name: "remove_preferences", Arguments: `{"indices":[2],"action_and_reasoning":"The user will stay with friends."}`},
		upstreamtest.Call{ID: "c4", Name: "update_preferences", Arguments: `{"updates":[{"index":1,"title":"Cheapest transport","subtitle":"Train or plane"}],"action_and_reasoning":"The user accepts flying when it is cheaper."}`})
	within(t, ctx,
		waitFor(eventItem("preference_removed", "Removed “Small hotels”")+` !== undefined`),
		waitFor(prefItem("Travel by train")+`.querySelector(".proposal") !== null`),
		waitFor(eventItem("locked_skip", "Travel by train")+` !== undefined`))
	require.True(t, eval[bool](t, ctx, `window.sawFresh`), "a live change is highlighted")
	// Positions, not ids: "Vegetarian restaurants" is #2 now, in the list and in its history.
	require.Equal(t, "#2 Vegetarian restaurants", eval[string](t, ctx, prefItem("Vegetarian restaurants")+`.querySelector(".title").textContent`))
	require.NotNil(t, eval[any](t, ctx, eventItem("preference_added", "Added #2 “Vegetarian restaurants”")))
	timeline := eval[string](t, ctx, `document.querySelector("#timeline").textContent`)
	require.NotRegexp(t, `preference \d|#\d+ ·|event \d`, timeline, "no ids")
	// The item points to its proposal; the proposal, in the review list, says it in full.
	require.Contains(t, eval[string](t, ctx, prefItem("Travel by train")+`.querySelector(".proposal").textContent`),
		"The assistant proposes a change to this item.")
	require.True(t, eval[bool](t, ctx, prefItem("Travel by train")+`.querySelector("button.apply, button.dismiss") === null`), "Apply and Dismiss live in the review list")
	require.Equal(t, "The assistant proposes: change #1 “Travel by train” (locked) to “Cheapest transport” — Train or plane [hard]",
		eval[string](t, ctx, pendingItem("Cheapest transport")+`.querySelector(".what").textContent`))
	require.Equal(t, "Now: “Travel by train” — No flights [hard]Would be: “Cheapest transport” — Train or plane [hard]",
		eval[string](t, ctx, pendingItem("Cheapest transport")+`.querySelector(".full").textContent`))
	require.Contains(t, eval[string](t, ctx, eventItem("locked_skip", "Travel by train")+`.textContent`),
		"The assistant wanted to change #1 “Travel by train”, which is locked, to “Cheapest transport” — Train or plane [hard]")
	saveScreenshot(t, ctx, "panel-proposal", "the assistant's proposal for a locked preference")

	// The highlight fades: after a few seconds nothing is highlighted.
	within(t, ctx, waitFor(`document.querySelectorAll(".fresh").length === 0`))

	// The removal, reverted: "Small hotels" is back, and its removal says who reverted it.
	within(t, ctx,
		click(eventItem("preference_removed", "Small hotels")+`.querySelector("button.revert")`),
		waitFor(prefItem("Small hotels")+` !== undefined`),
		waitFor(eventItem("preference_removed", "Small hotels")+`.querySelector(".reverted-by") !== null`))
	require.Contains(t, eval[string](t, ctx, eventItem("preference_removed", "Small hotels")+`.querySelector(".reverted-by").textContent`), "Reverted by a user")
	require.False(t, eval[bool](t, ctx, eventItem("preference_removed", "Small hotels")+`.querySelector("button") !== null`), "no button on a reverted change")

	// Apply: the proposal becomes the user's change, the lock stays, the proposal is gone.
	within(t, ctx,
		click(pendingItem("Cheapest transport")+`.querySelector("button.apply")`),
		waitFor(prefItem("Cheapest transport")+` !== undefined`),
		waitFor(eventItem("preference_updated", "Applied the assistant's proposal: change #1 “Travel by train” (locked) to “Cheapest transport” — Train or plane [hard]")+` !== undefined`))
	require.Equal(t, "The user accepts flying when it is cheaper.",
		eval[string](t, ctx, eventItem("preference_updated", "Applied the assistant's proposal")+`.querySelector(".reason").textContent`), "the assistant's reason, kept")
	require.True(t, eval[bool](t, ctx, prefItem("Cheapest transport")+`.querySelector(".badge.locked") !== null`))
	require.True(t, eval[bool](t, ctx, `document.querySelector(".proposal") === null && document.querySelector("button.apply") === null`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+trip, "", &ws))
	require.Equal(t, "Cheapest transport", ws.Preferences[0].Title)
	require.True(t, ws.Preferences[0].Locked)

	// A second proposal, left pending for the picture.
	turn("Could you keep the trip short, a week at most?",
		upstreamtest.Call{ID: "c5", Name: "add_preferences", Arguments: `{"items":[{"title":"One week at most"}],"action_and_reasoning":"The user wants a short trip."}`},
		upstreamtest.Call{ID: "c6", Name: "update_preferences", Arguments: `{"updates":[{"index":1,"subtitle":"Train, or a plane under €80"}],"action_and_reasoning":"The user gave a price for flights."}`})
	within(t, ctx, waitFor(prefItem("Cheapest transport")+`.querySelector(".proposal") !== null`), waitFor(`document.querySelectorAll(".fresh").length === 0`))
	saveScreenshot(t, ctx, "panel-thread", "a thread at 1280 px")
	// At 1280 px a preference's badges and buttons hold on one line, under its title.
	require.True(t, eval[bool](t, ctx, `[...document.querySelectorAll("li.pref")].every(li => {
		const rs = [...li.children].filter(e => e.matches("button, label, .badge")).map(e => e.getBoundingClientRect());
		return rs.length >= 7 && rs.every(r => r.top < rs[0].bottom && r.bottom > rs[0].top); })`), "a preference's buttons on one line")
	if path := os.Getenv("WSPROXY_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, png, 0o644))
		t.Logf("the README's picture: %s", path)
	}

	// On a phone (390 px) the history is one tap away.
	phone := user()
	signIn(t, phone, m.URL, m.AdminToken)
	within(t, phone,
		chromedp.EmulateViewport(390, 844),
		chromedp.Navigate(m.URL+"/ui/#/t/"+trip),
		waitFor(`document.querySelectorAll("li.event").length > 0`))
	require.Greater(t, eval[float64](t, phone, `document.querySelector("#history").getBoundingClientRect().top`), 844.0, "below the fold")
	within(t, phone, click(`document.querySelector("#to-history")`),
		waitFor(`(r => r.top >= -1 && r.top < innerHeight)(document.querySelector("#history").getBoundingClientRect())`))
	require.LessOrEqual(t, eval[float64](t, phone, `document.documentElement.scrollWidth`), 390.0)
	saveScreenshot(t, phone, "panel-phone-history", "the history on a phone, one tap away")
}

// TestPanelChangeBeforeItsStream: a change committed after the panel read the thread and before
// its event stream started shows, live: the page's stream request is held in the browser (the
// DevTools protocol's Fetch domain) while the change commits, then let go.
func TestPanelChangeBeforeItsStream(t *testing.T) {
	t.Parallel()
	m, _ := MustRunMain(t, nil)
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/gap/objective", `{"text":"Read by the page"}`, nil))
	ctx := newBrowser(t)()
	signIn(t, ctx, m.URL, m.AdminToken)
	within(t, ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		paused, stop := context.WithCancel(ctx)
		defer stop()
		held := cdp.Events(paused, tg, fetch.RequestPaused) // subscribed before the page may ask
		if _, err := cdp.Call(ctx, tg, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/events/stream*"}}}); err != nil {
			return err
		}
		if _, err := click(`document.querySelector('#threads a[href="#/t/gap"]')`)(ctx, tg); err != nil {
			return err
		}
		for ev, err := range held {
			if err != nil {
				return err
			}
			// The page has read the thread and its history; its stream has not started.
			require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/gap/preferences", `{"title":"Between"}`, nil))
			if _, err := cdp.Call(ctx, tg, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID}); err != nil {
				return err
			}
			break
		}
		_, err := cdp.Call(ctx, tg, fetch.Disable, cdp.Empty{})
		return err
	}),
		waitFor(eventItem("objective_set", "")+` !== undefined`),
		waitFor(eventItem("preference_added", "Between")+` !== undefined`),
		waitFor(prefItem("Between")+` !== undefined`))
}

// TestPanelShowsACompaction: a client's compaction of its history (docs/spec.md §18) is an entry
// of the thread's timeline in words, "The client compacted its history", by a client's request,
// with no Revert button (it changed nothing); one recorded while the page is open arrives live.
func TestPanelShowsACompaction(t *testing.T) {
	t.Parallel()
	m, _ := MustRunMain(t, nil)
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/agent/preferences", `{"title":"Run the tests","locked":true}`, nil))
	ws := workspace.NewStore(m.pool, workspace.Options{}).Workspace(workspace.ThreadID{Name: "agent"})
	require.NoError(t, ws.NoteCompaction(context.Background()))
	ctx := newBrowser(t)()
	signIn(t, ctx, m.URL, m.AdminToken)
	compacted := eventItem("compaction", "The client compacted its history")
	within(t, ctx,
		chromedp.Navigate(m.URL+"/ui/#/t/agent"),
		waitFor(compacted+` !== undefined`),
		waitFor(prefItem("Run the tests")+` !== undefined`))
	require.Equal(t, "The client compacted its history", eval[string](t, ctx, compacted+`.querySelector(".what").textContent`))
	require.Contains(t, eval[string](t, ctx, compacted+`.querySelector(".meta").textContent`), "a client's request")
	require.Zero(t, eval[int](t, ctx, compacted+`.querySelectorAll("button").length`), "nothing to revert, apply or dismiss")
	require.Equal(t, 1, eval[int](t, ctx, `document.querySelectorAll('li.event button.revert').length`), "the preference's addition has its Revert")

	// Live: one more, recorded while the page is open.
	require.NoError(t, ws.NoteCompaction(context.Background()))
	within(t, ctx, waitFor(`document.querySelectorAll('li.event[data-kind="compaction"]').length === 2`))
	saveScreenshot(t, ctx, "panel-compaction", "a thread's history with two compactions")
}
