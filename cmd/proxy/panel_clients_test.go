package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestPanelClients: the admin's Clients page in Chromium (docs/spec.md §20): create a client and
// copy its key, shown once; the key works; set its limits in the page and see its usage grow
// after a request with its key; add a second key (rotation), revoke the first; a limit of 0
// refused with the server's words, a limit cleared; delete the client — each as the REST then
// says.
func TestPanelClients(t *testing.T) {
	t.Parallel()
	m, _ := MustRunMain(t, nil)
	user := newBrowser(t)
	ctx := user()
	rec := &recorder{}
	signIn(t, ctx, m.URL, m.AdminToken)
	within(t, ctx,
		click(`document.querySelector("#clients-link")`),
		chromedp.WaitVisible(chromedp.CSS("#client-form")),
		chromedp.SendKeys(chromedp.CSS("#client-name"), "alice"),
		click(`document.querySelector("#client-form button[type=submit]")`),
		waitFor(`document.querySelector("#new-key-value") !== null && document.querySelector('li[data-client="alice"]') !== null`),
	)
	key := eval[string](t, ctx, `document.querySelector("#new-key-value").textContent`)
	require.True(t, strings.HasPrefix(key, "wsp_"), key)
	// The copy button puts the key on the clipboard (the page's clipboard, stubbed: headless
	// Chromium grants none).
	eval[bool](t, ctx, `navigator.clipboard.writeText = (s) => { window.copied = s; return Promise.resolve(); }, true`)
	within(t, ctx, click(`document.querySelector("#copy-key")`), waitFor(`document.querySelector("#copy-key").textContent === "Copied"`))
	require.Equal(t, key, eval[string](t, ctx, `window.copied`))
	require.Equal(t, 200, rec.turn(t, m, key, "t1"), "the key made in the panel works")
	// Shown once: gone when dismissed, and the list shows its prefix only.
	within(t, ctx, click(`document.querySelector("#key-done")`), waitFor(`document.querySelector("#new-key-value") === null`))
	require.NotContains(t, eval[string](t, ctx, `document.body.innerText`), key)
	require.Contains(t, eval[string](t, ctx, `document.querySelector('li[data-client="alice"]').innerText`), key[:8]+"…")

	// Limits: set in the page (empty is none), read back over the REST, said beside the usage.
	within(t, ctx,
		chromedp.SendKeys(chromedp.CSS("#limit-alice-requests_per_minute"), "600"),
		chromedp.SendKeys(chromedp.CSS("#limit-alice-tokens_per_day"), "1000000"),
		click(`document.querySelector('button[aria-label="Save the limits of alice"]')`),
		waitFor(usageIs("alice", "requests_this_minute", " this minute of 600")+" && "+usageIs("alice", "tokens_today", " tokens today of 1,000,000")+
			" && "+usageText("alice", "max_threads")+` === "no thread limit" && `+usageText("alice", "requests_today")+` === "1 request today"`),
	)
	require.Equal(t, clientLimits{RequestsPerMinute: ptr[int64](600), TokensPerDay: ptr[int64](1000000)}, getClient(t, m, "alice").Limits)
	// The form shows the limits set; its fields' accessible names say which limit of which client.
	require.Equal(t, []string{"600"}, controlsNamed(t, ctx, "spinbutton", "Requests per minute of alice"))
	require.Equal(t, []string{"1000000"}, controlsNamed(t, ctx, "spinbutton", "Tokens per day of alice"))
	require.Equal(t, []string{""}, controlsNamed(t, ctx, "spinbutton", "Max threads of alice"))
	// Usage: a request with alice's key shows on the page (which reads it again while it shows).
	require.Equal(t, 200, rec.turn(t, m, key, "t2"))
	within(t, ctx, waitFor(usageText("alice", "requests_today")+` === "2 requests today" && !`+usageText("alice", "tokens_today")+`.startsWith("0 ")`))
	shownTokens := eval[string](t, ctx, usageText("alice", "tokens_today"))
	u := getClient(t, m, "alice").Usage
	require.EqualValues(t, 2, u.RequestsToday)
	n, err := strconv.ParseInt(strings.ReplaceAll(strings.TrimSuffix(shownTokens, " tokens today of 1,000,000"), ",", ""), 10, 64)
	require.NoError(t, err, shownTokens)
	require.True(t, n > 0 && n <= u.TokensToday, "the page shows %q, the REST %d tokens today", shownTokens, u.TokensToday)

	// Rotate: a second key; revoke the first.
	within(t, ctx,
		click(`document.querySelector('button[aria-label="Add a key to alice"]')`),
		waitFor(`document.querySelector("#new-key-value") !== null && document.querySelectorAll('li[data-client="alice"] .keys li').length === 2`),
	)
	key2 := eval[string](t, ctx, `document.querySelector("#new-key-value").textContent`)
	docsPicture(t, ctx, "panel-clients", "the Clients page: a second key, shown once, beside the first's prefix")
	require.NotEqual(t, key, key2)
	require.Equal(t, 200, rec.turn(t, m, key2, "t1"))
	require.Equal(t, 200, rec.turn(t, m, key, "t1"), "both keys work")
	within(t, ctx,
		click(`document.querySelector('button[aria-label="Revoke key `+key[:8]+`… of alice"]')`),
		waitFor(`document.querySelectorAll('li[data-client="alice"] .keys li').length === 1`),
	)
	require.Equal(t, 401, rec.turn(t, m, key, "t1"), "the revoked key")
	require.Equal(t, 200, rec.turn(t, m, key2, "t1"))

	// A limit of 0 is refused (revoking is how a client is refused everything): the server's
	// words in the page's error box, the limits unchanged.
	within(t, ctx,
		setValue("#limit-alice-max_threads", "0"),
		click(`document.querySelector('button[aria-label="Save the limits of alice"]')`),
		waitFor(`(() => { const e = document.querySelector("#clients-error"); return !e.hidden && e.textContent.includes("limits.max_threads must be 1 or more"); })()`),
	)
	require.Equal(t, clientLimits{RequestsPerMinute: ptr[int64](600), TokensPerDay: ptr[int64](1000000)}, getClient(t, m, "alice").Limits)
	// Emptied, a limit is cleared; the others stay.
	within(t, ctx,
		setValue("#limit-alice-max_threads", "3"),
		setValue("#limit-alice-requests_per_minute", ""),
		click(`document.querySelector('button[aria-label="Save the limits of alice"]')`),
		waitFor(usageIs("alice", "requests_this_minute", " this minute, no limit")+" && "+usageText("alice", "max_threads")+` === "at most 3 threads" && document.querySelector("#clients-error").hidden`),
	)
	require.Equal(t, clientLimits{TokensPerDay: ptr[int64](1000000), MaxThreads: ptr[int64](3)}, getClient(t, m, "alice").Limits)

	// Delete, after asking in the page.
	within(t, ctx,
		click(`document.querySelector('button[aria-label="Delete client alice"]')`),
		click(`document.querySelector('button[aria-label="Delete alice for good"]')`),
		waitFor(`document.querySelector('li[data-client="alice"]') === null`),
	)
	require.Equal(t, 401, rec.turn(t, m, key2, "t1"), "the deleted client's key")
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/alice~t1", "", nil), "its thread stays")
}

// clientLimits and clientUsage are a client's limits and usage as the clients' REST says them.
type clientLimits struct {
	RequestsPerMinute *int64 `json:"requests_per_minute"`
	TokensPerDay      *int64 `json:"tokens_per_day"`
	MaxThreads        *int64 `json:"max_threads"`
}

type clientUsage struct {
	RequestsThisMinute int64 `json:"requests_this_minute"`
	RequestsToday      int64 `json:"requests_today"`
	TokensToday        int64 `json:"tokens_today"`
}

// getClient reads a client over the admin REST.
func getClient(t *testing.T, m *Main, name string) (c struct {
	Limits clientLimits `json:"limits"`
	Usage  clientUsage  `json:"usage"`
}) {
	t.Helper()
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/clients/"+name, "", &c))
	return c
}

func ptr[T any](v T) *T { return &v }

// usageText is the expression of the text the Clients page shows of client's usage or limit
// (data-usage: requests_this_minute, requests_today, tokens_today, max_threads), "" while none.
func usageText(client, part string) string {
	return `((document.querySelector('li[data-client="` + client + `"] [data-usage="` + part + `"]') || {}).textContent || "")`
}

// usageIs is the expression that the page's usageText of client's part ends with suffix.
func usageIs(client, part, suffix string) string {
	return usageText(client, part) + `.endsWith(` + jsString(suffix) + `)`
}

// setValue sets the value of the input sel finds, as typing would (an input event).
func setValue(sel, value string) chromedp.Action[chromedp.Void] {
	return waitFor(`(() => { const e = document.querySelector(` + jsString(sel) + `); if (!e) return false; e.value = ` + jsString(value) +
		`; e.dispatchEvent(new Event("input", { bubbles: true })); return true; })()`)
}
