package mcp

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// seedTools are the five tools as the proxy injects them: name, description, parameters.
func seedTools(t *testing.T) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, def := range tools.Definitions {
		var d struct {
			Function struct {
				Name        string         `json:"name"`
				Description string         `json:"description"`
				Parameters  map[string]any `json:"parameters"`
			} `json:"function"`
		}
		require.NoError(t, json.Unmarshal(def, &d))
		out[d.Function.Name] = map[string]any{"description": d.Function.Description, "parameters": d.Function.Parameters}
	}
	return out
}

// TestMCPTools: the Go SDK's client, with the admin token, over both protocol versions: the five
// tools with the seeds' descriptions and schemas plus a required thread; each tool called, its
// result the envelope's text; the changes are the agent's, one event each with via "mcp" and the
// call's action_and_reasoning as its reason, outside any turn; the workspace is a resource.
func TestMCPTools(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seeds := seedTools(t)
	for _, protocol := range []string{testkit.MCPLatest, testkit.MCPLegacy} {
		t.Run(protocol, func(t *testing.T) {
			thread := "tools-" + protocol
			cs := testkit.MCPConnect(t, e.srv.URL, adminToken, protocol, nil)
			list, err := cs.ListTools(context.Background(), nil)
			require.NoError(t, err)
			var names []string
			for _, tl := range list.Tools {
				names = append(names, tl.Name)
				seed := seeds[tl.Name]
				require.NotNil(t, seed, tl.Name)
				require.Equal(t, seed["description"], tl.Description)
				var schema map[string]any
				b, _ := json.Marshal(tl.InputSchema)
				require.NoError(t, json.Unmarshal(b, &schema))
				props := schema["properties"].(map[string]any)
				require.Contains(t, props, "thread", tl.Name)
				require.Contains(t, schema["required"], "thread", tl.Name)
				delete(props, "thread")
				delete(props, "as_of") // MCP's own (TestMCPIndicesAsOf)
				schema["required"] = without(schema["required"].([]any), "thread")
				require.Equal(t, seed["parameters"], schema, tl.Name)
			}
			sort.Strings(names)
			want := append([]string(nil), tools.Names...)
			sort.Strings(want)
			require.Equal(t, want, names)

			steps := []struct {
				tool string
				args map[string]any
				want string
			}{
				{"set_objective", map[string]any{"text": "Plan a trip to Lisbon", "action_and_reasoning": "the user named the goal"}, "objective set: Plan a trip to Lisbon"},
				{"add_preferences", map[string]any{"items": []any{map[string]any{"title": "By train", "kind": "hard"}, map[string]any{"title": "Small hotels"}},
					"action_and_reasoning": "the user stated two"}, "recorded 2 preferences"},
				{"list_preferences", map[string]any{"action_and_reasoning": "to see them"},
					"#1 [hard] By train (unconfirmed)\n#2 [soft] Small hotels (unconfirmed)\nas of change 3"}, // MCP's writes, applied (docs/spec.md §19)
				{"update_preferences", map[string]any{"updates": []any{map[string]any{"index": 2, "subtitle": "Family-run"}}, "action_and_reasoning": "the user said more"},
					`updated #2 "Small hotels"`},
				{"remove_preferences", map[string]any{"indices": []any{1}, "action_and_reasoning": "the user dropped it"}, `removed #1 "By train"`},
			}
			for _, s := range steps {
				s.args["thread"] = thread
				text, isError := testkit.MCPCall(t, cs, s.tool, s.args)
				require.False(t, isError, "%s: %s", s.tool, text)
				require.Equal(t, s.want, text, s.tool)
			}
			text, isError := testkit.MCPCall(t, cs, "add_preferences", map[string]any{"thread": thread, "items": []any{}})
			require.True(t, isError)
			require.Equal(t, "items: must hold at least one preference", text, "the envelope's error")
			text, isError = testkit.MCPCall(t, cs, "list_preferences", map[string]any{})
			require.True(t, isError)
			require.Contains(t, text, "thread")

			d := e.workspace(thread)
			require.Equal(t, "Plan a trip to Lisbon", d.Objective.Text)
			require.Equal(t, workspace.ByAgent, d.Objective.UpdatedBy)
			require.Len(t, d.Preferences, 1)
			require.Equal(t, "Family-run", d.Preferences[0].Subtitle)

			events := e.events(thread)
			var kinds []string
			for _, ev := range events {
				kinds = append(kinds, ev.Kind)
				require.Equal(t, "agent", ev.Actor)
				require.Equal(t, "mcp", ev.Via)
				require.Nil(t, ev.Turn, "outside any turn")
				require.Nil(t, ev.Round)
				require.NotNil(t, ev.ToolCallID)
				require.NotNil(t, ev.Reason)
			}
			require.Equal(t, []string{"objective_set", "preference_added", "preference_added", "preference_updated", "preference_removed"}, kinds)
			require.Equal(t, "the user stated two", *events[1].Reason)

			calls, err := e.ws(thread).ToolCalls(context.Background(), 0, 500)
			require.NoError(t, err)
			require.Len(t, calls, 6, "five calls and the refused one")
			require.Nil(t, calls[0].Turn)
			require.Nil(t, calls[0].Round)

			uri := "workspace://" + thread
			res, err := cs.ListResources(context.Background(), nil)
			require.NoError(t, err)
			var uris []string
			for _, r := range res.Resources {
				uris = append(uris, r.URI)
				if r.URI == uri {
					require.Equal(t, "text/plain", r.MIMEType)
				}
			}
			require.Contains(t, uris, uri)
			read, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
			require.NoError(t, err)
			require.Len(t, read.Contents, 1)
			require.Equal(t, tools.AsOfChange(d.Block, d.LastEventID), read.Contents[0].Text)
			require.Equal(t, "text/plain", read.Contents[0].MIMEType)
		})
	}
}

func without(list []any, v any) []any {
	var out []any
	for _, x := range list {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// versionOf is the change number a list_preferences result or the workspace resource ends with.
func versionOf(t *testing.T, text string) int64 {
	t.Helper()
	_, n, ok := strings.Cut(text, "\nas of change ")
	require.True(t, ok, "no version at the end of %q", text)
	v, err := strconv.ParseInt(n, 10, 64)
	require.NoError(t, err, text)
	return v
}

// untilAsOf is a list_preferences result or the workspace resource without its version.
func untilAsOf(t *testing.T, text string) string {
	t.Helper()
	versionOf(t, text)
	list, _, _ := strings.Cut(text, "\nas of change ")
	return list
}

// TestMCPIndicesAsOf: over MCP, list_preferences and the workspace resource end with the list's
// version (as of change N, N the thread's latest event); update_preferences and
// remove_preferences with as_of N name the list as it stood after event N: a target the user
// removed or rewrote since is reported, never replaced by another. Without as_of, the list as it
// stands. as_of is in MCP's schemas only: the turn's tool definitions have none.
func TestMCPIndicesAsOf(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const thread = "asof"
	cs := testkit.MCPConnect(t, e.srv.URL, adminToken, testkit.MCPLatest, nil)
	text, isError := testkit.MCPCall(t, cs, "add_preferences", map[string]any{"thread": thread,
		"items": []any{map[string]any{"title": "A"}, map[string]any{"title": "B"}, map[string]any{"title": "C"}, map[string]any{"title": "D"}}})
	require.False(t, isError, text)

	listed, isError := testkit.MCPCall(t, cs, "list_preferences", map[string]any{"thread": thread})
	require.False(t, isError, listed)
	n := versionOf(t, listed)
	events, err := e.ws(thread).Events(context.Background(), workspace.EventQuery{Descending: true, Limit: 1})
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, events[0].ID, n, "N is the thread's latest event")
	require.Equal(t, "#1 [soft] A (unconfirmed)\n#2 [soft] B (unconfirmed)\n#3 [soft] C (unconfirmed)\n#4 [soft] D (unconfirmed)\nas of change "+
		strconv.FormatInt(n, 10), listed, "MCP's writes, applied, are unconfirmed (docs/spec.md §19)")
	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "workspace://" + thread})
	require.NoError(t, err)
	require.Equal(t, e.workspace(thread).Block+"\nas of change "+strconv.FormatInt(n, 10), res.Contents[0].Text)

	// Meanwhile the user removes A and rewrites C in the panel.
	prefs := e.workspace(thread).Preferences
	require.NoError(t, e.ws(thread).DeletePreference(context.Background(), prefs[0].ID))
	rewritten := "C, the user's"
	_, err = e.ws(thread).UpdatePreference(context.Background(), prefs[2].ID, workspace.PreferencePatch{Title: &rewritten})
	require.NoError(t, err)

	text, isError = testkit.MCPCall(t, cs, "update_preferences", map[string]any{"thread": thread, "as_of": n,
		"updates": []any{map[string]any{"index": 2, "title": "B2"}, map[string]any{"index": 3, "title": "C2"}}})
	require.False(t, isError, text)
	require.Equal(t, `updated #2 "B2"; changed since it was shown; call list_preferences: #3 "C"`, text)
	text, isError = testkit.MCPCall(t, cs, "remove_preferences", map[string]any{"thread": thread, "as_of": n, "indices": []any{1, 4}})
	require.False(t, isError, text)
	require.Equal(t, `removed #4 "D"; changed since it was shown; call list_preferences: #1 "A"`, text)
	require.Equal(t, []string{"B2", "C, the user's"}, e.titles(thread))

	// Without as_of: the list as it stands.
	text, isError = testkit.MCPCall(t, cs, "remove_preferences", map[string]any{"thread": thread, "indices": []any{1}})
	require.False(t, isError, text)
	require.Equal(t, `removed #1 "B2"`, text)
	// A change not made yet is no list's version.
	text, isError = testkit.MCPCall(t, cs, "remove_preferences", map[string]any{"thread": thread, "as_of": n + 100, "indices": []any{1}})
	require.True(t, isError, text)
	require.Contains(t, text, "as_of")
	require.Equal(t, []string{"C, the user's"}, e.titles(thread))

	// as_of is MCP's: the turn's tool definitions do not have it.
	list, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	for _, tl := range list.Tools {
		b, _ := json.Marshal(tl.InputSchema)
		require.Equal(t, tl.Name == tools.UpdatePreferences || tl.Name == tools.RemovePreferences, strings.Contains(string(b), `"as_of"`), tl.Name)
	}
	for _, def := range tools.Definitions {
		require.NotContains(t, string(def), "as_of")
	}
}

// TestMCPThreadTokenCallOnADeletedThread: a thread token's call that meets its thread's deletion
// (checked before it, committed while the call waits for the thread's lock) does not create the
// thread again: the call is refused and the thread stays deleted.
func TestMCPThreadTokenCallOnADeletedThread(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const thread = "doomed"
	e.addPreference(thread, "A")
	token, _, _ := mintMCPToken(t, e, thread, 0)
	cs := testkit.MCPConnect(t, e.srv.URL, token, testkit.MCPLatest, nil)

	deleting, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer deleting.Rollback(ctx)
	n, err := db.New().ThreadDelete(ctx, deleting, thread)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	var deleter int
	require.NoError(t, deleting.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&deleter))

	type result struct {
		res *mcp.CallToolResult
		err error
	}
	called := make(chan result, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "add_preferences",
			Arguments: map[string]any{"items": []any{map[string]any{"title": "B"}}}})
		called <- result{res, err}
	}()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", deleter).Scan(&waiting))
		return waiting > 0
	}, time.Minute, 10*time.Millisecond, "the call waits for the thread's deletion")
	require.NoError(t, deleting.Commit(ctx))
	r := <-called
	require.NoError(t, r.err)
	require.True(t, r.res.IsError, "the call on a deleted thread is refused")
	require.Equal(t, []mcp.Content{&mcp.TextContent{Text: "this thread's workspace was deleted; nothing was recorded"}}, r.res.Content)
	_, err = e.ws(thread).Get(ctx)
	require.ErrorIs(t, err, workspace.ErrNotFound, "the thread stays deleted")
}
