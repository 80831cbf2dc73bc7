package turn

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// Who wrote what a turn's model read (docs/spec.md §19), by allowlist: the user's own text, the
// app's leading system content, and the model's own output sent back are named; everything else
// is untrusted. A request is read for this only when a workspace write asks (Request.Reading),
// from the elements the parse already found, each read with rawjson.Member: no decode of the body.

// ClientMarkers begin text a client adds to a user message that the user did not type: from the
// first of them to the end of its part, the text is the client's (workspace.SourceClientText).
// Pinned by the captured requests of proxy/testdata/agents; a deployment adds its own
// (UNTRUSTED_MARKERS: AddClientMarkers).
var ClientMarkers = []string{
	// Claude Code
	"<system-reminder>", "<ide_selection>", "<ide_opened_file>", "<bash-stdout>", "<bash-stderr>", "<bash-input>",
	"<command-name>", "<command-message>", "<command-args>", "<local-command-stdout>", "<local-command-stderr>",
	"<task-notification>", "<user-memory-input>",
	// Codex
	"# AGENTS.md instructions for", "<environment_context>", "<user_instructions>", "<INSTRUCTIONS>", "<turn_aborted>",
	// Gemini CLI
	"<session_context>", "--- Content from referenced files ---",
}

// AddClientMarkers adds a deployment's markers to ClientMarkers (at start, before any turn),
// each once.
func AddClientMarkers(markers []string) {
	for _, m := range markers {
		if m = strings.TrimSpace(m); m != "" && !slices.Contains(ClientMarkers, m) {
			ClientMarkers = append(ClientMarkers, m)
		}
	}
}

// appMarkers begin a system message, past the leading ones, that a client writes itself (its
// environment), pinned by captured requests: the app's, not untrusted.
var appMarkers = []string{"# Environment\n"}

// maxUserPart is the longest text part the user is taken to have typed: a longer one was pasted
// or generated.
const maxUserPart = 4000

// reader gathers a request's Reading as its elements are walked in order.
type reader struct {
	r workspace.Reading
	// texts are the user-authored texts of each user-authored message so far (the last two kept).
	texts []string
	// calls name the tool of each call id the model made (results name their tool by it).
	calls map[string]string
	// seenOther: a message that is not leading system content was met.
	seenOther bool
}

func newReader() *reader { return &reader{calls: map[string]string{}} }

// userText reads text the user's message holds: the user's up to the first client marker, the
// client's from there; a part longer than maxUserPart is untrusted as a whole.
func (rd *reader) userText(text string, into *strings.Builder) {
	if len(text) > maxUserPart {
		rd.r.Read(workspace.Part{Type: workspace.SourceClientText})
		return
	}
	cut := len(text)
	for _, m := range ClientMarkers {
		if i := strings.Index(text, m); i >= 0 && i < cut {
			cut = i
		}
	}
	if cut < len(text) {
		rd.r.Read(workspace.Part{Type: workspace.SourceClientText})
	}
	if s := strings.TrimSpace(text[:cut]); s != "" {
		if into.Len() > 0 {
			into.WriteByte('\n')
		}
		into.WriteString(s)
	}
}

// endUser ends a user message: its user-authored text, if any, is among the last two.
func (rd *reader) endUser(b *strings.Builder) {
	if b.Len() == 0 {
		return
	}
	rd.texts = append(rd.texts, b.String())
	if len(rd.texts) > 2 {
		rd.texts = rd.texts[len(rd.texts)-2:]
	}
}

// system reads a system or developer message: the app's while leading, or when a client marks
// it as its own; untrusted after.
func (rd *reader) system(text string) {
	if !rd.seenOther {
		return
	}
	for _, m := range appMarkers {
		if strings.HasPrefix(text, m) {
			return
		}
	}
	rd.r.Read(workspace.Part{Type: workspace.SourceSystem})
}

func (rd *reader) toolResult(callID string) {
	rd.r.Read(workspace.Part{Type: workspace.SourceToolResult, Tool: rd.calls[callID], CallID: callID})
}

func (rd *reader) reading() workspace.Reading {
	rd.r.UserTexts = rd.texts
	return rd.r
}

// str is the string value of member key of obj ("" when absent or not a string).
func str(obj []byte, key string) string {
	s, e, ok := rawjson.Member(obj, key)
	if !ok {
		return ""
	}
	v, _ := rawjson.Unquote(json.RawMessage(obj[s:e]))
	return v
}

// raw is the raw value of the first of keys obj holds (nil when none).
func raw(obj []byte, keys ...string) []byte {
	for _, key := range keys {
		if s, e, ok := rawjson.Member(obj, key); ok {
			return obj[s:e]
		}
	}
	return nil
}

// each calls fn for each element of the array list (nothing for anything else).
func each(list []byte, fn func(el []byte)) {
	_ = rawjson.Each(list, func(_, s, e int) error {
		fn(list[s:e])
		return nil
	})
}

// textOf is the text of content: a string, or the text of its text parts.
func textOf(content []byte) string {
	if len(content) > 0 && content[0] == '"' {
		s, _ := rawjson.Unquote(json.RawMessage(content))
		return s
	}
	var b strings.Builder
	each(content, func(p []byte) {
		b.WriteString(str(p, "text"))
	})
	return b.String()
}

// serverTools reads a tools array for a tool that is not a function the client runs (web search,
// URL fetch, code execution, MCP connectors): the upstream runs it, and its results are
// untrusted. function names the types of the client's own tools ("" for a tool with none).
func (rd *reader) serverTools(list []byte, function ...string) {
	each(list, func(t []byte) {
		typ := str(t, "type")
		for _, f := range function {
			if typ == f {
				return
			}
		}
		rd.r.Read(workspace.Part{Type: workspace.SourceServerTool, Tool: typ})
	})
}

// chatReading classifies a chat completion request's messages (docs/spec.md §19).
func chatReading(msgs []byte, tools []byte) workspace.Reading {
	rd := newReader()
	lastName := ""
	each(msgs, func(m []byte) {
		role := str(m, "role")
		content := raw(m, "content")
		switch role {
		case "system", "developer":
			rd.system(textOf(content))
			return
		}
		rd.seenOther = true
		switch role {
		case "user":
			name := str(m, "name")
			if lastName != "" && name != lastName {
				rd.r.Read(workspace.Part{Type: workspace.SourceClientText})
				return
			}
			lastName = name
			var b strings.Builder
			if len(content) > 0 && content[0] == '"' {
				rd.userText(textOf(content), &b)
			} else {
				each(content, func(p []byte) {
					switch t := str(p, "type"); t {
					case "text":
						rd.userText(str(p, "text"), &b)
					case "image_url":
						rd.r.Read(workspace.Part{Type: workspace.SourceImage})
					default:
						rd.r.Read(workspace.Part{Type: workspace.SourceFile})
					}
				})
			}
			rd.endUser(&b)
		case "assistant":
			each(raw(m, "tool_calls"), func(c []byte) {
				rd.calls[str(c, "id")] = str(raw(c, "function"), "name")
			})
		case "tool", "function":
			rd.toolResult(str(m, "tool_call_id"))
		default:
			rd.r.Read(workspace.Part{Type: workspace.SourceFile})
		}
	})
	rd.serverTools(tools, "function")
	return rd.reading()
}

// messagesReading classifies a Messages request's messages (docs/spec.md §19). system is the
// app's.
func messagesReading(msgs []byte, tools []byte) workspace.Reading {
	rd := newReader()
	rd.seenOther = true // the app's system is the request's system member
	each(msgs, func(m []byte) {
		content := raw(m, "content")
		switch str(m, "role") {
		case "user":
			var b strings.Builder
			if len(content) > 0 && content[0] == '"' {
				rd.userText(textOf(content), &b)
				rd.endUser(&b)
				return
			}
			results := false
			each(content, func(p []byte) {
				if str(p, "type") == "tool_result" {
					results = true
				}
			})
			each(content, func(p []byte) {
				switch t := str(p, "type"); t {
				case "text":
					if results {
						rd.r.Read(workspace.Part{Type: workspace.SourceClientText})
					} else {
						rd.userText(str(p, "text"), &b)
					}
				case "tool_result":
					rd.toolResult(str(p, "tool_use_id"))
				case "image":
					rd.r.Read(workspace.Part{Type: workspace.SourceImage})
				case "cache_control":
				default:
					rd.r.Read(workspace.Part{Type: workspace.SourceFile})
				}
			})
			rd.endUser(&b)
		case "assistant":
			if len(content) > 0 && content[0] == '"' {
				return
			}
			each(content, func(p []byte) {
				switch t := str(p, "type"); t {
				case "text", "thinking", "redacted_thinking":
				case "tool_use", "server_tool_use", "mcp_tool_use":
					rd.calls[str(p, "id")] = str(p, "name")
				default: // web_search_tool_result, web_fetch_tool_result, mcp_tool_result, …
					rd.r.Read(workspace.Part{Type: workspace.SourceServerTool, Tool: rd.calls[str(p, "tool_use_id")], CallID: str(p, "tool_use_id")})
				}
			})
		case "system":
			rd.system(textOf(content))
		default:
			rd.r.Read(workspace.Part{Type: workspace.SourceFile})
		}
	})
	rd.serverTools(tools, "", "custom")
	return rd.reading()
}

// responsesReading classifies a Responses request's input (docs/spec.md §19): a string, or
// items.
func responsesReading(input []byte, tools []byte) workspace.Reading {
	rd := newReader()
	if len(input) > 0 && input[0] == '"' {
		var b strings.Builder
		rd.userText(textOf(input), &b)
		rd.endUser(&b)
	}
	each(input, func(it []byte) {
		typ := str(it, "type")
		switch {
		case typ == "message" || (typ == "" && str(it, "role") != ""):
			content := raw(it, "content")
			switch str(it, "role") {
			case "system", "developer":
				rd.system(textOf(content))
				return
			case "user":
				rd.seenOther = true
				var b strings.Builder
				if len(content) > 0 && content[0] == '"' {
					rd.userText(textOf(content), &b)
				}
				each(content, func(p []byte) {
					switch str(p, "type") {
					case "input_text", "text":
						rd.userText(str(p, "text"), &b)
					case "input_image":
						rd.r.Read(workspace.Part{Type: workspace.SourceImage})
					default:
						rd.r.Read(workspace.Part{Type: workspace.SourceFile})
					}
				})
				rd.endUser(&b)
			default: // the model's own messages
				rd.seenOther = true
			}
		case typ == "reasoning", typ == "compaction":
			rd.seenOther = true
		case typ == "function_call", typ == "custom_tool_call", typ == "local_shell_call":
			rd.seenOther = true
			rd.calls[str(it, "call_id")] = str(it, "name")
		case typ == "function_call_output", typ == "custom_tool_call_output", typ == "local_shell_call_output":
			rd.seenOther = true
			rd.toolResult(str(it, "call_id"))
		case typ == "item_reference":
			rd.seenOther = true
			rd.r.Read(workspace.Part{Type: workspace.SourceServerHeld})
		default: // web_search_call, file_search_call, mcp_call, computer_call_output, …
			rd.seenOther = true
			rd.r.Read(workspace.Part{Type: workspace.SourceServerTool, Tool: typ})
		}
	})
	rd.serverTools(tools, "function", "custom", "local_shell", "namespace") // namespace: a client's group of its functions (Codex)
	return rd.reading()
}

// geminiReading classifies a Gemini request's contents (docs/spec.md §19); systemInstruction is
// the app's, cachedContent the server's.
func geminiReading(contents []byte, tools []byte, cached bool) workspace.Reading {
	rd := newReader()
	if cached {
		rd.r.Read(workspace.Part{Type: workspace.SourceServerHeld})
	}
	each(contents, func(c []byte) {
		parts := raw(c, "parts")
		if str(c, "role") == "model" {
			each(parts, func(p []byte) {
				if fc := raw(p, "functionCall", "function_call"); fc != nil {
					rd.calls[str(fc, "id")] = str(fc, "name")
				}
			})
			return
		}
		results := false
		each(parts, func(p []byte) {
			if raw(p, "functionResponse", "function_response") != nil {
				results = true
			}
		})
		var b strings.Builder
		each(parts, func(p []byte) {
			switch {
			case raw(p, "text") != nil:
				if results {
					rd.r.Read(workspace.Part{Type: workspace.SourceClientText})
				} else {
					rd.userText(str(p, "text"), &b)
				}
			case raw(p, "functionResponse", "function_response") != nil:
				fr := raw(p, "functionResponse", "function_response")
				rd.r.Read(workspace.Part{Type: workspace.SourceToolResult, Tool: str(fr, "name"), CallID: str(fr, "id")})
			case raw(p, "inlineData", "inline_data") != nil:
				rd.r.Read(workspace.Part{Type: workspace.SourceImage})
			case raw(p, "thought") != nil, raw(p, "thoughtSignature", "thought_signature") != nil && len(p) < 2<<10:
			default: // fileData, executableCode results, …
				rd.r.Read(workspace.Part{Type: workspace.SourceFile})
			}
		})
		rd.endUser(&b)
	})
	each(tools, func(t []byte) {
		for _, k := range []string{"googleSearch", "google_search", "googleSearchRetrieval", "google_search_retrieval", "codeExecution",
			"code_execution", "urlContext", "url_context", "retrieval", "fileSearch", "file_search", "googleMaps", "google_maps", "computerUse", "computer_use"} {
			if raw(t, k) != nil {
				rd.r.Read(workspace.Part{Type: workspace.SourceServerTool, Tool: k})
			}
		}
	})
	return rd.reading()
}

// Reading is what the turn's model read, by who wrote it (docs/spec.md §19).
func (c *ChatRequest) Reading() workspace.Reading { return chatReading(c.msgs, c.clientTools.list) }

// Reading is what the turn's model read, by who wrote it (docs/spec.md §19).
func (m *MessagesRequest) Reading() workspace.Reading {
	return messagesReading(m.msgs, m.clientTools.list)
}

// Reading is what the turn's model read, by who wrote it (docs/spec.md §19).
func (r *ResponsesRequest) Reading() workspace.Reading {
	return responsesReading(r.fields.Get("input"), r.clientTools.list)
}

// Reading is what the turn's model read, by who wrote it (docs/spec.md §19).
func (g *GeminiRequest) Reading() workspace.Reading {
	return geminiReading(g.list, g.tools, g.fields.Has("cachedContent") || g.fields.Has("cached_content"))
}
