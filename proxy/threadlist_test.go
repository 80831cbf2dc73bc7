package proxy

import (
	"context"
	"net/url"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestThreadCursorsScoped: a thread list's cursor is scoped like the list (docs/spec.md §8,
// §15): one that names a thread outside the caller's namespace — another client's, bare or as
// that client's own listing gave it — is refused (400 on the admin REST, invalid params over
// MCP) rather than paging from that thread's place, which would tell whether it exists and when
// it last changed. The caller's own cursors, and the admin's of any thread, page as before.
func TestThreadCursorsScoped(t *testing.T) {
	t.Parallel()
	keys, err := ParseClientKeys("alice=key-alice,bob=key-bob")
	require.NoError(t, err)
	e := setup(t, func(o *Options) { o.ClientKeys, o.UpstreamAPIKey = keys, "sk-up" })
	for _, th := range []string{"alice~a1", "bob~t1", "alice~a2"} {
		e.admin("PUT", "/admin/v1/threads/"+th+"/objective", map[string]any{"text": "goal"}, 200, nil)
	}
	var all page[workspace.Thread]
	e.admin("GET", "/admin/v1/threads", nil, 200, &all)
	cursors := map[string]string{}
	for _, th := range all.Data {
		cursors[th.ID] = th.Cursor
	}
	alice := e.panelClient()
	require.Equal(t, 200, alice.SignIn("key-alice"))
	for _, after := range []string{"bob~t1", cursors["bob~t1"]} {
		code, body := alice.Do("GET", "/admin/v1/threads?after="+url.QueryEscape(after), "", nil)
		require.Equal(t, 400, code, "after=%s: %s", after, body)
		testkit.RequireErrorBody(t, body, "invalid_request_error", "invalid_value")
	}
	code, body := alice.Do("GET", "/admin/v1/threads?after="+url.QueryEscape(cursors["alice~a2"]), "", nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"alice~a1"`)
	var p page[workspace.Thread]
	e.admin("GET", "/admin/v1/threads?after=bob~t1", nil, 200, &p)
	require.Equal(t, "alice~a1", p.Data[0].ID, "the admin's listing holds every thread")

	cs := testkit.MCPConnect(t, e.srv.URL, "key-alice", testkit.MCPLatest, nil)
	for _, cursor := range []string{"bob~t1", cursors["bob~t1"]} {
		_, err := cs.ListResources(context.Background(), &mcp.ListResourcesParams{Cursor: cursor})
		require.ErrorContains(t, err, "cursor", cursor)
	}
	res, err := cs.ListResources(context.Background(), &mcp.ListResourcesParams{Cursor: cursors["alice~a2"]})
	require.NoError(t, err)
	require.Len(t, res.Resources, 1)
	require.Equal(t, "workspace://a1", res.Resources[0].URI)
}
