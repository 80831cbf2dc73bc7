package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/auth"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestMCPScopes: who sees what (docs/spec.md §15). The admin token sees every thread; a client key
// its client's threads, named as its turns name them; a thread token its one thread, with no
// thread argument. Another's thread is "unknown thread" and no resource. A wrong, expired or
// revoked token — or none — is a 401 with WWW-Authenticate: Bearer before any MCP message.
func TestMCPScopes(t *testing.T) {
	t.Parallel()
	// Every refusal below comes from an address of its own (through a trusted proxy): failures
	// from one address are throttled.
	trusted, err := auth.ParseTrustedProxies("127.0.0.1")
	require.NoError(t, err)
	e := setup(t, withClientKeys(t, "alice=key-alice,bob=key-bob"), func(o *Options) { o.Guard.Peers = trusted })
	e.addPreference("bob~t1", "Bob's secret")
	e.setObjective("lonely", "No client's")

	t.Run("ClientKey", func(t *testing.T) {
		alice := testkit.MCPConnect(t, e.srv.URL, "key-alice", testkit.MCPLatest, nil)
		text, isError := testkit.MCPCall(t, alice, "add_preferences", map[string]any{"thread": "t1", "items": []any{map[string]any{"title": "Alice's"}}, "action_and_reasoning": "stated"})
		require.False(t, isError, text)
		require.Equal(t, "Alice's", e.workspace("alice~t1").Preferences[0].Title, "in alice's namespace")
		require.Equal(t, "Bob's secret", e.workspace("bob~t1").Preferences[0].Title)
		for _, thread := range []string{"bob~t1", "lonely"} {
			if thread == "lonely" {
				// "lonely" names alice~lonely for alice: a thread of hers, new; it is not the
				// admin's "lonely".
				text, isError = testkit.MCPCall(t, alice, "list_preferences", map[string]any{"thread": thread})
				require.False(t, isError)
				require.Equal(t, "no preferences recorded yet", untilAsOf(t, text))
				continue
			}
			text, isError = testkit.MCPCall(t, alice, "list_preferences", map[string]any{"thread": thread})
			require.True(t, isError)
			require.Equal(t, `unknown thread "bob~t1"`, text)
		}
		res, err := alice.ListResources(context.Background(), nil)
		require.NoError(t, err)
		var uris []string
		for _, r := range res.Resources {
			uris = append(uris, r.URI)
		}
		sort.Strings(uris)
		require.Equal(t, []string{"workspace://lonely", "workspace://t1"}, uris)
		_, err = alice.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://bob~t1"})
		require.Error(t, err)
		require.Contains(t, err.Error(), "not found")
		read, err := alice.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://t1"})
		require.NoError(t, err)
		require.Contains(t, read.Contents[0].Text, "Alice's")
	})

	t.Run("Admin", func(t *testing.T) {
		admin := testkit.MCPConnect(t, e.srv.URL, adminToken, testkit.MCPLatest, nil)
		text, isError := testkit.MCPCall(t, admin, "list_preferences", map[string]any{"thread": "bob~t1"})
		require.False(t, isError)
		require.Equal(t, "#1 [soft] Bob's secret", untilAsOf(t, text))
		read, err := admin.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://lonely"})
		require.NoError(t, err)
		require.Contains(t, read.Contents[0].Text, "Objective: No client's")
		// A thread id's ':' and '@' are escaped in its URI, as the template's expansion escapes them.
		text, isError = testkit.MCPCall(t, admin, "set_objective", map[string]any{"thread": "team:lisbon@2026", "text": "Meet in Lisbon"})
		require.False(t, isError, text)
		res, err := admin.ListResources(context.Background(), nil)
		require.NoError(t, err)
		require.Equal(t, "workspace://team%3Alisbon%402026", res.Resources[0].URI)
		require.Equal(t, "team:lisbon@2026", res.Resources[0].Name)
		read, err = admin.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: res.Resources[0].URI})
		require.NoError(t, err)
		require.Contains(t, read.Contents[0].Text, "Objective: Meet in Lisbon")
	})

	t.Run("ThreadToken", func(t *testing.T) {
		token, _, _ := mintMCPToken(t, e, "bob~t1", 0)
		bob := testkit.MCPConnect(t, e.srv.URL, token, testkit.MCPLegacy, nil)
		list, err := bob.ListTools(context.Background(), nil)
		require.NoError(t, err)
		for _, tl := range list.Tools {
			b, _ := json.Marshal(tl.InputSchema)
			require.NotContains(t, string(b), `"thread"`, "bound to its thread: %s", tl.Name)
		}
		text, isError := testkit.MCPCall(t, bob, "add_preferences", map[string]any{"items": []any{map[string]any{"title": "Via a token"}}, "action_and_reasoning": "stated"})
		require.False(t, isError, text)
		require.Len(t, e.workspace("bob~t1").Preferences, 2)
		text, isError = testkit.MCPCall(t, bob, "list_preferences", map[string]any{"thread": "alice~t1"})
		require.True(t, isError)
		require.Equal(t, `unknown thread "alice~t1"`, text)
		res, err := bob.ListResources(context.Background(), nil)
		require.NoError(t, err)
		require.Len(t, res.Resources, 1)
		require.Equal(t, "workspace://bob~t1", res.Resources[0].URI)
		_, err = bob.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://alice~t1"})
		require.Error(t, err)
	})

	var addresses atomic.Int64
	refused := func(t *testing.T, auth string) {
		t.Helper()
		resp := testkit.MCPPost(t, e.srv.URL, auth, fmt.Sprintf("192.0.2.%d", addresses.Add(1)))
		body := testkit.ReadBody(t, resp)
		require.Equal(t, 401, resp.StatusCode, body)
		require.True(t, strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer"), resp.Header.Get("WWW-Authenticate"))
		require.NotContains(t, body, "jsonrpc", "no MCP message was read")
	}
	t.Run("Refused", func(t *testing.T) {
		resp := testkit.MCPPost(t, e.srv.URL, "Bearer "+adminToken, "")
		require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
		refused(t, "")
		refused(t, "Bearer wrong")
		refused(t, "Basic "+adminToken)
		_, err := testkit.MCPDial(e.srv.URL, "wrong", testkit.MCPLatest, nil)
		require.Error(t, err)

		token, id, _ := mintMCPToken(t, e, "bob~t1", 0)
		resp = testkit.MCPPost(t, e.srv.URL, "Bearer "+token, "")
		require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
		bob := e.ws("bob~t1")
		links, err := bob.Links(context.Background(), 0, 100)
		require.NoError(t, err)
		require.NotEmpty(t, links)
		require.NotContains(t, fmt.Sprint(links), token, "a listing never shows a token")
		require.NoError(t, bob.RevokeLink(context.Background(), id))
		refused(t, "Bearer "+token)
		require.ErrorIs(t, bob.RevokeLink(context.Background(), id), workspace.ErrNotFound)

		short, _, expires := mintMCPToken(t, e, "bob~t1", 1)
		for !time.Now().After(expires) {
			time.Sleep(100 * time.Millisecond)
		}
		refused(t, "Bearer "+short)

		// A deleted thread's tokens go with it.
		e.setObjective("doomed", "Soon gone")
		doomed, _, _ := mintMCPToken(t, e, "doomed", 0)
		require.NoError(t, e.ws("doomed").Delete(context.Background()))
		e.setObjective("doomed", "Another life")
		refused(t, "Bearer "+doomed)
		// A client key is not a thread token's signature; a panel link's token is not a thread token.
		link, _, _ := mintToken(t, e, "bob~t1", auth.KindPanelLink, 0)
		refused(t, "Bearer "+link)
	})
}

// TestMCPListenEndsWithItsToken: a thread token's subscriptions/listen stream ends once its
// token no longer holds (revoked here): at the thread's next change (or heartbeat) it closes,
// rather than announcing the thread's changes to a holder who may no longer see them.
func TestMCPListenEndsWithItsToken(t *testing.T) {
	t.Parallel()
	watching := make(chan string, 10)
	e := setup(t, func(o *Options) {
		o.Watching = func(uri string) {
			select {
			case watching <- uri:
			default:
			}
		}
	})
	e.setObjective("tok", "Before")
	token, id, _ := mintMCPToken(t, e, "tok", 0)
	lines := testkit.MCPListen(t, e.srv.URL, token, "tok")
	// Once the stream holds the subscription (MCPListen) and its watch has read where the thread
	// stands (Watching), the thread's next change is announced on it.
	select {
	case uri := <-watching:
		require.Equal(t, "workspace://tok", uri)
	case <-time.After(time.Minute): // at once; a minute on a busy machine
		t.Fatal("the subscription is not watched")
	}
	e.setObjective("tok", "Changed")
	require.True(t, testkit.Announced(lines, time.Minute), "the change was not announced")

	require.NoError(t, e.ws("tok").RevokeLink(context.Background(), id))
	e.setObjective("tok", "After the revocation")
	timeout := time.After(time.Minute) // the revocation's notification, or the next heartbeat
	for {
		select {
		case _, ok := <-lines:
			if !ok {
				return // the stream ended
			}
		case <-timeout:
			t.Fatal("the stream outlived its token")
		}
	}
}
