package turn

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// Placement is where the workspace goes in a request (docs/spec.md §3.1).
type Placement string

// Placements.
const (
	// PlaceTail appends the workspace to the client's last message or input item when it is the
	// client's own (a user message, a tool's result: each request's InjectWorkspace says), so
	// that every earlier one stays a cached prefix; else it places as PlaceSystem.
	PlaceTail Placement = "tail"
	// PlaceSystem puts the workspace in the system prompt: a leading system or developer message
	// (chat), `instructions` (the Responses API), `system` (the Messages API).
	PlaceSystem Placement = "system"
)

// ParsePlacement reads a placement's name.
func ParsePlacement(s string) (Placement, error) {
	switch p := Placement(strings.ToLower(strings.TrimSpace(s))); p {
	case PlaceTail, PlaceSystem:
		return p, nil
	}
	return "", fmt.Errorf("%q is not a placement (tail or system)", s)
}

// neutralizedTurn is the elements of list from from to end as runs, with the workspace tags in
// the text of the client's latest turn neutralised: its last element that isTurn (the client's
// own text: a user message, a tool's result) and every element after it (an assistant prefill).
// The block then stands before the turn (placement system), and pasted text in the turn cannot
// pose as a later one.
func neutralizedTurn(list []byte, from, end int, isTurn func([]byte) bool) []Payload {
	if !mayHoldTag(list[from:end]) { // nothing to look for: the elements as they came
		return []Payload{{list[from:end]}}
	}
	in := func(start, stop int) bool { return start >= from && stop <= end }
	turn, before, prev := -1, -1, -1 // where the turn starts; the end of the element before it
	_ = rawjson.Each(list, func(_, start, stop int) error {
		if in(start, stop) {
			if isTurn(list[start:stop]) {
				turn, before = start, prev
			}
			prev = stop
		}
		return nil
	})
	if turn < 0 {
		return []Payload{{list[from:end]}}
	}
	var runs []Payload
	if before > from {
		runs = append(runs, Payload{list[from:before]})
	}
	// The turn's elements, those that hold no tag kept together in runs of the client's bytes.
	runStart, runEnd := -1, -1
	_ = rawjson.Each(list, func(_, start, stop int) error {
		if !in(start, stop) || start < turn {
			return nil
		}
		el := list[start:stop]
		if n := neutralizedElement(el); len(n) != len(el) || &n[0] != &el[0] {
			if runStart >= 0 {
				runs, runStart = append(runs, Payload{list[runStart:runEnd]}), -1
			}
			runs = append(runs, Payload{n})
			return nil
		}
		if runStart < 0 {
			runStart = start
		}
		runEnd = stop
		return nil
	})
	if runStart >= 0 {
		runs = append(runs, Payload{list[runStart:runEnd]})
	}
	return runs
}

// neutralizedElement is a message or input item with the workspace tags in the text of its
// content (or a function_call_output's output) neutralised; el itself when it holds none.
func neutralizedElement(el []byte) []byte {
	if !mayHoldTag(el) {
		return el
	}
	for _, member := range []string{"content", "output"} {
		start, end, ok := rawjson.Member(el, member)
		if !ok || (el[start] != '"' && el[start] != '[') {
			continue
		}
		if n := neutralizedContent(el[start:end]); string(n) != string(el[start:end]) {
			return append(append(append([]byte(nil), el[:start]...), n...), el[end:]...)
		}
	}
	return el
}

// neutralizedContent is a content (a JSON string, or an array of parts) with the workspace tags
// of its text neutralised; content itself when it holds none.
func neutralizedContent(content json.RawMessage) json.RawMessage {
	if content[0] == '"' {
		return neutralized(content)
	}
	if !mayHoldTag(content) {
		return content
	}
	out, changed := []byte{'['}, false
	_ = rawjson.Each(content, func(i, start, end int) error {
		if i > 0 {
			out = append(out, ',')
		}
		n := neutralizedPart(content[start:end])
		changed = changed || string(n) != string(content[start:end])
		out = append(out, n...)
		return nil
	})
	if !changed {
		return content
	}
	return append(out, ']')
}

// appendToSystem appends text to a system message's content: to a string (after a blank line),
// as a last text part of an array, or as the content when it has none.
func appendToSystem(msg rawjson.Object, text string) json.RawMessage {
	content := msg.Get("content")
	switch {
	case len(content) > 0 && content[0] == '"':
		msg.Set("content", appendToString(content, text))
	case len(content) > 0 && content[0] == '[':
		parts, _ := rawjson.Split(content)
		msg.Set("content", rawjson.AppendArray(nil, append(parts, textPart(text))))
	default: // null or missing
		msg.Set("content", rawjson.String(text))
	}
	return msg.Bytes()
}

// appendToLast appends text to the member (content, or a Responses function_call_output's
// output) of the last message or item msg (placement tail) as appendToSystem does — to a string
// after a blank line, or as a last part of type partType — but keeps the message's own bytes,
// with the workspace tags in its text neutralised (so that pasted text cannot pose as the
// block). The message is neither decoded (but where its text may hold a tag) nor copied: it goes
// out as pieces of the client's body around the appended text.
func appendToLast(msg []byte, member, partType, text string) Payload {
	start, end, ok := rawjson.Member(msg, member)
	content := json.RawMessage(msg[start:end])
	if !ok || (content[0] != '"' && content[0] != '[') { // missing or null: the text is the content
		o, _ := rawjson.Parse(msg)
		o.Set(member, rawjson.String(text))
		return Payload{o.Bytes()}
	}
	var open json.RawMessage // the content up to where the text goes
	var tail []byte          // the text and what closes the content
	content = neutralizedContent(content)
	if content[0] == '"' {
		open = content[:len(content)-1]
		if !blankString(content) {
			tail = append(tail, `\n\n`...)
		}
		tail = append(rawjson.AppendEscaped(tail, text), '"')
	} else {
		open = content[:len(content)-1]
		if len(bytes.TrimSpace(open)) > 1 {
			tail = append(tail, ',')
		}
		tail = append(append(tail, typedTextPart(partType, text)...), ']')
	}
	return Payload{msg[:start], open, tail, msg[end:]}
}

// appendToString is the JSON string raw with text appended, after a blank line unless raw holds
// only white space. raw keeps its bytes: a client's string is not decoded and encoded again (its
// invalid UTF-8 would become escapes six times its size, which no budget counted).
func appendToString(raw json.RawMessage, text string) json.RawMessage {
	out := append(json.RawMessage(nil), raw[:len(raw)-1]...)
	if !blankString(raw) {
		out = append(out, `\n\n`...)
	}
	return append(rawjson.AppendEscaped(out, text), '"')
}

func textPart(text string) json.RawMessage { return rawTextPart(rawjson.String(text)) }

// rawTextPart is a text part whose text is the JSON string raw, as its bytes are.
func rawTextPart(raw json.RawMessage) json.RawMessage {
	part := rawjson.Object{}
	part.Set("type", rawjson.String("text"))
	part.Set("text", raw)
	return part.Bytes()
}

// typedTextPart is a content part of text: chat's "text", the Responses API's "input_text".
func typedTextPart(typ, text string) json.RawMessage {
	part := rawjson.Object{}
	part.Set("type", rawjson.String(typ))
	part.Set("text", rawjson.String(text))
	return part.Bytes()
}

// mayHoldTag reports whether raw JSON may hold a workspace tag once decoded: a tag needs a '<',
// written as it is or as a \u escape.
func mayHoldTag(raw []byte) bool {
	return bytes.IndexByte(raw, '<') >= 0 || bytes.Contains(raw, []byte(`\u`))
}

// neutralized is the JSON string raw with its workspace tags neutralised; raw itself when it
// holds none. Invalid UTF-8 keeps its bytes: each valid run between invalid bytes is neutralised
// on its own (neither a tag nor an escape spans an invalid byte), so the string grows by its
// tags' '‹' alone, never by escapes of invalid bytes.
func neutralized(raw json.RawMessage) json.RawMessage {
	if !mayHoldTag(raw) {
		return raw
	}
	if utf8.Valid(raw) {
		s, _ := rawjson.Unquote(raw)
		if n := workspace.NeutralizeTags(s); n != s {
			return rawjson.String(n)
		}
		return raw
	}
	out := json.RawMessage{'"'}
	for inner := raw[1 : len(raw)-1]; len(inner) > 0; {
		n := 0
		for n < len(inner) {
			r, size := utf8.DecodeRune(inner[n:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			n += size
		}
		if n == 0 {
			out, inner = append(out, inner[0]), inner[1:]
			continue
		}
		run := neutralized(append(append(json.RawMessage{'"'}, inner[:n]...), '"'))
		out, inner = append(out, run[1:len(run)-1]...), inner[n:]
	}
	return append(out, '"')
}

// neutralizedPart is a content part with the workspace tags of its text neutralised (of a
// Messages tool_result block, its content: a string or blocks); the part itself when it holds
// none.
func neutralizedPart(part json.RawMessage) json.RawMessage {
	if !mayHoldTag(part) {
		return part
	}
	o, err := rawjson.Parse(part)
	if err != nil {
		return part
	}
	key := "text"
	if text(o.Get("type")) == "tool_result" {
		key = "content"
	}
	v := o.Get(key)
	if len(v) == 0 || (v[0] != '"' && (key == "text" || v[0] != '[')) {
		return part
	}
	if n := neutralizedContent(v); string(n) != string(v) {
		o.Set(key, n)
		return o.Bytes()
	}
	return part
}

// blankString reports whether the JSON string raw holds nothing but white space (as
// strings.TrimSpace sees it), without decoding it.
func blankString(raw json.RawMessage) bool {
	b := raw[1 : len(raw)-1]
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == '\\' && i+1 < len(b) {
			switch b[i+1] {
			case 'n', 't', 'r', 'f':
				i += 2
				continue
			case 'u':
				if i+6 <= len(b) {
					if n, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 32); err == nil && unicode.IsSpace(rune(n)) {
						i += 6
						continue
					}
				}
			}
			return false
		}
		if !unicode.IsSpace(r) {
			return false
		}
		i += size
	}
	return true
}
