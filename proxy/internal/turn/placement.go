package turn

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
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
		if n := neutralizedElement(el); n != nil {
			if runStart >= 0 {
				runs, runStart = append(runs, Payload{list[runStart:runEnd]}), -1
			}
			runs = append(runs, n)
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
// content (or a function_call_output's output) neutralised, as pieces of the client's bytes
// around the strings rewritten; nil when it holds none.
func neutralizedElement(el []byte) Payload {
	if !mayHoldTag(el) {
		return nil
	}
	for _, member := range []string{"content", "output"} {
		start, end, ok := rawjson.Member(el, member)
		if !ok || (el[start] != '"' && el[start] != '[') {
			continue
		}
		if n := neutralizedPieces(el[start:end]); n != nil {
			return append(append(Payload{el[:start]}, n...), el[end:])
		}
	}
	return nil
}

// neutralizedContent is a content (a JSON string, or an array of parts) with the workspace tags
// of its text neutralised; content itself when it holds none.
func neutralizedContent(content json.RawMessage) json.RawMessage {
	if content[0] == '"' {
		return neutralized(content)
	}
	n := neutralizedPieces(content)
	if n == nil {
		return content
	}
	return n.joined()
}

// neutralizedPieces is neutralizedContent as pieces: the client's bytes but for the strings
// rewritten, one copy of each; nil when content holds no tag.
func neutralizedPieces(content json.RawMessage) Payload {
	if !mayHoldTag(content) {
		return nil
	}
	if content[0] == '"' {
		if n := neutralized(content); &n[0] != &content[0] {
			return Payload{n}
		}
		return nil
	}
	var out Payload
	copied := 0 // content[:copied] is in out
	_ = rawjson.Each(content, func(_, start, end int) error {
		part := content[start:end]
		vs, ve, ok := partText(part)
		if !ok {
			return nil
		}
		n := neutralizedPieces(part[vs:ve])
		if n == nil {
			return nil
		}
		out = append(append(out, content[copied:start+vs]), n...)
		copied = start + ve
		return nil
	})
	if out == nil {
		return nil
	}
	return append(out, content[copied:])
}

// partText is where a content part's text lies: its text (a string), or a Messages tool_result
// block's content (a string or blocks); ok false for a part that has none.
func partText(part []byte) (start, end int, ok bool) {
	if !mayHoldTag(part) {
		return 0, 0, false
	}
	key := "text"
	if ts, te, ok := rawjson.Member(part, "type"); ok && text(json.RawMessage(part[ts:te])) == "tool_result" {
		key = "content"
	}
	start, end, ok = rawjson.Member(part, key)
	if !ok || end == start || (part[start] != '"' && (key == "text" || part[start] != '[')) {
		return 0, 0, false
	}
	return start, end, true
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
	// The content as pieces (the strings with a tag rewritten, the rest the client's bytes), up to
	// where the text goes: before its closing quote or bracket.
	open := neutralizedPieces(content)
	if open == nil {
		open = Payload{content}
	}
	last := open[len(open)-1]
	open[len(open)-1] = last[:len(last)-1]
	var tail []byte // the text and what closes the content
	if content[0] == '"' {
		if !blankString(content) {
			tail = append(tail, `\n\n`...)
		}
		tail = append(rawjson.AppendEscaped(tail, text), '"')
	} else {
		if len(bytes.TrimSpace(content[:len(content)-1])) > 1 {
			tail = append(tail, ',')
		}
		tail = append(append(tail, typedTextPart(partType, text)...), ']')
	}
	return append(append(Payload{msg[:start]}, open...), tail, msg[end:])
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

// neutralized is the JSON string raw with its workspace tags neutralised, read as
// workspace.NeutralizeTags reads the string it encodes (a '<', then spaces, an optional '/',
// spaces, and "workspace" in any case), each tag's '<' — written as it is or as a \u escape —
// replaced by '‹'; every other byte is the client's, escapes and invalid UTF-8 included (an
// invalid byte is no part of a tag). raw itself when it holds none; else one copy of it, made
// at the first tag (docs/spec.md §3.1, §16).
func neutralized(raw json.RawMessage) json.RawMessage {
	if !mayHoldTag(raw) || len(raw) < 2 {
		return raw
	}
	var out json.RawMessage // nil until the first tag
	copied := 0             // raw[:copied] is in out
	for i := 1; i < len(raw)-1; {
		r, size := jsonCharAt(raw, i)
		if r == '<' && isTagAfter(raw, i+size) {
			if out == nil {
				// A tag is at least 10 bytes ("<workspace"), and its '‹' 2 more than its '<'.
				out = make(json.RawMessage, 0, len(raw)+len(raw)/5+8)
			}
			out = append(append(out, raw[copied:i]...), "‹"...)
			copied = i + size
		}
		i += size
	}
	if out == nil {
		return raw
	}
	return append(out, raw[copied:]...)
}

// isTagAfter reports whether what follows a '<' at raw[i:] (inside a JSON string) makes it a
// workspace tag: spaces, an optional '/', spaces, then "workspace" in any case.
func isTagAfter(raw []byte, i int) bool {
	end := len(raw) - 1 // the closing quote
	skipSpaces := func() {
		for i < end {
			r, size := jsonCharAt(raw, i)
			if r != ' ' && r != '\t' && r != '\n' && r != '\f' && r != '\r' {
				return
			}
			i += size
		}
	}
	skipSpaces()
	if i < end {
		if r, size := jsonCharAt(raw, i); r == '/' {
			i += size
			skipSpaces()
		}
	}
	for _, want := range "workspace" {
		if i >= end {
			return false
		}
		r, size := jsonCharAt(raw, i)
		if r != want && !equalFoldRune(r, want) {
			return false
		}
		i += size
	}
	return true
}

// equalFoldRune reports whether r and want are equal under Unicode simple case folding, as a
// case-insensitive regular expression compares them (ſ is s, the Kelvin sign is k).
func equalFoldRune(r, want rune) bool {
	for f := unicode.SimpleFold(want); f != want; f = unicode.SimpleFold(f) {
		if f == r {
			return true
		}
	}
	return false
}

// jsonCharAt reads the character of a JSON string's body at raw[i]: an escape (a surrogate pair
// of \u escapes as one character) or a UTF-8 sequence, and its length in bytes; an invalid
// byte or escape reads as utf8.RuneError of its one byte.
func jsonCharAt(raw []byte, i int) (rune, int) {
	if raw[i] != '\\' {
		return utf8.DecodeRune(raw[i:])
	}
	if i+1 >= len(raw) {
		return utf8.RuneError, 1
	}
	switch c := raw[i+1]; c {
	case 'u':
		hi, ok := hex4At(raw, i+2)
		if !ok {
			return utf8.RuneError, 1
		}
		if utf16.IsSurrogate(hi) && i+11 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
			if lo, ok := hex4At(raw, i+8); ok {
				if r := utf16.DecodeRune(hi, lo); r != utf8.RuneError {
					return r, 12
				}
			}
		}
		return hi, 6
	case 'n':
		return '\n', 2
	case 't':
		return '\t', 2
	case 'r':
		return '\r', 2
	case 'f':
		return '\f', 2
	case 'b':
		return '\b', 2
	default: // \" \\ \/
		return rune(c), 2
	}
}

// hex4At reads the four hex digits at raw[i:].
func hex4At(raw []byte, i int) (rune, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	var v rune
	for _, c := range raw[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			v = v<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			v = v<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			v = v<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// neutralizedPart is a content part with the workspace tags of its text neutralised (of a
// Messages tool_result block, its content: a string or blocks); the part itself when it holds
// none.
func neutralizedPart(part json.RawMessage) json.RawMessage {
	vs, ve, ok := partText(part)
	if !ok {
		return part
	}
	n := neutralizedPieces(part[vs:ve])
	if n == nil {
		return part
	}
	return append(append(Payload{part[:vs]}, n...), part[ve:]).joined()
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
