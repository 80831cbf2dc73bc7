package main

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestPanelClients: the admin's Clients page in Chromium (docs/spec.md §20): create a client and
// copy its key, shown once; the key works; add a second key (rotation), revoke the first, delete
// the client — each as the REST then says.
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

	// Delete, after asking in the page.
	within(t, ctx,
		click(`document.querySelector('button[aria-label="Delete client alice"]')`),
		click(`document.querySelector('button[aria-label="Delete alice for good"]')`),
		waitFor(`document.querySelector('li[data-client="alice"]') === null`),
	)
	require.Equal(t, 401, rec.turn(t, m, key2, "t1"), "the deleted client's key")
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/alice~t1", "", nil), "its thread stays")
}
