package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"
)

// object is a JSON object kept as raw values in their original order, so that a rewrite touches
// only the fields it sets and every other field keeps its exact bytes: new OpenAI parameters and
// vendor fields (top_k, chat_template_kwargs, …) pass through whatever they hold.
type object struct {
	keys []string
	vals []json.RawMessage
}

var errNotObject = errors.New("not a JSON object")

// parseObject splits a JSON object into its members. b must be valid JSON (checked by the
// caller with json.Valid, or produced by a JSON encoder); the members alias b.
func parseObject(b []byte) (object, error) {
	return parseObjectInto(object{keys: make([]string, 0, 8), vals: make([]json.RawMessage, 0, 8)}, b)
}

// parseObjectInto is parseObject reusing o's member lists (a stream parses thousands of chunks
// with one set of them).
func parseObjectInto(o object, b []byte) (object, error) {
	o.keys, o.vals = o.keys[:0], o.vals[:0]
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return object{}, errNotObject
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return o, nil
	}
	for i < len(b) {
		if b[i] != '"' {
			return object{}, errNotObject
		}
		end := skipString(b, i)
		key, err := unquoteKey(b[i:end])
		if err != nil {
			return object{}, err
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return object{}, errNotObject
		}
		i = skipSpace(b, i+1)
		vend := skipValue(b, i)
		if vend <= i {
			return object{}, errNotObject
		}
		o.set(key, json.RawMessage(b[i:vend]))
		i = skipSpace(b, vend)
		if i >= len(b) {
			return object{}, errNotObject
		}
		if b[i] == '}' {
			return o, nil
		}
		if b[i] != ',' {
			return object{}, errNotObject
		}
		i = skipSpace(b, i+1)
	}
	return object{}, errNotObject
}

// splitArray splits a JSON array into its elements, which alias b. Like parseObject it expects
// valid JSON; anything but an array is an error.
func splitArray(b []byte) ([]json.RawMessage, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, errNotArray
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return []json.RawMessage{}, nil
	}
	out := make([]json.RawMessage, 0, 8)
	for i < len(b) {
		end := skipValue(b, i)
		if end <= i {
			return nil, errNotArray
		}
		out = append(out, json.RawMessage(b[i:end:end]))
		i = skipSpace(b, end)
		if i >= len(b) {
			break
		}
		if b[i] == ']' {
			return out, nil
		}
		if b[i] != ',' {
			break
		}
		i = skipSpace(b, i+1)
	}
	return nil, errNotArray
}

var errNotArray = errors.New("not a JSON array")

// unquoteKey decodes a member name as encoding/json does (invalid UTF-8 becomes U+FFFD).
func unquoteKey(q []byte) (string, error) {
	inner := q[1 : len(q)-1]
	if k, ok := commonKey(inner); ok {
		return k, nil
	}
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	var s string
	err := json.Unmarshal(q, &s)
	return s, err
}

// commonKey returns the member names of chat requests and chunks without allocating.
func commonKey(b []byte) (string, bool) {
	switch string(b) { // the compiler compares without converting
	case "id":
		return "id", true
	case "object":
		return "object", true
	case "created":
		return "created", true
	case "model":
		return "model", true
	case "choices":
		return "choices", true
	case "index":
		return "index", true
	case "delta":
		return "delta", true
	case "role":
		return "role", true
	case "content":
		return "content", true
	case "finish_reason":
		return "finish_reason", true
	case "logprobs":
		return "logprobs", true
	case "usage":
		return "usage", true
	case "system_fingerprint":
		return "system_fingerprint", true
	case "tool_calls":
		return "tool_calls", true
	case "function":
		return "function", true
	case "name":
		return "name", true
	case "arguments":
		return "arguments", true
	case "type":
		return "type", true
	case "messages":
		return "messages", true
	case "message":
		return "message", true
	case "tools":
		return "tools", true
	case "stream":
		return "stream", true
	}
	return "", false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index just past the JSON value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	default: // number, true, false, null
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
		}
		return i
	}
}

func (o *object) index(key string) int {
	for i, k := range o.keys {
		if k == key {
			return i
		}
	}
	return -1
}

// get returns the member's raw value, nil when absent.
func (o *object) get(key string) json.RawMessage {
	if i := o.index(key); i >= 0 {
		return o.vals[i]
	}
	return nil
}

// has reports whether the member is present and not null.
func (o *object) has(key string) bool {
	v := o.get(key)
	return v != nil && string(v) != "null"
}

// set replaces the member's value in place, or appends the member.
func (o *object) set(key string, v json.RawMessage) {
	if i := o.index(key); i >= 0 {
		o.vals[i] = v
		return
	}
	o.keys = append(o.keys, key)
	o.vals = append(o.vals, v)
}

func (o *object) del(key string) {
	if i := o.index(key); i >= 0 {
		o.keys = append(o.keys[:i:i], o.keys[i+1:]...)
		o.vals = append(o.vals[:i:i], o.vals[i+1:]...)
	}
}

// clone copies the member lists (not the values, which are never modified in place).
func (o object) clone() object {
	return object{keys: append([]string(nil), o.keys...), vals: append([]json.RawMessage(nil), o.vals...)}
}

// own copies the object with its values, so that it outlives the buffer it was parsed from.
func (o object) own() object {
	n := 0
	for _, v := range o.vals {
		n += len(v)
	}
	buf := make([]byte, 0, n)
	c := object{keys: append([]string(nil), o.keys...), vals: make([]json.RawMessage, len(o.vals))}
	for i, v := range o.vals {
		start := len(buf)
		buf = append(buf, v...)
		c.vals[i] = buf[start:len(buf):len(buf)]
	}
	return c
}

// appendJSON appends the object's encoding to buf.
func (o *object) appendJSON(buf []byte) []byte {
	buf = append(buf, '{')
	for i, k := range o.keys {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendString(buf, k)
		buf = append(buf, ':')
		buf = append(buf, o.vals[i]...)
	}
	return append(buf, '}')
}

func (o *object) bytes() []byte { return o.appendJSON(make([]byte, 0, o.size())) }

func (o *object) size() int {
	n := 2
	for i, k := range o.keys {
		n += len(k) + 4 + len(o.vals[i])
	}
	return n
}

// appendString appends s as a JSON string, escaping what JSON requires (quotes, backslashes,
// control characters) and nothing else; invalid UTF-8 becomes U+FFFD, as encoding/json does.
func appendString(buf []byte, s string) []byte {
	const hex = "0123456789abcdef"
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				buf = append(buf, s[start:i]...)
				buf = append(buf, "\\ufffd"...)
				i += size
				start = i
				continue
			}
			i += size
			continue
		}
		buf = append(buf, s[start:i]...)
		switch c {
		case '"', '\\':
			buf = append(buf, '\\', c)
		case '\n':
			buf = append(buf, '\\', 'n')
		case '\r':
			buf = append(buf, '\\', 'r')
		case '\t':
			buf = append(buf, '\\', 't')
		default:
			buf = append(buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"')
}

// marshalNoEscape encodes v without escaping <, > and & (as OpenAI's own responses do).
func marshalNoEscape(v any) ([]byte, error) {
	var w byteWriter
	enc := json.NewEncoder(&w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return w.b[:len(w.b)-1], nil // drop Encode's newline
}

type byteWriter struct{ b []byte }

func (w *byteWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// appendArray appends a JSON array of raw values.
func appendArray(buf []byte, vals []json.RawMessage) []byte {
	buf = append(buf, '[')
	for i, v := range vals {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, v...)
	}
	return append(buf, ']')
}

func rawString(s string) json.RawMessage { return appendString(nil, s) }

func rawInt(n int) json.RawMessage { return json.RawMessage(strconv.Itoa(n)) }

// stringValue decodes a raw JSON string; ok is false for anything else (null included).
func stringValue(v json.RawMessage) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	if bytes.IndexByte(v[1:len(v)-1], '\\') < 0 {
		return string(v[1 : len(v)-1]), true
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false
	}
	return s, true
}
