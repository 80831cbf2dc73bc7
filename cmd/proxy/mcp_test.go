package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// mcpToken mints a thread token of thread (stored form) through the admin REST.
func mcpToken(t *testing.T, m *Main, thread string) string {
	t.Helper()
	var link struct{ Token, URL string }
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/"+thread+"/links", `{"kind":"mcp"}`, &link))
	require.Equal(t, m.URL+"/mcp", link.URL)
	return link.Token
}

// mcpEvents are the via of each of the thread's events.
func mcpEvents(t *testing.T, m *Main, thread string) []string {
	t.Helper()
	var events struct {
		Data []struct{ Actor, Via, Kind string }
	}
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+thread+"/events", "", &events))
	var out []string
	for _, e := range events.Data {
		out = append(out, e.Actor+" "+e.Via+" "+e.Kind)
	}
	return out
}

// tsClient is a script of the official TypeScript SDK's client (@modelcontextprotocol/sdk,
// pinned in scripts/npm): with the token in argv[3], it lists the tools, calls add_preferences
// (on the thread in argv[4], "" for a thread token) and list_preferences, lists the resources and
// reads the first; it prints what it got as JSON. A refusal prints {"error": …}.
const tsClient = `
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, thread] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: "Bearer " + token } },
});
const client = new Client({ name: "wsproxy-e2e", version: "1.0.0" });
try {
  await client.connect(transport);
  const out = { protocol: transport.protocolVersion, server: client.getServerVersion() };
  out.tools = (await client.listTools()).tools.map((t) => ({ name: t.name, required: t.inputSchema.required }));
  const where = thread ? { thread } : {};
  const add = await client.callTool({ name: "add_preferences", arguments: { ...where,
    items: [{ title: "Aisle seat", kind: "hard" }], action_and_reasoning: "The user asked for an aisle seat." } });
  out.add = { text: add.content[0].text, isError: !!add.isError };
  const empty = await client.callTool({ name: "add_preferences", arguments: { ...where, items: [] } });
  out.empty = { text: empty.content[0].text, isError: !!empty.isError };
  const list = await client.callTool({ name: "list_preferences", arguments: where });
  out.list = list.content[0].text;
  const resources = (await client.listResources()).resources;
  out.resources = resources.map((r) => r.uri);
  const read = await client.readResource({ uri: resources[0].uri });
  out.read = { mimeType: read.contents[0].mimeType, text: read.contents[0].text };
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ error: String(e) }));
} finally {
  await client.close();
}
`

// runTSClient runs tsClient against m's /mcp with token, on thread.
func runTSClient(t *testing.T, m *Main, token, thread string) map[string]any {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Symlink(nodeModules(t), filepath.Join(dir, "node_modules")))
	script := filepath.Join(dir, "client.mjs")
	require.NoError(t, os.WriteFile(script, []byte(tsClient), 0o644))
	out, err := exec.Command("node", script, m.URL+"/mcp", token, thread).CombinedOutput()
	require.NoError(t, err, string(out))
	var got map[string]any
	require.NoError(t, json.Unmarshal(out, &got), string(out))
	return got
}

// TestMCPTypeScriptSDK: the official TypeScript SDK's client against the whole program: with the
// admin token naming a thread, and with a thread token naming none, it lists the tools, calls
// them (an error envelope is a tool error), lists and reads the workspace resources; the changes
// are the agent's, via MCP. A wrong token is refused.
func TestMCPTypeScriptSDK(t *testing.T) {
	t.Parallel()
	// Every MCP write is untrusted, a proposal by default (docs/spec.md §19, TestMCPClaudeCode):
	// this test is about the SDK's calls, so they apply.
	m, _ := MustRunMain(t, func(c *Config) { c.UntrustedWrites = "apply" })

	got := runTSClient(t, m, m.AdminToken, "ts-admin")
	require.Nil(t, got["error"])
	require.Equal(t, "2025-11-25", got["protocol"])
	require.Equal(t, "wsproxy", got["server"].(map[string]any)["name"])
	require.Len(t, got["tools"], 5)
	for _, tl := range got["tools"].([]any) {
		require.Contains(t, tl.(map[string]any)["required"], "thread")
	}
	require.Equal(t, map[string]any{"text": "recorded 1 preference", "isError": false}, got["add"])
	require.Equal(t, map[string]any{"text": "items: must hold at least one preference", "isError": true}, got["empty"])
	// Applied from a call no user message vouches for, the item is unconfirmed (docs/spec.md §19).
	require.Equal(t, "#1 [hard] Aisle seat (unconfirmed)\nas of change 1", got["list"], "the list's version: the thread's one event")
	require.Equal(t, []any{"workspace://ts-admin"}, got["resources"])
	require.Equal(t, map[string]any{"mimeType": "text/plain",
		"text": "<workspace>\nObjective: (none yet)\nPreferences: (none confirmed yet)\n" +
			"Unconfirmed, from content the user did not write (information, not the user's wishes):\n#1 [hard] Aisle seat\n</workspace>\nas of change 1"}, got["read"])
	require.Equal(t, []string{"agent mcp preference_added"}, mcpEvents(t, m, "ts-admin"))

	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/ts-token/objective", `{"text":"Fly to Porto"}`, nil))
	got = runTSClient(t, m, mcpToken(t, m, "ts-token"), "")
	require.Nil(t, got["error"])
	for _, tl := range got["tools"].([]any) {
		require.NotContains(t, tl.(map[string]any)["required"], "thread", "a thread token's tools name no thread")
	}
	require.Equal(t, "recorded 1 preference", got["add"].(map[string]any)["text"])
	require.Equal(t, []any{"workspace://ts-token"}, got["resources"])
	require.Contains(t, got["read"].(map[string]any)["text"], "Objective: Fly to Porto")
	require.Equal(t, []string{"user admin objective_set", "agent mcp preference_added"}, mcpEvents(t, m, "ts-token"))

	got = runTSClient(t, m, "wrong", "ts-admin")
	require.Contains(t, got["error"], "invalid_token")
}

// messagesModel is a fake Anthropic Messages upstream that scripts Claude Code's model: asked to
// remember a preference, it loads the MCP tool (Claude Code defers MCP tools behind ToolSearch),
// calls it, and answers with the tool's result. It keeps the body of each request in rounds.
func messagesModel(t *testing.T, rounds *requestLog) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/messages" {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Messages []struct {
				Role    string          `json:"role"`
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(body, &req))
		var results []struct {
			Type      string          `json:"type"`
			ToolUseID string          `json:"tool_use_id"`
			Content   json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(req.Messages[len(req.Messages)-1].Content, &results) // a string content has none
		var last string
		for _, b := range results {
			if b.Type == "tool_result" {
				last = b.ToolUseID
			}
		}
		rounds.add(body)
		switch last {
		case "":
			messagesToolUse(w, "toolu_search", "ToolSearch", `{"query":"select:mcp__wsproxy__add_preferences","max_results":1}`)
		case "toolu_search":
			messagesToolUse(w, "toolu_add", "mcp__wsproxy__add_preferences",
				`{"items":[{"title":"Window seat","kind":"soft"}],"action_and_reasoning":"The user said they prefer a window seat."}`)
		default:
			messagesText(w, "Noted: you prefer a window seat.")
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// requestLog keeps the bodies of a fake upstream's requests.
type requestLog struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (l *requestLog) add(b []byte) { l.mu.Lock(); l.bodies = append(l.bodies, b); l.mu.Unlock() }

func (l *requestLog) all() [][]byte { l.mu.Lock(); defer l.mu.Unlock(); return l.bodies }

// messagesStream writes a Messages stream of one content block and its deltas.
func messagesStream(w http.ResponseWriter, block string, delta string, stop string) {
	w.Header().Set("Content-Type", "text/event-stream")
	event := func(typ, data string) { fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data) }
	event("message_start", `{"type":"message_start","message":{"id":"msg_e2e","type":"message","role":"assistant","model":"claude-e2e",`+
		`"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}`)
	event("content_block_start", `{"type":"content_block_start","index":0,"content_block":`+block+`}`)
	event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":`+delta+`}`)
	event("content_block_stop", `{"type":"content_block_stop","index":0}`)
	event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"`+stop+`","stop_sequence":null},"usage":{"output_tokens":9}}`)
	event("message_stop", `{"type":"message_stop"}`)
}

func messagesToolUse(w http.ResponseWriter, id, name, input string) {
	partial, _ := json.Marshal(input)
	messagesStream(w, `{"type":"tool_use","id":"`+id+`","name":"`+name+`","input":{}}`,
		`{"type":"input_json_delta","partial_json":`+string(partial)+`}`, "tool_use")
}

func messagesText(w http.ResponseWriter, text string) {
	quoted, _ := json.Marshal(text)
	messagesStream(w, `{"type":"text","text":""}`, `{"type":"text_delta","text":`+string(quoted)+`}`, "end_turn")
}

// TestMCPClaudeCode: Claude Code (pinned in scripts/npm) adds wsproxy as an HTTP MCP server
// with a thread token (claude mcp add --transport http … --header "Authorization: Bearer …"),
// and its model, scripted by a fake Messages upstream, calls add_preferences: an MCP write is
// untrusted (docs/spec.md §19), so it waits for the user as a proposal, which the admin REST
// shows as the agent's event via "mcp" and applies; the model got the tool's result and
// wsproxy's description of it.
func TestMCPClaudeCode(t *testing.T) {
	t.Parallel()
	m, _ := MustRunMain(t, nil)
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/claude-code/objective", `{"text":"Book a train to Porto"}`, nil))
	token := mcpToken(t, m, "claude-code")
	var rounds requestLog
	up := messagesModel(t, &rounds)

	home, work := t.TempDir(), t.TempDir()
	claude := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(npmBin(t, "claude"), args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "HOME="+home, "DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
			"ANTHROPIC_BASE_URL="+up.URL, "ANTHROPIC_API_KEY=sk-ant-e2e")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "claude %v: %s", args, out)
		return string(out)
	}
	claude("mcp", "add", "--transport", "http", "wsproxy", m.URL+"/mcp", "--header", "Authorization: Bearer "+token)
	require.Contains(t, claude("mcp", "list"), "Connected")
	out := claude("-p", "Remember that I prefer a window seat.", "--allowedTools", "ToolSearch", "mcp__wsproxy__add_preferences")
	require.Contains(t, out, "Noted: you prefer a window seat.")

	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/claude-code", "", &ws))
	require.Empty(t, ws.Preferences, "an MCP write waits for the user")
	require.Equal(t, []string{"user admin objective_set", "agent mcp proposed"}, mcpEvents(t, m, "claude-code"))
	var proposals struct{ Data []struct{ ID int64 } }
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/claude-code/proposals", "", &proposals))
	require.Len(t, proposals.Data, 1)
	require.Equal(t, 200, adminCall(t, m, "POST", fmt.Sprintf("/admin/v1/threads/claude-code/events/%d/apply", proposals.Data[0].ID), "", nil))
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/claude-code", "", &ws))
	require.Len(t, ws.Preferences, 1)
	require.Equal(t, "Window seat", ws.Preferences[0].Title)

	// What Claude Code's model saw: the tool with wsproxy's description (once loaded), and its result.
	var sawTool, sawResult bool
	for _, body := range rounds.all() {
		sawTool = sawTool || strings.Contains(string(body), `"name":"mcp__wsproxy__add_preferences","description":"Record one or more decoded user preferences`)
		sawResult = sawResult || strings.Contains(string(body), "proposed; the user will review it (this turn read content the user did not write)")
	}
	require.True(t, sawTool, "the tool's description reached the model")
	require.True(t, sawResult, "the tool's result reached the model")
}

// mcpToolCall calls a tool with one JSON-RPC request (MCP 2025-11-25, no handshake: the server
// keeps no session) and returns the result's text.
func mcpToolCall(t *testing.T, m *Main, token, tool, args string) string {
	t.Helper()
	req, err := http.NewRequest("POST", m.URL+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+tool+`","arguments":`+args+`}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		Result struct {
			Content []struct{ Text string }
			IsError bool
		}
	}
	require.Equal(t, 200, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.False(t, out.Result.IsError, "%+v", out)
	return out.Result.Content[0].Text
}

// TestMCPChangeInThePanel: the panel's timeline tells a change over MCP from a proxied turn's,
// live.
func TestMCPChangeInThePanel(t *testing.T) {
	t.Parallel()
	// An MCP write is a proposal by default (docs/spec.md §19): this test is about the timeline.
	m, _ := MustRunMain(t, func(c *Config) { c.UntrustedWrites = "apply" })
	require.Equal(t, 200, adminCall(t, m, "PUT", "/admin/v1/threads/both/objective", `{"text":"Plan a trip to Lisbon"}`, nil))
	ctx := newBrowser(t)()
	signIn(t, ctx, m.URL, m.AdminToken)
	within(t, ctx,
		click(`document.querySelector('#threads a[href="#/t/both"]')`),
		waitFor(eventItem("objective_set", "")+` !== undefined`))

	threadTurn(t, m, "both", "I prefer small hotels.")
	require.Equal(t, "recorded 1 preference", mcpToolCall(t, m, m.AdminToken, "add_preferences",
		`{"thread":"both","items":[{"title":"Window seat"}],"action_and_reasoning":"Said in another app."}`))
	within(t, ctx,
		waitFor(eventItem("preference_added", "Small hotels")+` !== undefined`),
		waitFor(eventItem("preference_added", "Window seat")+` !== undefined`))
	proxied := eval[string](t, ctx, eventItem("preference_added", "Small hotels")+`.querySelector(".meta").textContent`)
	require.Contains(t, proxied, "the assistant · turn 1")
	viaMCP := eval[string](t, ctx, eventItem("preference_added", "Window seat")+`.querySelector(".meta").textContent`)
	require.Contains(t, viaMCP, "the assistant over MCP")
	require.Equal(t, "mcp", eval[string](t, ctx, eventItem("preference_added", "Window seat")+`.dataset.via`))
	require.Equal(t, "Said in another app.", eval[string](t, ctx, eventItem("preference_added", "Window seat")+`.querySelector(".reason").textContent`))
}
