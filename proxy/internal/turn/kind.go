package turn

import (
	"bytes"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// The recognisers of a thread's request's kind (dialect.go: KindTurn, KindSide, KindCompaction)
// read the request's top-level members as its parse found them (rawjson: no decode of the body;
// at most the one string that decides is unquoted) and know the agents by what they really send: the requests
// captured in proxy/testdata/agents (its README has the facts; kind_test.go pins each). Anything
// that is not one of them is KindTurn.

// claudeCodeCompaction is how Claude Code's compaction request begins (2.1.332: the last
// message, a user message with a string content) and what it asks for; claudeCodeTitle is how
// the system text of its title request begins.
const (
	claudeCodeCompaction     = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."
	claudeCodeCompactionTask = "Your task is to create a detailed summary of the conversation so far"
	claudeCodeTitle          = "You are naming a coding session"
)

// kindOfMessages is the kind of a Messages API request (POST /v1/messages):
//
//   - KindCompaction for Claude Code's compaction request: its last message a user message whose
//     text begins with Claude Code's compaction instruction and asks for a detailed summary of the
//     conversation so far. The instruction anywhere but in the last message (the turns after a
//     compaction hold its summary, not the instruction), or a user merely asking for a summary, is
//     a turn. (Claude Code 2.1.332 also adds the anthropic-beta fallback-credit-2026-06-01 to that
//     request alone; a beta flag is one version's detail, so the text decides.)
//   - KindSide for Claude Code's title request (an interactive session's first prompt): a system
//     text block that begins "You are naming a coding session", with structured output asked for
//     (output_config.format). Claude Code sent no topic request in any mode captured.
//   - KindTurn for anything else.
func kindOfMessages(top rawjson.Object) string {
	if claudeCodeTitleRequest(top) {
		return KindSide
	}
	last, ok := lastElement(top.Get("messages"))
	if !ok || !hasString(last, "role", "user") {
		return KindTurn
	}
	s, e, ok := rawjson.Member(last, "content")
	if !ok {
		return KindTurn
	}
	text, ok := firstText(last[s:e], claudeCodeCompaction)
	if ok && strings.Contains(text, claudeCodeCompactionTask) {
		return KindCompaction
	}
	return KindTurn
}

// claudeCodeTitleRequest reports whether a Messages request is Claude Code's title request: its
// output_config has a format, and a block of its system begins as Claude Code's title instruction.
func claudeCodeTitleRequest(top rawjson.Object) bool {
	config := top.Get("output_config")
	if config == nil {
		return false
	}
	if format, ok := member(config, "format"); !ok || string(format) == "null" {
		return false
	}
	system := top.Get("system")
	if _, ok := firstText(system, claudeCodeTitle); ok {
		return true
	}
	found := false
	_ = rawjson.Each(system, func(_, start, end int) error {
		if block := system[start:end]; !found && block[0] == '{' && hasString(block, "type", "text") {
			if text, ok := member(block, "text"); ok && bytes.HasPrefix(text, []byte(`"`+claudeCodeTitle)) {
				found = true
			}
		}
		return nil
	})
	return found
}

// kindOfResponses is the kind of a Responses API request (POST /v1/responses): KindCompaction
// when an input item is {"type":"compaction_trigger"} (Codex's remote compaction: it requires
// exactly one compaction item back), or when Codex's turn metadata in
// client_metadata["x-codex-turn-metadata"] says "request_kind":"compaction" (Codex's compaction
// for a custom provider, an ordinary request with its summary instruction and no tools; Codex
// sends the same object in its x-codex-turn-metadata header, and the body decides); else
// KindTurn.
func kindOfResponses(top rawjson.Object) string {
	if hasTrigger(top.Get("input")) {
		return KindCompaction
	}
	if cm := top.Get("client_metadata"); cm != nil {
		if v, ok := member(cm, "x-codex-turn-metadata"); ok {
			if meta, ok := rawjson.Unquote(v); ok && compactionMetadata([]byte(meta)) {
				return KindCompaction
			}
		}
	}
	return KindTurn
}

// kindOfGemini is the kind of a Gemini API request (:generateContent, :streamGenerateContent):
// KindSide when its generation config asks for structured output — responseMimeType
// application/json, or a responseSchema or responseJsonSchema (Gemini CLI's routing classifier
// sends the first and the last) — else KindTurn. The API's proto names (generation_config,
// response_mime_type, …) are read too: Google's JSON mapping accepts both.
func kindOfGemini(top rawjson.Object) string {
	config := field(&top, "generationConfig")
	if config == nil {
		return KindTurn
	}
	if mime, ok := member(config, "responseMimeType", "response_mime_type"); ok {
		if m, ok := rawjson.Unquote(mime); ok {
			m, _, _ = strings.Cut(m, ";")
			if strings.EqualFold(strings.TrimSpace(m), "application/json") {
				return KindSide
			}
		}
	}
	for _, names := range [][2]string{{"responseSchema", "response_schema"}, {"responseJsonSchema", "response_json_schema"}} {
		if v, ok := member(config, names[0], names[1]); ok && string(v) != "null" {
			return KindSide
		}
	}
	return KindTurn
}

// member is the raw value of the first of names that the JSON object b holds.
func member(b []byte, names ...string) ([]byte, bool) {
	for _, n := range names {
		if s, e, ok := rawjson.Member(b, n); ok {
			return b[s:e], true
		}
	}
	return nil, false
}

// lastElement is the raw last element of the JSON array list.
func lastElement(list []byte) ([]byte, bool) {
	var last []byte
	if rawjson.Each(list, func(_, start, end int) error {
		last = list[start:end]
		return nil
	}) != nil || last == nil {
		return nil, false
	}
	return last, true
}

// hasString reports whether the object b's member name is the string want.
func hasString(b []byte, name, want string) bool {
	v, ok := member(b, name)
	if !ok {
		return false
	}
	s, ok := rawjson.Unquote(v)
	return ok && s == want
}

// firstText is a content's text — the string itself, or its first text block's — when it begins
// with prefix. Only such a text is unquoted: a long message costs a scan, never a copy.
func firstText(content []byte, prefix string) (string, bool) {
	if len(content) > 0 && content[0] == '[' {
		var text []byte
		_ = rawjson.Each(content, func(_, start, end int) error {
			if block := content[start:end]; text == nil && block[0] == '{' && hasString(block, "type", "text") {
				text, _ = member(block, "text")
			}
			return nil
		})
		content = text
	}
	if !bytes.HasPrefix(content, []byte(`"`+prefix)) {
		return "", false
	}
	return rawjson.Unquote(content)
}

// hasTrigger reports whether the input array holds an item {"type":"compaction_trigger"}.
func hasTrigger(input []byte) bool {
	found := false
	_ = rawjson.Each(input, func(_, start, end int) error {
		if item := input[start:end]; !found && item[0] == '{' && hasString(item, "type", "compaction_trigger") {
			found = true
		}
		return nil
	})
	return found
}

// compactionMetadata reports whether Codex's turn metadata (a JSON object) is a compaction's.
func compactionMetadata(meta []byte) bool {
	return len(meta) > 0 && hasString(meta, "request_kind", "compaction")
}
