package turn

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// Reading what upstreams send (docs/spec.md §16): null is the same as an absent member, an
// empty string names nothing, and a value of an unexpected type is read as absent, never as a
// failure. The proxy needs to understand only a workspace call; everything else it reads only
// to pass it on.

// isNull reports a raw value that is absent or JSON null.
func isNull(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }

// text is a raw JSON string's text; "" for null, absent or a value of another type.
func text(v json.RawMessage) string {
	s, _ := rawjson.Unquote(v)
	return s
}

// arguments is a call's arguments as text: a JSON string's text, or the JSON of any other value
// some servers send there (an object); "" for null or absent.
func arguments(v json.RawMessage) string {
	if isNull(v) {
		return ""
	}
	if v[0] == '"' {
		return text(v)
	}
	return string(v)
}

// chatCall is what a chat tool call (or a streamed delta of one) says: its index (-1 for none),
// id, type, and function name and arguments, each "" when absent, null or not a string.
type chatCall struct {
	index         int
	id, typ, name string
	args          string
}

// readChatCall reads a tool call object; ok is false when it is not an object.
func readChatCall(raw json.RawMessage) (c chatCall, o rawjson.Object, ok bool) {
	o, err := rawjson.Parse(raw)
	if err != nil {
		return chatCall{index: -1}, o, false
	}
	c.index = -1
	if n, err := strconv.Atoi(string(o.Get("index"))); err == nil && n >= 0 {
		c.index = n
	}
	c.id, c.typ = text(o.Get("id")), text(o.Get("type"))
	if fn, err := rawjson.Parse(o.Get("function")); err == nil {
		c.name, c.args = text(fn.Get("name")), arguments(fn.Get("arguments"))
	}
	return c, o, true
}

// Names of OpenAI's parallel-call wrapper: one function call whose arguments list the calls
// {"tool_uses":[{"recipient_name":"functions.<name>","parameters":{…}}]}.
var parallelWrappers = map[string]bool{"multi_tool_use.parallel": true, "parallel": true}

// isParallelWrapper reports whether a call of name, not one of the client's tools, is the
// parallel-call wrapper.
func isParallelWrapper(name string, client func(string) bool) bool {
	return parallelWrappers[name] && !client(name)
}

// parallelCall is one call inside a parallel wrapper.
type parallelCall struct {
	name, args string
}

// splitParallel reads a parallel wrapper's calls; ok is false for arguments that do not list
// any.
func splitParallel(args string) ([]parallelCall, bool) {
	var a struct {
		ToolUses []struct {
			RecipientName string          `json:"recipient_name"`
			Parameters    json.RawMessage `json:"parameters"`
		} `json:"tool_uses"`
	}
	if json.Unmarshal([]byte(args), &a) != nil || len(a.ToolUses) == 0 {
		return nil, false
	}
	out := make([]parallelCall, len(a.ToolUses))
	for i, u := range a.ToolUses {
		params := "{}"
		if !isNull(u.Parameters) {
			params = string(u.Parameters)
		}
		out[i] = parallelCall{name: strings.TrimPrefix(u.RecipientName, "functions."), args: params}
	}
	return out, true
}

// wrapperCalls are the calls of c when it is a parallel wrapper (not one of the client's tools)
// that names at least one workspace tool; ok is false otherwise: c is then a call as any other
// (a wrapper naming only the client's tools is the client's call, as the model made it).
func wrapperCalls(c toolCall, client func(string) bool) (parts []parallelCall, ok bool) {
	if !isParallelWrapper(c.Name, client) {
		return nil, false
	}
	parts, ok = splitParallel(c.Arguments)
	for _, p := range parts {
		if tools.IsTool(p.name) {
			return parts, ok
		}
	}
	return nil, false
}

// unwrapParallel is a chat round's calls with each parallel wrapper that names a workspace tool
// replaced by the calls it holds (ids <wrapper id>_<n>): the workspace's run in wsproxy, the
// client's go to the client as calls of their own (not shown: a stream has not sent them). A
// wrapper that names only the client's tools is the client's call, as the model made it. A
// wrapper a stream kept only the start of (Length set: its arguments are longer than a workspace
// call may be) stays the workspace's, refused for its length: the client never gets it cut off.
func unwrapParallel(calls []toolCall, client func(string) bool) (out []toolCall, unwrapped bool) {
	out = make([]toolCall, 0, len(calls))
	for _, c := range calls {
		parts, ok := wrapperCalls(c, client)
		unwrapped = unwrapped || ok
		if !ok {
			if isParallelWrapper(c.Name, client) && c.Length == 0 {
				c.Client, c.shown = true, false // held back from a stream until the round ended
			}
			out = append(out, c)
			continue
		}
		for n, p := range parts {
			part := toolCall{ID: c.ID + "_" + strconv.Itoa(n+1), Name: p.name, Arguments: p.args, Client: client(p.name)}
			if part.Client {
				part.Raw = chatCallJSON(part)
			}
			out = append(out, part)
		}
	}
	return out, unwrapped
}

// chatCallJSON is a tool call in chat completions' shape.
func chatCallJSON(c toolCall) json.RawMessage {
	fn := rawjson.Object{}
	fn.Set("name", rawjson.String(c.Name))
	fn.Set("arguments", rawjson.String(c.Arguments))
	o := rawjson.Object{}
	o.Set("id", rawjson.String(c.ID))
	o.Set("type", rawjson.String("function"))
	o.Set("function", fn.Bytes())
	return o.Bytes()
}
