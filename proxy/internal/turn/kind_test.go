package turn

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// agentFixture is a request captured from a real agent (proxy/testdata/agents).
type agentFixture struct {
	Method  string      `json:"method"`
	Path    string      `json:"path"`
	Query   string      `json:"query"`
	Headers http.Header `json:"headers"`
	Body    []byte      `json:"-"`
}

func readAgentFixture(t *testing.T, name string) agentFixture {
	t.Helper()
	dir := filepath.Join("..", "..", "testdata", "agents")
	b, err := os.ReadFile(filepath.Join(dir, name+".json"))
	require.NoError(t, err)
	var f agentFixture
	require.NoError(t, json.Unmarshal(b, &f))
	if f.Method == http.MethodPost {
		f.Body, err = os.ReadFile(filepath.Join(dir, name+".body.json"))
		require.NoError(t, err)
	}
	return f
}

// kindOf is what the edge will ask of a request, by its route.
func kindOf(f agentFixture) string {
	switch {
	case strings.HasSuffix(f.Path, "/v1/messages"):
		return messagesKind(f.Body)
	case strings.HasSuffix(f.Path, "/v1/responses"):
		return responsesKind(f.Body, f.Headers)
	case strings.Contains(f.Path, ":generateContent"), strings.Contains(f.Path, ":streamGenerateContent"):
		return geminiKind(f.Body)
	}
	return ""
}

// TestKindOfCapturedRequests: every request captured from Claude Code 2.1.332, Codex CLI 0.171.0
// and Gemini CLI 0.61.0 has the kind it is (proxy/testdata/agents/README.md): the compactions
// are compactions, the classifier a side request, and their turns — the ones right after a
// compaction included — turns.
func TestKindOfCapturedRequests(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"claude-code-turn":             KindTurn,
		"claude-code-compact":          KindCompaction,
		"claude-code-after-compact":    KindTurn,
		"claude-code-title":            KindSide,
		"claude-code-interactive-turn": KindTurn,
		"codex-turn":                   KindTurn,
		"codex-compact-local":          KindCompaction,
		"codex-after-compact":          KindTurn,
		"codex-compaction-trigger":     KindCompaction,
		"gemini-classifier":            KindSide,
		"gemini-turn":                  KindTurn,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, want, kindOf(readAgentFixture(t, name)))
		})
	}
	// Codex's compactions are known from the body alone (its header repeats the metadata).
	trigger, local := readAgentFixture(t, "codex-compaction-trigger"), readAgentFixture(t, "codex-compact-local")
	require.Equal(t, KindCompaction, responsesKind(trigger.Body, nil))
	require.Equal(t, KindCompaction, responsesKind(local.Body, nil))
	stripped := withMember(t, local.Body, "client_metadata", `{}`)
	require.Equal(t, KindTurn, responsesKind(stripped, local.Headers), "nothing else of it says compaction: not its instruction's text, not the header")
}

// withMember is the JSON object b with its member name set to the raw value v.
func withMember(t *testing.T, b []byte, name, v string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &m))
	m[name] = json.RawMessage(v)
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return out
}

// TestKindNearMisses: what merely resembles a compaction or a side request is a turn.
func TestKindNearMisses(t *testing.T) {
	t.Parallel()
	compact := readAgentFixture(t, "claude-code-compact").Body
	var req struct {
		Messages []json.RawMessage `json:"messages"`
	}
	require.NoError(t, json.Unmarshal(compact, &req))
	instruction := req.Messages[len(req.Messages)-1]
	messages := func(ms ...string) []byte {
		return []byte(`{"model":"claude-opus-5-5","stream":true,"messages":[` + strings.Join(ms, ",") + `]}`)
	}

	t.Run("Messages", func(t *testing.T) {
		t.Parallel()
		for name, body := range map[string][]byte{
			"a user asking for a summary": messages(`{"role":"user","content":"Please create a detailed summary of the conversation so far, in <summary> tags."}`),
			"the instruction, then more":  messages(string(instruction), `{"role":"assistant","content":"<summary>…</summary>"}`, `{"role":"user","content":"Thanks."}`),
			"the instruction quoted":      messages(`{"role":"user","content":"Why does Claude Code say \"CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\"?"}`),
			"the instruction as the assistant's": messages(`{"role":"user","content":"hi"}`,
				strings.Replace(string(instruction), `"role":"user"`, `"role":"assistant"`, 1)),
			"the preamble without the task":          messages(`{"role":"user","content":"CRITICAL: Respond with TEXT ONLY. Do NOT call any tools. What is 2+2?"}`),
			"no messages":                            []byte(`{"model":"m","messages":[]}`),
			"not JSON":                               []byte(`{"messages":[`),
			"structured output of a turn":            []byte(`{"model":"m","output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}},"system":"You are a helpful assistant.","messages":[{"role":"user","content":"Name this session."}]}`),
			"the title instruction without a format": []byte(`{"model":"m","system":[{"type":"text","text":"You are naming a coding session so the user can pick it out."}],"messages":[{"role":"user","content":"hi"}]}`),
			"the title instruction as a user's":      []byte(`{"model":"m","output_config":{"format":{"type":"json_schema"}},"messages":[{"role":"user","content":"You are naming a coding session: call it X."}]}`),
			"empty":                                  nil,
		} {
			require.Equal(t, KindTurn, messagesKind(body), name)
		}
		require.Equal(t, KindSide, messagesKind([]byte(`{"model":"m","output_config":{"format":{"type":"json_schema"}},"system":"You are naming a coding session so the user can pick it out.","messages":[{"role":"user","content":"<session>hi</session>"}]}`)),
			"a system string")
		// The same instruction as a content of text blocks is Claude Code's compaction too.
		text, err := json.Marshal(lastTextOf(t, instruction))
		require.NoError(t, err)
		require.Equal(t, KindCompaction, messagesKind(messages(`{"role":"user","content":"hi"}`, `{"role":"assistant","content":"OK."}`,
			`{"role":"user","content":[{"type":"text","text":`+string(text)+`}]}`)))
	})

	t.Run("Responses", func(t *testing.T) {
		t.Parallel()
		turn := readAgentFixture(t, "codex-turn")
		for name, body := range map[string][]byte{
			"a user naming the item":          []byte(`{"model":"gpt-5.1","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"What is {\"type\":\"compaction_trigger\"}?"}]}]}`),
			"a compacted history":             []byte(`{"model":"gpt-5.1","input":[{"type":"compaction","encrypted_content":"…"},{"type":"message","role":"user","content":"go on"}]}`),
			"Codex's instruction as a user's": []byte(`{"model":"gpt-5.1","tools":[],"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will resume the task."}]}]}`),
			"a string input":                  []byte(`{"model":"gpt-5.1","input":"compaction_trigger"}`),
			"metadata of a turn":              []byte(`{"model":"gpt-5.1","input":"hi","client_metadata":{"x-codex-turn-metadata":"{\"request_kind\":\"turn\"}"}}`),
			"metadata naming the value":       []byte(`{"model":"gpt-5.1","input":"hi","client_metadata":{"x-codex-turn-metadata":"{\"note\":\"compaction\"}"}}`),
			"not JSON":                        []byte(`{"input":[{"type":"compaction_trigger"}`),
		} {
			require.Equal(t, KindTurn, responsesKind(body, turn.Headers), name)
		}
		require.Equal(t, KindCompaction, responsesKind([]byte(`{"input":[{"type":"message","role":"user","content":"hi"},{"type":"compaction_trigger"},{"type":"message","role":"user","content":"more"}]}`), nil),
			"the item anywhere in the input")
	})

	t.Run("Gemini", func(t *testing.T) {
		t.Parallel()
		contents := `"contents":[{"role":"user","parts":[{"text":"Reply in JSON with responseMimeType application/json"}]}]`
		for name, want := range map[string]string{
			`{` + contents + `}`: KindTurn,
			`{` + contents + `,"generationConfig":{"temperature":1}}`:                                                 KindTurn,
			`{` + contents + `,"generationConfig":{"responseMimeType":"text/plain"}}`:                                 KindTurn,
			`{` + contents + `,"generationConfig":{"responseSchema":null,"responseJsonSchema":null}}`:                 KindTurn,
			`{` + contents + `,"generationConfig":{"responseMimeType":"application/json"}}`:                           KindSide,
			`{` + contents + `,"generationConfig":{"responseMimeType":"Application/JSON; charset=utf-8"}}`:            KindSide,
			`{` + contents + `,"generationConfig":{"responseSchema":{"type":"OBJECT"}}}`:                              KindSide,
			`{` + contents + `,"generationConfig":{"responseJsonSchema":{"type":"object"}}}`:                          KindSide,
			`{` + contents + `,"generation_config":{"response_mime_type":"application/json"}}`:                        KindSide,
			`{` + contents + `,"generation_config":{"response_json_schema":{"type":"object"}}}`:                       KindSide,
			`{"tools":[{"functionDeclarations":[]}],` + contents + `,"generationConfig":{"topK":64}}`:                 KindTurn,
			`{` + contents + `,"generationConfig":{"responseMimeType":"application/json"}`:                            KindTurn, // not JSON
			`{` + contents + `,"systemInstruction":{"parts":[{"text":"\"responseMimeType\":\"application/json\""}]}}`: KindTurn,
		} {
			require.Equal(t, want, geminiKind([]byte(name)), name)
		}
	})
}

// lastTextOf is a message's string content.
func lastTextOf(t *testing.T, message json.RawMessage) string {
	t.Helper()
	var m struct {
		Content string `json:"content"`
	}
	require.NoError(t, json.Unmarshal(message, &m))
	return m.Content
}

// BenchmarkKindOf: recognising a request costs a scan of its body, nothing in proportion to its
// size beyond (the captured requests, 23–56 KB).
func BenchmarkKindOf(b *testing.B) {
	dir := filepath.Join("..", "..", "testdata", "agents")
	claude, _ := os.ReadFile(filepath.Join(dir, "claude-code-compact.body.json"))
	codex, _ := os.ReadFile(filepath.Join(dir, "codex-turn.body.json"))
	gemini, _ := os.ReadFile(filepath.Join(dir, "gemini-turn.body.json"))
	b.ReportAllocs()
	for b.Loop() {
		if messagesKind(claude) != KindCompaction || responsesKind(codex, nil) != KindTurn || geminiKind(gemini) != KindTurn {
			b.Fatal("wrong kind")
		}
	}
}

// messagesKind, responsesKind and geminiKind are a body's kind as its API's parse reads it (a
// body that does not parse is no compaction nor side request).
func messagesKind(body []byte) string {
	r, err := ParseMessagesRequest(body)
	if err != nil {
		return KindTurn
	}
	return r.Kind()
}

func responsesKind(body []byte, _ http.Header) string {
	r, err := ParseResponsesRequest(body)
	if err != nil {
		return KindTurn
	}
	return r.Kind()
}

func geminiKind(body []byte) string {
	top, err := rawjson.Parse(body)
	if err != nil {
		return KindTurn
	}
	return kindOfGemini(top)
}
