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

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
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
		t.Logf("screenshot of the failure: %s", path)
	}
}

// within runs browser steps with a deadline.
func within(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(sctx, steps...))
}

// waitFor waits until the JavaScript expression is true in the page, through navigations (a
// page that goes away mid-poll takes its poll with it: the next page is polled anew).
func waitFor(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		deadline := time.Now().Add(15 * time.Second)
		for {
			_, err := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(time.Until(deadline)))(ctx, tg)
			if err == nil || time.Now().After(deadline) || ctx.Err() != nil || !strings.Contains(err.Error(), "context") {
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
		waitFor(`document.querySelector("#who").textContent.includes("signed in")`),
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
		waitFor(eventItem("preference_locked", "preference 1")+` !== undefined`),
	)
	var ws workspace
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
		waitFor(eventItem("revert", "undoes")+` !== undefined`),
	)
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/trip", "", &ws))
	require.Len(t, ws.Preferences, 1)

	// A stale revert: the agent adds, the user renames elsewhere; reverting the addition is a
	// 409 shown in the page, naming the later event.
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("", upstreamtest.Call{ID: "c3", Name: "add_preferences",
		Arguments: `{"items":[{"title":"Gardens"}],"action_and_reasoning":"The user likes gardens."}`})),
		upstreamtest.JSON(200, upstreamtest.Completion("Noted.")))
	threadTurn(t, m, "trip", "I like gardens.")
	within(t, ctx, waitFor(eventItem("preference_added", "likes gardens")+` !== undefined`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/trip", "", &ws))
	gardens := ws.Preferences[len(ws.Preferences)-1]
	require.Equal(t, 200, adminCall(t, m, "PATCH", fmt.Sprintf("/admin/v1/threads/trip/preferences/%d", gardens.ID), `{"title":"Botanical gardens"}`, nil))
	within(t, ctx, waitFor(eventItem("preference_updated", "Botanical gardens")+` !== undefined`))
	later := eval[string](t, ctx, eventItem("preference_updated", "Botanical gardens")+`.dataset.event`)
	within(t, ctx,
		click(eventItem("preference_added", "likes gardens")+`.querySelector("button.revert")`),
		waitFor(`!document.querySelector("#error").hidden`))
	require.Contains(t, eval[string](t, ctx, `document.querySelector("#error").textContent`), "event "+later)

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
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/trip/links", `{"ttl_seconds":4}`, &l))
	visitor := user()
	within(t, visitor,
		chromedp.Navigate(l.URL),
		waitFor(`location.hash === "#/t/trip" && document.querySelector("#objective") !== null && document.querySelector("#objective").textContent !== ""`),
	)
	require.Equal(t, "Plan a trip to Lisbon", eval[string](t, visitor, `document.querySelector("#objective").textContent`))
	within(t, visitor,
		chromedp.Navigate(m.URL+"/ui/#/t/secret"),
		waitFor(`!document.querySelector("#error").hidden`),
	)
	require.Equal(t, "not found", eval[string](t, visitor, `document.querySelector("#error").textContent`))
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

	// The README's picture of the panel (WSPROXY_SCREENSHOT=path).
	if path := os.Getenv("WSPROXY_SCREENSHOT"); path != "" {
		shot := user()
		signIn(t, shot, m.URL, m.AdminToken)
		within(t, shot, chromedp.Navigate(m.URL+"/ui/#/t/trip"), waitFor(`document.querySelectorAll("li.event").length > 3`))
		png, err := chromedp.Run(shot, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, png, 0o644))
	}
}

// threadTurn runs a thread turn through the program.
func threadTurn(t *testing.T, m *Main, thread, text string) {
	t.Helper()
	req, err := http.NewRequest("POST", m.URL+"/threads/"+thread+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":`+jsString(text)+`}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}
