package turn

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// Who wrote what a turn's model read (docs/spec.md §19), by allowlist: the user's own text, the
// app's leading system content, and the model's own output sent back are named; everything else
// is untrusted. Every thread turn's request is read for this before its start (the thread keeps
// that a turn read untrusted content): the elements of the body the parse checked, each read by
// rawjson's walks of valid JSON, with no decode of the body and no copy of a text but the user's.

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
	// calls are the model's calls so far, by id (raw), with the name of their tool (raw): a
	// result names its tool by the call it answers.
	calls [][2][]byte
	// last is the untrusted part read last (the nearest before a write), its tool and call id
	// raw; none: tainted is false.
	last                 workspace.Part
	lastTool, lastCallID []byte
	// seenOther: a message that is not leading system content was met.
	seenOther bool
	// quick: only whether the request is tainted, and holds the client's tools, is asked: the
	// walk of its conversation ends at the first untrusted part.
	quick bool
}

func newReader() *reader { return &reader{} }

// read counts an untrusted part of kind typ, of tool and answering callID (raw JSON strings, nil
// for none), as workspace.Reading.Read does, with no copy of a tool's name already counted.
func (rd *reader) read(typ string, tool, callID []byte) {
	rd.r.Tainted = true
	rd.last, rd.lastTool, rd.lastCallID = workspace.Part{Type: typ}, tool, callID
	plain := len(tool) >= 2 && tool[0] == '"' && bytes.IndexByte(tool, '\\') < 0
	for i := range rd.r.Sources {
		s := &rd.r.Sources[i]
		if s.Type == typ && ((plain && s.Tool == string(tool[1:len(tool)-1])) || (!plain && s.Tool == unq(tool))) {
			s.Count++
			return
		}
	}
	rd.r.Sources = append(rd.r.Sources, workspace.Source{Type: typ, Tool: unq(tool), Count: 1})
}

// call notes a call of the model's: its id and its tool's name (raw).
func (rd *reader) call(id, name []byte) { rd.calls = append(rd.calls, [2][]byte{id, name}) }

// callName is the name of the tool of the call callID (raw; nil when unknown), the latest of
// that id.
func (rd *reader) callName(callID []byte) []byte {
	for i := len(rd.calls) - 1; i >= 0; i-- {
		if string(rd.calls[i][0]) == string(callID) {
			return rd.calls[i][1]
		}
	}
	return nil
}

// userText reads text the user's message holds: the user's up to the first client marker, the
// client's from there; a part longer than maxUserPart is untrusted as a whole.
func (rd *reader) userText(text string, into *strings.Builder) {
	if len(text) > maxUserPart {
		rd.read(workspace.SourceClientText, nil, nil)
		return
	}
	cut := len(text)
	for _, m := range ClientMarkers {
		if i := strings.Index(text, m); i >= 0 && i < cut {
			cut = i
		}
	}
	if cut < len(text) {
		rd.read(workspace.SourceClientText, nil, nil)
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
	rd.read(workspace.SourceSystem, nil, nil)
}

// toolResult reads the result of the call callID (raw), named by its call's tool.
func (rd *reader) toolResult(callID []byte) {
	rd.read(workspace.SourceToolResult, rd.callName(callID), callID)
}

func (rd *reader) reading() workspace.Reading {
	rd.r.UserTexts = rd.texts
	if rd.r.Tainted {
		last := rd.last
		last.Tool, last.CallID = unq(rd.lastTool), unq(rd.lastCallID)
		rd.r.Nearest = &last
	}
	return rd.r
}

// The request's body was checked whole by its parse: what is read of it again here is read with
// rawjson's walks of valid JSON, which skip a tool result's text at the speed of a memory scan.

// fields are the raw values of the members of obj named by keys (at most 6), in keys' order (nil
// for one obj lacks; a repeated key, its last), read in one pass.
func fields(obj []byte, keys ...string) (vals [6][]byte) {
	rawjson.MembersValid(obj, func(k []byte, s, e int) {
		for i, key := range keys {
			if rawjson.KeyIs(k, key) {
				vals[i] = obj[s:e]
			}
		}
	})
	return vals
}

// str is the string value of member key of obj ("" when absent or not a string).
func str(obj []byte, key string) string { return unq(fields(obj, key)[0]) }

// unq is the string a raw value holds ("" for none, or one that is not a string).
func unq(v []byte) string {
	s, _ := rawjson.Unquote(json.RawMessage(v))
	return s
}

// word is the string a raw value holds, without a copy for the names requests use in numbers
// (roles, types of items and parts).
func word(v []byte) string {
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	switch string(v[1 : len(v)-1]) {
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "system":
		return "system"
	case "developer":
		return "developer"
	case "tool":
		return "tool"
	case "model":
		return "model"
	case "text":
		return "text"
	case "tool_use":
		return "tool_use"
	case "tool_result":
		return "tool_result"
	case "message":
		return "message"
	case "function_call":
		return "function_call"
	case "function_call_output":
		return "function_call_output"
	case "reasoning":
		return "reasoning"
	case "input_text":
		return "input_text"
	case "output_text":
		return "output_text"
	case "thinking":
		return "thinking"
	case "function":
		return "function"
	case "custom":
		return "custom"
	case "image_url":
		return "image_url"
	case "input_image":
		return "input_image"
	}
	return unq(v)
}

// each calls fn for each element of the array list (nothing for anything else).
func each(list []byte, fn func(el []byte)) {
	rawjson.EachValid(list, func(s, e int) bool {
		fn(list[s:e])
		return true
	})
}

// elements calls fn for each element of the array list until the reader knows its request is
// tainted, when it only asks that (reader.quick).
func (rd *reader) elements(list []byte, fn func(el []byte)) {
	rawjson.EachValid(list, func(s, e int) bool {
		fn(list[s:e])
		return !rd.quick || !rd.r.Tainted
	})
}

// textOf is the text of content: a string, or the text of its text parts.
func textOf(content []byte) string {
	if len(content) > 0 && content[0] == '"' {
		return unq(content)
	}
	var b strings.Builder
	each(content, func(p []byte) {
		b.WriteString(str(p, "text"))
	})
	return b.String()
}

// serverTools reads a tools array for a tool that is not a function the client runs (web search,
// URL fetch, code execution, MCP connectors): the upstream runs it, and its results are
// untrusted. function names the types of the client's own tools ("" for a tool with none), and
// of the tools the client runs whose type names a version (Anthropic's bash_20250124 …) by the
// prefix before it; a tool of one of them makes the request one of the client's tools.
func (rd *reader) serverTools(list []byte, function ...string) {
	each(list, func(t []byte) {
		raw := fields(t, "type")[0]
		typ := word(raw)
		for _, f := range function {
			if typ == f || (strings.HasSuffix(f, "_") && strings.HasPrefix(typ, f)) {
				rd.r.ClientTools = true
				return
			}
		}
		rd.read(workspace.SourceServerTool, raw, nil)
	})
}

// chatReading classifies a chat completion request's messages (docs/spec.md §19).
func chatReading(msgs []byte, tools []byte) workspace.Reading {
	return newReader().chat(msgs, tools, false)
}

// chat classifies a chat completion request's messages, of a request that enables the upstream's
// web search (web_search_options) or not.
func (rd *reader) chat(msgs []byte, tools []byte, webSearch bool) workspace.Reading {
	var lastName []byte
	named := false
	rd.serverTools(tools, "function")
	rd.elements(msgs, func(m []byte) {
		f := fields(m, "role", "content", "name", "tool_call_id", "tool_calls")
		role, content := word(f[0]), f[1]
		switch role {
		case "system", "developer":
			rd.system(textOf(content))
			return
		}
		rd.seenOther = true
		switch role {
		case "user":
			if named && string(f[2]) != string(lastName) {
				rd.read(workspace.SourceClientText, nil, nil)
				return
			}
			lastName, named = f[2], f[2] != nil
			var b strings.Builder
			if len(content) > 0 && content[0] == '"' {
				rd.userText(unq(content), &b)
			} else {
				each(content, func(p []byte) {
					pf := fields(p, "type", "text")
					switch word(pf[0]) {
					case "text":
						rd.userText(unq(pf[1]), &b)
					case "image_url":
						rd.read(workspace.SourceImage, nil, nil)
					default:
						rd.read(workspace.SourceFile, nil, nil)
					}
				})
			}
			rd.endUser(&b)
		case "assistant":
			each(f[4], func(c []byte) {
				cf := fields(c, "id", "function")
				rd.call(cf[0], fields(cf[1], "name")[0])
			})
		case "tool", "function":
			rd.toolResult(f[3])
		default:
			rd.read(workspace.SourceFile, nil, nil)
		}
	})
	if webSearch {
		rd.read(workspace.SourceServerTool, []byte(`"web_search_options"`), nil)
	}
	return rd.reading()
}

// messagesReading classifies a Messages request's messages (docs/spec.md §19). system is the
// app's.
func messagesReading(msgs []byte, tools []byte) workspace.Reading {
	return newReader().messages(msgs, tools)
}

func (rd *reader) messages(msgs []byte, tools []byte) workspace.Reading {
	rd.seenOther = true // the app's system is the request's system member
	rd.serverTools(tools, "", "custom", "bash_", "text_editor_", "computer_", "memory_")
	rd.elements(msgs, func(m []byte) {
		f := fields(m, "role", "content")
		content := f[1]
		switch word(f[0]) {
		case "user":
			var b strings.Builder
			if len(content) > 0 && content[0] == '"' {
				rd.userText(unq(content), &b)
				rd.endUser(&b)
				return
			}
			results := false
			each(content, func(p []byte) {
				if word(fields(p, "type")[0]) == "tool_result" {
					results = true
				}
			})
			each(content, func(p []byte) {
				pf := fields(p, "type", "text", "tool_use_id")
				switch word(pf[0]) {
				case "text":
					if results {
						rd.read(workspace.SourceClientText, nil, nil)
					} else {
						rd.userText(unq(pf[1]), &b)
					}
				case "tool_result":
					rd.toolResult(pf[2])
				case "image":
					rd.read(workspace.SourceImage, nil, nil)
				default:
					rd.read(workspace.SourceFile, nil, nil)
				}
			})
			rd.endUser(&b)
		case "assistant":
			if len(content) > 0 && content[0] == '"' {
				return
			}
			each(content, func(p []byte) {
				pf := fields(p, "type", "id", "name", "tool_use_id")
				switch t := word(pf[0]); t {
				case "text", "thinking", "redacted_thinking":
				case "tool_use", "server_tool_use", "mcp_tool_use":
					rd.call(pf[1], pf[2])
				default: // web_search_tool_result, web_fetch_tool_result, mcp_tool_result, …
					rd.read(workspace.SourceServerTool, rd.callName(pf[3]), pf[3])
				}
			})
		case "system":
			rd.system(textOf(content))
		default:
			rd.read(workspace.SourceFile, nil, nil)
		}
	})
	return rd.reading()
}

// responsesReading classifies a Responses request's input (docs/spec.md §19): a string, or
// items.
func responsesReading(input []byte, tools []byte) workspace.Reading {
	return newReader().responses(input, tools)
}

func (rd *reader) responses(input []byte, tools []byte) workspace.Reading {
	// namespace: a client's group of its functions (Codex); the others, tools whose calls the
	// client runs (clientCallTypes).
	rd.serverTools(tools, "function", "custom", "local_shell", "namespace", "shell", "apply_patch", "computer_use_preview")
	if len(input) > 0 && input[0] == '"' {
		var b strings.Builder
		rd.userText(unq(input), &b)
		rd.endUser(&b)
	}
	rd.elements(input, func(it []byte) {
		f := fields(it, "type", "role", "content", "call_id", "name")
		typ := word(f[0])
		switch {
		case typ == "message" || (typ == "" && f[1] != nil):
			content := f[2]
			switch word(f[1]) {
			case "system", "developer":
				rd.system(textOf(content))
				return
			case "user":
				rd.seenOther = true
				var b strings.Builder
				if len(content) > 0 && content[0] == '"' {
					rd.userText(unq(content), &b)
				}
				each(content, func(p []byte) {
					pf := fields(p, "type", "text")
					switch word(pf[0]) {
					case "input_text", "text":
						rd.userText(unq(pf[1]), &b)
					case "input_image":
						rd.read(workspace.SourceImage, nil, nil)
					default:
						rd.read(workspace.SourceFile, nil, nil)
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
			rd.call(f[3], f[4])
		case typ == "function_call_output", typ == "custom_tool_call_output", typ == "local_shell_call_output":
			rd.seenOther = true
			rd.toolResult(f[3])
		case typ == "item_reference":
			rd.seenOther = true
			rd.read(workspace.SourceServerHeld, nil, nil)
		default: // web_search_call, file_search_call, mcp_call, computer_call_output, …
			rd.seenOther = true
			rd.read(workspace.SourceServerTool, f[0], nil)
		}
	})
	return rd.reading()
}

// either is a, or b when a is nil.
func either(a, b []byte) []byte {
	if a != nil {
		return a
	}
	return b
}

// signed reports a Gemini part that holds a thought signature.
func signed(p []byte) bool {
	f := fields(p, "thoughtSignature", "thought_signature")
	return f[0] != nil || f[1] != nil
}

// geminiServerTools are the members of a Gemini tool that enable a tool Google runs.
var geminiServerTools = []string{"googleSearch", "google_search", "googleSearchRetrieval", "google_search_retrieval", "codeExecution",
	"code_execution", "urlContext", "url_context", "retrieval", "fileSearch", "file_search", "googleMaps", "google_maps", "computerUse", "computer_use"}

// geminiReading classifies a Gemini request's contents (docs/spec.md §19); systemInstruction is
// the app's, cachedContent the server's.
func geminiReading(contents []byte, tools []byte, cached bool) workspace.Reading {
	return newReader().gemini(contents, tools, cached)
}

func (rd *reader) gemini(contents []byte, tools []byte, cached bool) workspace.Reading {
	if cached {
		rd.read(workspace.SourceServerHeld, nil, nil)
	}
	each(tools, func(t []byte) {
		rawjson.MembersValid(t, func(k []byte, _, _ int) {
			if rawjson.KeyIs(k, "functionDeclarations") || rawjson.KeyIs(k, "function_declarations") {
				rd.r.ClientTools = true
				return
			}
			for _, name := range geminiServerTools {
				if rawjson.KeyIs(k, name) {
					rd.read(workspace.SourceServerTool, k, nil)
				}
			}
		})
	})
	rd.elements(contents, func(c []byte) {
		f := fields(c, "role", "parts")
		parts := f[1]
		if word(f[0]) == "model" {
			each(parts, func(p []byte) {
				pf := fields(p, "functionCall", "function_call")
				if fc := either(pf[0], pf[1]); fc != nil {
					cf := fields(fc, "id", "name")
					rd.call(cf[0], cf[1])
				}
			})
			return
		}
		results := false
		each(parts, func(p []byte) {
			pf := fields(p, "functionResponse", "function_response")
			results = results || pf[0] != nil || pf[1] != nil
		})
		var b strings.Builder
		each(parts, func(p []byte) {
			pf := fields(p, "text", "functionResponse", "function_response", "inlineData", "inline_data", "thought")
			switch {
			case pf[0] != nil:
				if results {
					rd.read(workspace.SourceClientText, nil, nil)
				} else {
					rd.userText(unq(pf[0]), &b)
				}
			case pf[1] != nil || pf[2] != nil:
				ff := fields(either(pf[1], pf[2]), "name", "id")
				rd.read(workspace.SourceToolResult, ff[0], ff[1])
			case pf[3] != nil || pf[4] != nil:
				rd.read(workspace.SourceImage, nil, nil)
			case pf[5] != nil, len(p) < 2<<10 && signed(p):
			default: // fileData, executableCode results, …
				rd.read(workspace.SourceFile, nil, nil)
			}
		})
		rd.endUser(&b)
	})
	return rd.reading()
}

// Reading is what the turn's model read, by who wrote it (docs/spec.md §19).
func (c *ChatRequest) Reading() workspace.Reading { return c.reading(newReader()) }

// Tainted reports whether the request holds untrusted content, and the client's tools, reading
// its messages up to the first untrusted part.
func (c *ChatRequest) Tainted() (tainted, clientTools bool) {
	return quick(c.reading(&reader{quick: true}))
}

func (c *ChatRequest) reading(rd *reader) workspace.Reading {
	return rd.chat(c.msgs, c.clientTools.list, !isNull(c.fields.Get("web_search_options")))
}

// quick is what a quick reading answers (Request.Tainted).
func quick(r workspace.Reading) (tainted, clientTools bool) { return r.Tainted, r.ClientTools }

// Reading is what the turn's model read, by who wrote it (docs/spec.md §19); an MCP connector
// (mcp_servers) is a server tool.
func (m *MessagesRequest) Reading() workspace.Reading { return m.reading(newReader()) }

// Tainted reports whether the request holds untrusted content, and the client's tools, reading
// its messages up to the first untrusted part.
func (m *MessagesRequest) Tainted() (tainted, clientTools bool) {
	return quick(m.reading(&reader{quick: true}))
}

func (m *MessagesRequest) reading(rd *reader) workspace.Reading {
	if v := m.fields.Get("mcp_servers"); !isNull(v) && string(v) != "[]" {
		rd.read(workspace.SourceServerTool, []byte(`"mcp_servers"`), nil)
	}
	return rd.messages(m.msgs, m.clientTools.list)
}

// Reading is what the turn's model read, by who wrote it (docs/spec.md §19). A turn that
// continues a response wsproxy did not record reads what the upstream holds of it (untrusted); one
// that continues a recorded turn with no words of the user's own is grounded by the words that
// turn was given (workspace.Continuation.UserText).
func (r *ResponsesRequest) Reading() workspace.Reading {
	rd := r.reading(newReader())
	if r.Continued && len(rd.UserTexts) == 0 && r.continuedUserText != "" {
		rd.UserTexts = []string{r.continuedUserText}
	}
	return rd
}

// Tainted reports whether the request holds untrusted content, and the client's tools, reading
// its input up to the first untrusted part.
func (r *ResponsesRequest) Tainted() (tainted, clientTools bool) {
	return quick(r.reading(&reader{quick: true}))
}

func (r *ResponsesRequest) reading(rd *reader) workspace.Reading {
	if r.ClientPrevious != "" && !r.Continued {
		rd.read(workspace.SourceServerHeld, nil, nil)
	}
	if p := r.fields.Get("prompt"); !isNull(p) {
		rd.read(workspace.SourceServerHeld, []byte(`"prompt"`), nil)
	}
	return rd.responses(r.fields.Get("input"), r.clientTools.list)
}

// Reading is what the turn's model read, by who wrote it (docs/spec.md §19).
func (g *GeminiRequest) Reading() workspace.Reading { return g.reading(newReader()) }

// Tainted reports whether the request holds untrusted content, and the client's tools, reading
// its contents up to the first untrusted part.
func (g *GeminiRequest) Tainted() (tainted, clientTools bool) {
	return quick(g.reading(&reader{quick: true}))
}

// The tools are read from the request's tools array (g.tools holds its elements only).
func (g *GeminiRequest) reading(rd *reader) workspace.Reading {
	return rd.gemini(g.list, g.fields.Get("tools"), g.fields.Has("cachedContent") || g.fields.Has("cached_content"))
}
