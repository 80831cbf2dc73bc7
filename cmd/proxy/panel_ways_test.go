package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// aliceKey is the client key of the tests' client alice.
const aliceKey = "sk-alice-0123456789abcdef"

// textboxesNamed is the values of the page's text boxes whose accessible name (as Chromium
// computes it for assistive technology: a <label for>, aria-label, …) is name.
func textboxesNamed(t *testing.T, ctx context.Context, name string) []string {
	t.Helper()
	return controlsNamed(t, ctx, "textbox", name)
}

// controlsNamed is the values of the page's controls of role (textbox, spinbutton, …) whose
// accessible name is name.
func controlsNamed(t *testing.T, ctx context.Context, role, name string) []string {
	t.Helper()
	var out []string
	within(t, ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		body, err := cdp.Call(ctx, tg, runtime.Evaluate, runtime.EvaluateParams{Expression: "document.body"})
		if err != nil {
			return err
		}
		res, err := cdp.Call(ctx, tg, accessibility.QueryAXTree, accessibility.QueryAXTreeParams{ObjectID: body.Result.ObjectID, AccessibleName: name, Role: role})
		if err != nil {
			return err
		}
		for _, n := range res.Nodes {
			if n.Ignored {
				continue
			}
			var v string // a text box's value is a string, a spin button's a number: its digits
			if n.Value != nil && json.Unmarshal(n.Value.Value, &v) != nil {
				v = string(n.Value.Value)
			}
			out = append(out, v)
		}
		return nil
	}))
	return out
}

// clientTurn runs a thread turn of the client whose key is key (none: without client keys).
func clientTurn(t *testing.T, m *Main, key, thread, text string) {
	t.Helper()
	req, err := http.NewRequest("POST", m.URL+"/threads/"+thread+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":`+jsString(text)+`}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, string(b))
}

// TestPanelFindsItsWay: what a user meets on a thread's page after the first hour. Who is signed
// in, in words (the admin, a client, a link's one thread); a way back to the list; the thread's
// token usage; a locked item keeps its kind's badge; the edit fields are labelled (their
// accessible names); the favicon; a revert in the way of later changes names the latest of them
// and undoes back to itself in one step (each step a revert event); a thread deleted after a
// confirmation in the page. Its pictures go to docs/ with WSPROXY_SCREENSHOTS=docs.
func TestPanelFindsItsWay(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	m, _ := MustRunMain(t, func(c *Config) {
		c.UpstreamBaseURL = up.URL
		c.UpstreamAPIKey = "sk-upstream"
		c.ClientKeys = "alice=" + aliceKey
	})
	user := newBrowser(t)

	// alice's thread: the assistant adds "Gardens" in a turn (two rounds: their usage adds up);
	// a user renames and locks it, and adds a locked hard one.
	up.Script(upstreamtest.JSON(200, upstreamtest.Completion("", upstreamtest.Call{ID: "c1", Name: "add_preferences",
		Arguments: `{"items":[{"title":"Gardens"}],"action_and_reasoning":"The user likes gardens."}`})),
		upstreamtest.JSON(200, upstreamtest.Completion("Noted.")))
	clientTurn(t, m, aliceKey, "lisbon", "I like gardens.")
	const thread = "alice~lisbon"
	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+thread, "", &ws))
	pref := fmt.Sprintf("/admin/v1/threads/%s/preferences/%d", thread, ws.Preferences[0].ID)
	require.Equal(t, 200, adminCall(t, m, "PATCH", pref, `{"title":"Botanical gardens"}`, nil))
	require.Equal(t, 200, adminCall(t, m, "PATCH", pref, `{"locked":true}`, nil))
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/"+thread+"/preferences", `{"title":"Small hotels","subtitle":"Family-run","kind":"hard","locked":true}`, nil))
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/"+thread+"/preferences", `{"title":"Tram 28"}`, nil))
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/"+thread+"/objective", `{"text":"A slow week in Lisbon"}`, nil))
	// The turn's usage is written in the background: the page shows it once it is.
	var usage struct {
		Usage map[string]int64 `json:"usage"`
	}
	require.Eventually(t, func() bool {
		return adminCall(t, m, "GET", "/admin/v1/threads/"+thread, "", &usage) == 200 && usage.Usage["prompt_tokens"] == 20
	}, time.Minute, 50*time.Millisecond)

	// The admin: who, in words; the thread from the list.
	ctx := user()
	signIn(t, ctx, m.URL, m.AdminToken)
	require.Equal(t, "Signed in as the admin", eval[string](t, ctx, `document.querySelector("#who").textContent`))
	within(t, ctx,
		click(`document.querySelector('#threads a[href="#/t/`+thread+`"]')`),
		waitFor(prefItem("Botanical gardens")+` !== undefined`),
		waitFor(`document.querySelector("#usage dd") !== null`))

	// The usage: prompt, cached, completion and cache writes, summed over the two rounds.
	require.Equal(t, []any{"Prompt", "Cached", "Completion", "Cache writes"}, eval[[]any](t, ctx, `[...document.querySelectorAll("#usage dt")].map(e => e.textContent)`))
	require.Equal(t, []any{"20", "4", "10", "0"}, eval[[]any](t, ctx, `[...document.querySelectorAll("#usage dd")].map(e => e.textContent)`))
	// A locked item keeps its kind.
	badges := func(title string) []any {
		return eval[[]any](t, ctx, `[...`+prefItem(title)+`.querySelectorAll(".badge")].map(b => b.textContent)`)
	}
	require.Equal(t, []any{"soft", "locked"}, badges("Botanical gardens"))
	require.Equal(t, []any{"hard", "locked"}, badges("Small hotels"))
	require.Equal(t, []any{"soft"}, badges("Tram 28"))
	require.True(t, eval[bool](t, ctx, `[...document.querySelectorAll("li.pref")].every(li => [...li.childNodes].every(n => n.nodeType === Node.ELEMENT_NODE))`),
		"no stray text beside an item's badges")

	// The edit fields have labels: their accessible names say which field of which item.
	within(t, ctx, click(`document.querySelector('button[aria-label="Edit #1 Botanical gardens"]')`),
		waitFor(`document.activeElement && document.activeElement.classList.contains("edit-title")`))
	require.Equal(t, []string{"Botanical gardens"}, textboxesNamed(t, ctx, "Title of #1"))
	require.Equal(t, []string{""}, textboxesNamed(t, ctx, "Subtitle of #1"))
	require.Equal(t, []string{""}, textboxesNamed(t, ctx, "Title"), "the add form's")
	within(t, ctx, click(`[...document.querySelectorAll("li.pref.editing button")].find(b => b.textContent === "Cancel")`),
		waitFor(prefItem("Botanical gardens")+`.querySelector("button.edit") !== null`))

	// The favicon: linked from the page, served with it.
	require.Equal(t, "200 image/svg+xml", eval[string](t, ctx,
		`(async () => { const r = await fetch(document.querySelector('link[rel="icon"]').href); return r.status + " " + r.headers.get("Content-Type"); })()`))

	// Reverting the assistant's addition meets the rename and the lock since: the message names
	// the latest (the lock), and offers the undo back to the addition in one step.
	added := eventItem("preference_added", "likes gardens")
	within(t, ctx,
		click(added+`.querySelector("button.revert")`),
		waitFor(added+`.querySelector("button.revert-through") !== null`))
	require.Regexp(t, `^This changed again since\. The latest change: Locked #1 “Botanical gardens” \(a user, .+\)\. Revert that change first, or undo back to this one in one step\.$`,
		eval[string](t, ctx, added+`.querySelector(".error").textContent`))
	require.Equal(t, "Undo back to this change", eval[string](t, ctx, added+`.querySelector("button.revert-through").textContent`))
	within(t, ctx, waitFor(`document.querySelectorAll(".fresh").length === 0`))
	docsPicture(t, ctx, "panel-revert-conflict", "a revert in the way of later changes: the latest named, and the undo back to it in one step")
	within(t, ctx,
		click(added+`.querySelector("button.revert-through")`),
		waitFor(prefItem("Botanical gardens")+` === undefined`),
		waitFor(added+`.querySelector(".reverted-by") !== null`),
		waitFor(`document.querySelectorAll('li.event[data-kind="revert"]').length === 3`))
	require.False(t, eval[bool](t, ctx, added+`.querySelector("button.revert-through, button.revert") !== null`))
	// Newest first: the addition's revert was the last step.
	require.Equal(t, []any{"Undid: Added “Gardens” [soft]", "Undid: Changed: “Gardens” → “Botanical gardens”", "Undid: Locked “Botanical gardens”"},
		eval[[]any](t, ctx, `[...document.querySelectorAll('li.event[data-kind="revert"] .what')].map(e => e.textContent)`))
	var evs struct {
		Data []struct {
			Kind    string `json:"kind"`
			Actor   string `json:"actor"`
			Reverts int64  `json:"reverts"`
		} `json:"data"`
	}
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+thread+"/events?order=desc&limit=3", "", &evs))
	require.Len(t, evs.Data, 3)
	for i, want := range []int64{1, 2, 3} { // newest first: the addition's revert was the last step
		require.Equal(t, "revert", evs.Data[i].Kind)
		require.Equal(t, "user", evs.Data[i].Actor)
		require.Equal(t, want, evs.Data[i].Reverts)
	}

	// Back to the list, by the link at the top.
	require.True(t, eval[bool](t, ctx, `(r => r.width > 0 && r.bottom > 0 && r.top < innerHeight)(document.querySelector("#back").getBoundingClientRect())`), "visible")
	within(t, ctx, click(`document.querySelector("#back")`), waitFor(`document.querySelector('#threads a[href="#/t/`+thread+`"]') !== null`))

	// Deleting the thread asks first; Cancel keeps it, the confirmation erases it.
	within(t, ctx,
		click(`document.querySelector('#threads a[href="#/t/`+thread+`"]')`),
		waitFor(`document.querySelector("#delete-thread") !== null`),
		click(`document.querySelector("#delete-thread")`),
		waitFor(`!document.querySelector("#delete-confirm").hidden && document.activeElement === document.querySelector("#delete-cancel")`))
	require.Equal(t, "Delete thread alice~lisbon? Its objective, its preferences and all its history are erased. This cannot be undone.",
		eval[string](t, ctx, `document.querySelector("#delete-question").textContent`))
	docsPicture(t, ctx, "panel-delete", "deleting a thread: the confirmation")
	within(t, ctx, click(`document.querySelector("#delete-cancel")`), waitFor(`document.querySelector("#delete-confirm").hidden`))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+thread, "", nil))
	within(t, ctx,
		click(`document.querySelector("#delete-thread")`),
		click(`document.querySelector("#delete-yes")`),
		waitFor(`location.hash === "#/" && document.querySelector("#notice") !== null && !document.querySelector("#notice").hidden`))
	require.Equal(t, "Deleted thread alice~lisbon.", eval[string](t, ctx, `document.querySelector("#notice").textContent`))
	require.Equal(t, 404, adminCall(t, m, "GET", "/admin/v1/threads/"+thread, "", nil))

	// alice, by her key: in words too.
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/alice~porto/objective", `{"text":"A weekend in Porto"}`, nil))
	alice := user()
	within(t, alice,
		chromedp.Navigate(m.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), aliceKey+kb.Enter),
		waitFor(`document.querySelector("#who").textContent.startsWith("Signed in")`))
	require.Equal(t, "Signed in as client alice", eval[string](t, alice, `document.querySelector("#who").textContent`))

	// A link's holder: its one thread, named; no list to go back to, nothing to delete.
	var l struct {
		URL string `json:"url"`
	}
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/alice~porto/links", `{}`, &l))
	visitor := user()
	within(t, visitor, chromedp.Navigate(l.URL), waitFor(`document.querySelector("#objective") !== null && document.querySelector("#objective").textContent !== ""`))
	require.Equal(t, "Signed in for thread porto of client alice", eval[string](t, visitor, `document.querySelector("#who").textContent`))
	require.True(t, eval[bool](t, visitor, `document.querySelector("#back") === null && document.querySelector("#delete-thread") === null`))
}

// TestPanelAtTheRoot: GET / sends a browser to the panel while it is on (another method is the
// JSON 405), and is the edge's JSON 404 with UI=off; other paths are the edge's either way.
func TestPanelAtTheRoot(t *testing.T) {
	t.Parallel()
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(m *Main, path string) (*http.Response, string) {
		resp, err := noFollow.Get(m.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	on, _ := MustRunMain(t, nil)
	resp, _ := get(on, "/")
	require.Equal(t, http.StatusFound, resp.StatusCode)
	require.Equal(t, "/ui/", resp.Header.Get("Location"))
	// Another method on / meets the route: the JSON 405 with its Allow.
	post, err := http.Post(on.URL+"/", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	post.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, post.StatusCode)
	require.Equal(t, "GET, HEAD", post.Header.Get("Allow"))
	resp, body := get(on, "/nothing-here")
	require.Equal(t, 404, resp.StatusCode)
	require.Contains(t, body, `"not_found"`)

	off, _ := MustRunMain(t, func(c *Config) { c.UI = "off" })
	resp, body = get(off, "/")
	require.Equal(t, 404, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "application/json")
	require.Contains(t, body, `"not_found"`)
}
