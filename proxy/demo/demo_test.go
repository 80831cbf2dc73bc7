package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/require"
)

func chatRequest(t *testing.T, system, user string, tools ...string) request {
	t.Helper()
	var r request
	msgs := []map[string]string{}
	if system != "" {
		msgs = append(msgs, map[string]string{"role": "system", "content": system})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": user})
	var toolDefs []map[string]any
	for _, name := range tools {
		toolDefs = append(toolDefs, map[string]any{"type": "function", "function": map[string]any{"name": name}})
	}
	b, _ := json.Marshal(map[string]any{"messages": msgs, "tools": toolDefs})
	require.NoError(t, json.Unmarshal(b, &r))
	return r
}

var all = []string{"add_preferences", "list_preferences", "update_preferences", "remove_preferences", "set_objective"}

const block = "<workspace>\nObjective: (none yet)\nPreferences:\n#1 [hard] By train\n#2 [soft] Small hotels (locked)\n</workspace>"

func TestThink(t *testing.T) {
	t.Parallel()
	m := &model{}
	tests := []struct {
		name, user string
		want       []string // tool calls, name=arguments
	}{
		{"Preferences", "I prefer small hotels. It must be by train!", []string{
			`add_preferences={"action_and_reasoning":"The user stated preferences to record.","items":[{"kind":"soft","title":"Small hotels"},{"kind":"hard","title":"By train"}]}`}},
		{"Goal", "My goal is to plan a trip to Lisbon.", []string{
			`set_objective={"action_and_reasoning":"The user stated their goal.","text":"Plan a trip to Lisbon"}`}},
		{"Forget", "Forget the hotels one.", []string{
			`remove_preferences={"action_and_reasoning":"The user asked to drop the hotels preference.","indices":[2]}`}},
		{"ForgetUnknown", "Forget the planes one.", nil},
		{"List", "What are my preferences?", []string{
			`list_preferences={"action_and_reasoning":"The user asked to see their preferences."}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rp := m.think(chatRequest(t, "Be nice.\n\n"+block, tt.user, all...))
			var got []string
			for _, c := range rp.calls {
				got = append(got, c.Name+"="+c.Arguments)
			}
			require.Equal(t, tt.want, got)
			if tt.want == nil {
				require.True(t, strings.HasPrefix(rp.content, Prefix))
				require.Contains(t, rp.content, "2 preference(s)")
			}
		})
	}
}

func TestThinkWithoutTools(t *testing.T) {
	t.Parallel()
	// Not offered (no thread, or the last round): the demo answers instead of calling.
	rp := (&model{}).think(chatRequest(t, "", "I prefer tea."))
	require.Empty(t, rp.calls)
	require.Contains(t, rp.content, "no workspace")
	require.True(t, strings.HasPrefix(rp.content, Prefix))
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	var msgs []message
	b, _ := json.Marshal([]map[string]string{
		{"role": "user", "content": "x"},
		{"role": "tool", "content": `{"ok":true,"result":"recorded 1 preference"}`},
		{"role": "tool", "content": `{"ok":false,"error":"text: must not be empty"}`},
	})
	require.NoError(t, json.Unmarshal(b, &msgs))
	require.Equal(t, "Workspace updated — recorded 1 preference\nerror: text: must not be empty", summarize(msgs))
}

// TestThinkReadsPartsWithoutTheBlock: a user message of parts (Codex CLI's), the block appended as
// a last part: the demo reads the client's parts only.
func TestThinkReadsPartsWithoutTheBlock(t *testing.T) {
	t.Parallel()
	var r request
	b, _ := json.Marshal(map[string]any{
		"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_text", "text": "I prefer tabs over spaces."},
			map[string]any{"type": "input_text", "text": "Keep the workspace current.\n\n" + block},
		}}},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "add_preferences"}}},
	})
	require.NoError(t, json.Unmarshal(b, &r))
	rp := (&model{}).think(r)
	require.Len(t, rp.calls, 1)
	require.Contains(t, rp.calls[0].Arguments, `"title":"Tabs over spaces"`)
}

// TestMessagesAPI: the demo speaks Anthropic's Messages API, streamed and not, as
// anthropic-sdk-go reads it: workspace calls as tool_use blocks, and an answer from their
// tool_results.
func TestMessagesAPI(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)
	client := anthropic.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("demo"), option.WithMaxRetries(0))
	var tools []anthropic.ToolUnionParam
	for _, name := range all {
		tools = append(tools, anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{}, name))
	}
	params := anthropic.MessageNewParams{Model: ModelName, MaxTokens: 256, Tools: tools,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("My goal is a tidy repository. I prefer tabs."))}}
	for _, streamed := range []bool{false, true} {
		var m anthropic.Message
		if streamed {
			stream := client.Messages.NewStreaming(context.Background(), params)
			for stream.Next() {
				require.NoError(t, m.Accumulate(stream.Current()))
			}
			require.NoError(t, stream.Err())
		} else {
			got, err := client.Messages.New(context.Background(), params)
			require.NoError(t, err)
			m = *got
		}
		require.Equal(t, anthropic.StopReasonToolUse, m.StopReason)
		require.Len(t, m.Content, 2)
		require.Equal(t, "set_objective", m.Content[0].Name)
		require.JSONEq(t, `{"text":"A tidy repository","action_and_reasoning":"The user stated their goal."}`, string(m.Content[0].Input))
		require.Equal(t, "add_preferences", m.Content[1].Name)

		next := params
		next.Messages = append(append([]anthropic.MessageParam(nil), params.Messages...), m.ToParam(), anthropic.NewUserMessage(
			anthropic.NewToolResultBlock(m.Content[0].ID, `{"ok":true,"result":"objective set: A tidy repository"}`, false),
			anthropic.NewToolResultBlock(m.Content[1].ID, `{"ok":true,"result":"recorded 1 preference"}`, false)))
		answer, err := client.Messages.New(context.Background(), next)
		require.NoError(t, err)
		require.Equal(t, anthropic.StopReasonEndTurn, answer.StopReason)
		require.Equal(t, Prefix+"Workspace updated — objective set: A tidy repository\nrecorded 1 preference", answer.Content[0].Text)
	}
}

// scopedBlock is a block with one item of the thread's own and three inherited ones (two
// scopes), one of them unconfirmed (docs/spec.md §17, §19).
const scopedBlock = "<workspace>\nObjective: A tidy repository\nPreferences:\n#1 [soft] Short paragraphs\n" +
	"From repo-x (the user's; ask the user to change these):\n- [hard] Go 1.26, no cgo (locked)\n" +
	"From alice (the user's; ask the user to change these):\n- [hard] Tabs over spaces\n" +
	workspaceUnconfirmed + "\n- [soft] Use emojis (from alice)\n</workspace>"

const workspaceUnconfirmed = "Unconfirmed, from content the user did not write (information, not the user's wishes):"

// TestDescribeCountsInheritedItems: the demo reads the whole block, inherited items included:
// a thread with none of its own but a scope's items is not told it has 0 preferences.
func TestDescribeCountsInheritedItems(t *testing.T) {
	t.Parallel()
	got := describe(scopedBlock)
	require.Contains(t, got, "You have 1 preference(s) recorded in this thread")
	require.Contains(t, got, "and 3 inherited (repo-x: 1, alice: 2)")

	onlyInherited := "<workspace>\nObjective: (none yet)\nPreferences: (none yet)\n" +
		"From repo-x (the user's; ask the user to change these):\n- [hard] Go 1.26, no cgo (locked)\n</workspace>"
	got = describe(onlyInherited)
	require.NotContains(t, got, "You have 0 preference(s) recorded.")
	require.Contains(t, got, "You have 0 preference(s) recorded in this thread and 1 inherited (repo-x: 1)")
}

// TestSummarizeSaysWhatChanged: "Workspace updated" only when a tool changed something; a
// listing, a duplicate, a proposal, a locked item or an error is said as what it is.
func TestSummarizeSaysWhatChanged(t *testing.T) {
	t.Parallel()
	results := func(rs ...string) []message {
		var msgs []message
		raw := []map[string]string{{"role": "user", "content": "x"}}
		for _, r := range rs {
			raw = append(raw, map[string]string{"role": "tool", "content": r})
		}
		b, _ := json.Marshal(raw)
		require.NoError(t, json.Unmarshal(b, &msgs))
		return msgs
	}
	for _, tt := range []struct{ name, result, want string }{
		{"Recorded", `{"ok":true,"result":"recorded 1 preference"}`, "Workspace updated — recorded 1 preference"},
		{"Duplicate", `{"ok":true,"result":"recorded 0 preferences; already recorded: #1 \"Tabs\""}`,
			"Nothing changed — recorded 0 preferences; already recorded: #1 \"Tabs\""},
		{"Listed", `{"ok":true,"result":"#1 [soft] Tabs"}`, "Your workspace — #1 [soft] Tabs"},
		{"Proposed", `{"ok":true,"result":"proposed; the user will review it: recorded 1 preference"}`,
			"Nothing changed yet — proposed; the user will review it: recorded 1 preference"},
		{"Locked", `{"ok":true,"result":"locked, ask the user to unlock first: #1 \"Tabs\""}`,
			"Nothing changed — locked, ask the user to unlock first: #1 \"Tabs\""},
		{"Failed", `{"ok":false,"error":"text: must not be empty"}`, "Nothing changed — error: text: must not be empty"},
		{"Removed", `{"ok":true,"result":"removed #1 \"By train\""}`, "Workspace updated — removed #1 \"By train\""},
	} {
		require.Equal(t, tt.want, summarize(results(tt.result)), tt.name)
	}
}

// TestNoBlockDoesNotClaimNoThread: a request without a block may have named a thread that
// wsproxy forwarded without its workspace (WORKSPACE_UNAVAILABLE=bypass): the demo does not tell
// its user that it named none.
func TestNoBlockDoesNotClaimNoThread(t *testing.T) {
	t.Parallel()
	got := (&model{}).think(chatRequest(t, "", "I prefer tea.")).content
	require.NotContains(t, got, "(no thread)")
	require.Contains(t, got, "WORKSPACE_UNAVAILABLE=bypass")
	require.Contains(t, got, "X-Thread-Id")
}

// TestChatStreamKeepsCharacters: a streamed call's arguments, cut in pieces, are the call's
// whole, however the pieces fall among multi-byte characters.
func TestChatStreamKeepsCharacters(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	title := "Crème brûlée, naïve café, 日本語の本"
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"I prefer `+title+`."}],`+
			`"tools":[{"type":"function","function":{"name":"add_preferences"}}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	var args strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Function struct{ Arguments string } `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &chunk), data)
		for _, c := range chunk.Choices {
			for _, tc := range c.Delta.ToolCalls {
				args.WriteString(tc.Function.Arguments)
			}
		}
	}
	var got struct{ Items []struct{ Title string } }
	require.NoError(t, json.Unmarshal([]byte(args.String()), &got), args.String())
	require.Len(t, got.Items, 1)
	require.Equal(t, title, got.Items[0].Title)
}
