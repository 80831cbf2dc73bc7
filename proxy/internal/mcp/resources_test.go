package mcp

import (
	"context"
	"fmt"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestMCPResourcesPaged: resources/list pages through every thread of the scope (a hundred a
// page), most recently updated first, each once; a client's pages hold its threads alone.
func TestMCPResourcesPaged(t *testing.T) {
	t.Parallel()
	e := setup(t, withClientKeys(t, "alice=key-alice"))
	ctx := context.Background()
	for i := range 230 {
		id := workspace.ThreadID{Name: fmt.Sprintf("page-%03d", i)}
		if i%2 == 1 {
			id.Client = "alice"
		}
		_, err := e.store.Workspace(id).SetObjective(ctx, fmt.Sprintf("Goal %d", i))
		require.NoError(t, err)
	}
	list := func(token string) []string {
		cs := testkit.MCPConnect(t, e.srv.URL, token, testkit.MCPLatest, nil)
		var uris []string
		pages := 0
		cursor := ""
		for {
			res, err := cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
			require.NoError(t, err)
			pages++
			for _, r := range res.Resources {
				uris = append(uris, r.URI)
			}
			if res.NextCursor == "" {
				break
			}
			cursor = res.NextCursor
		}
		require.Equal(t, (len(uris)+99)/100, pages)
		return uris
	}
	all := list(adminToken)
	require.Len(t, all, 230)
	require.Equal(t, "workspace://alice~page-229", all[0], "the most recently updated first")
	seen := map[string]bool{}
	for _, u := range all {
		require.False(t, seen[u], "listed twice: %s", u)
		seen[u] = true
	}
	mine := list("key-alice")
	require.Len(t, mine, 115)
	require.Equal(t, "workspace://page-229", mine[0])
	for _, u := range mine {
		require.NotContains(t, u, "~")
	}

	cs := testkit.MCPConnect(t, e.srv.URL, adminToken, testkit.MCPLatest, nil)
	_, err := cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: "not-a-cursor,x"})
	require.ErrorContains(t, err, "cursor")
}

// TestResourceVersionOfAnEmptyThread: what a subscription compares (docs/spec.md §15) moves with
// the thread's events and its deletion only: a thread a turn's start created, with no event
// yet, is at the version of one that does not exist — a watch that reads between a first turn's
// start and its first event tells no change, and that event is then told once — while its
// first event, and the deletion of a thread that had events, are changes.
func TestResourceVersionOfAnEmptyThread(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	ws := e.ws("fresh")
	absent, _, err := versions(ctx, ws)
	require.NoError(t, err)
	_, err = ws.StartTurn(ctx, workspace.TurnOptions{})
	require.NoError(t, err)
	created, _, err := versions(ctx, ws)
	require.NoError(t, err)
	require.Equal(t, absent, created, "a thread created without an event is no change")
	e.setObjective("fresh", "Tidy")
	changed, _, err := versions(ctx, ws)
	require.NoError(t, err)
	require.NotEqual(t, created, changed, "its first event is")
	require.NoError(t, ws.Delete(ctx))
	deleted, _, err := versions(ctx, ws)
	require.NoError(t, err)
	require.NotEqual(t, changed, deleted, "its deletion is")
}
