// Package rawjson reads and writes JSON without decoding it: objects as their members' raw
// values in order, arrays as their elements, strings encoded and decoded as encoding/json does.
// A rewrite built on it touches only what it sets; every other value keeps its exact bytes, so
// new OpenAI parameters and vendor fields (top_k, chat_template_kwargs, …) pass through
// whatever they hold. Every reader here validates what it reads, in the same pass.
package rawjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Errors of Parse and Split: the input is not valid JSON of that kind.
var (
	ErrNotObject = errors.New("not a JSON object")
	ErrNotArray  = errors.New("not a JSON array")
)

// Object is a JSON object kept as raw member values in their original order.
type Object struct {
	Keys []string
	Vals []json.RawMessage
}

// Parse splits the JSON object b into its members, which alias b. Anything but one valid JSON
// object (surrounding space allowed) is ErrNotObject.
func Parse(b []byte) (Object, error) {
	return ParseInto(Object{Keys: make([]string, 0, 8), Vals: make([]json.RawMessage, 0, 8)}, b)
}

// ParseInto is Parse reusing o's member lists (a stream parses thousands of chunks with one set
// of them).
func ParseInto(o Object, b []byte) (Object, error) {
	o.Keys, o.Vals = o.Keys[:0], o.Vals[:0]
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return Object{}, ErrNotObject
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return o, end(b, i+1, ErrNotObject)
	}
	// A member given twice keeps its place and takes the last value (as encoding/json decodes
	// it); past a few members they are found through a map, so that a wide object costs time
	// linear in its members.
	var index map[string]int
	for i < len(b) {
		if b[i] != '"' {
			return Object{}, ErrNotObject
		}
		kend := scanString(b, i)
		if kend < 0 {
			return Object{}, ErrNotObject
		}
		key, err := unquoteKey(b[i:kend])
		if err != nil {
			return Object{}, ErrNotObject
		}
		i = skipSpace(b, kend)
		if i >= len(b) || b[i] != ':' {
			return Object{}, ErrNotObject
		}
		i = skipSpace(b, i+1)
		vend := scanValue(b, i)
		if vend < 0 {
			return Object{}, ErrNotObject
		}
		v := json.RawMessage(b[i:vend:vend])
		if index == nil && len(o.Keys) >= 16 {
			index = make(map[string]int, 2*len(o.Keys))
			for j, k := range o.Keys {
				index[k] = j
			}
		}
		j, dup := -1, false
		if index != nil {
			j, dup = index[key]
		} else if j = o.Index(key); j >= 0 {
			dup = true
		}
		if dup {
			o.Vals[j] = v
		} else {
			o.Keys, o.Vals = append(o.Keys, key), append(o.Vals, v)
			if index != nil {
				index[key] = len(o.Keys) - 1
			}
		}
		i = skipSpace(b, vend)
		if i >= len(b) {
			break
		}
		if b[i] == '}' {
			return o, end(b, i+1, ErrNotObject)
		}
		if b[i] != ',' {
			break
		}
		i = skipSpace(b, i+1)
	}
	return Object{}, ErrNotObject
}

// Member finds the member key of the JSON object b and returns where its value lies,
// b[start:end]; ok is false when b has no such member or is not a valid object. A repeated key
// gives its last value, as Parse does.
func Member(b []byte, key string) (vstart, vend int, ok bool) {
	valid := members(b, func(k string, start, end int) {
		if k == key {
			vstart, vend, ok = start, end, true
		}
	})
	if !valid || !ok {
		return 0, 0, false
	}
	return vstart, vend, true
}

// Repeated is the first of keys that the JSON object b holds more than once ("" for none, and
// for a b that is not a valid object): a value that readers of b may take differently (Parse
// takes the last, some take the first).
func Repeated(b []byte, keys ...string) string {
	var seen []string
	repeated := ""
	valid := members(b, func(k string, _, _ int) {
		if repeated != "" || !slices.Contains(keys, k) {
			return
		}
		if slices.Contains(seen, k) {
			repeated = k
		}
		seen = append(seen, k)
	})
	if !valid {
		return ""
	}
	return repeated
}

// members calls fn with each member of the JSON object b, in order: its name and where its value
// lies (b[start:end]). It reports whether b is one valid object (fn may have seen members of
// one that is not).
func members(b []byte, fn func(key string, start, end int)) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return end(b, i+1, ErrNotObject) == nil
	}
	for i < len(b) {
		if b[i] != '"' {
			return false
		}
		kend := scanString(b, i)
		if kend < 0 {
			return false
		}
		k, err := unquoteKey(b[i:kend])
		if err != nil {
			return false
		}
		i = skipSpace(b, kend)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		e := scanValue(b, i)
		if e < 0 {
			return false
		}
		fn(k, i, e)
		i = skipSpace(b, e)
		if i >= len(b) {
			break
		}
		if b[i] == '}' {
			return end(b, i+1, ErrNotObject) == nil
		}
		if b[i] != ',' {
			break
		}
		i = skipSpace(b, i+1)
	}
	return false
}

// end checks that only space follows a value ending at i.
func end(b []byte, i int, err error) error {
	if skipSpace(b, i) != len(b) {
		return err
	}
	return nil
}

// Each calls fn for every element of the JSON array b, in order, with its index and where it
// lies (b[start:end]), without allocating; it stops at fn's first error and returns it. Anything
// but one valid JSON array is ErrNotArray.
func Each(b []byte, fn func(i, start, end int) error) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return ErrNotArray
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return end(b, i+1, ErrNotArray)
	}
	for n := 0; i < len(b); n++ {
		vend := scanValue(b, i)
		if vend < 0 {
			return ErrNotArray
		}
		if err := fn(n, i, vend); err != nil {
			return err
		}
		i = skipSpace(b, vend)
		if i >= len(b) {
			break
		}
		if b[i] == ']' {
			return end(b, i+1, ErrNotArray)
		}
		if b[i] != ',' {
			break
		}
		i = skipSpace(b, i+1)
	}
	return ErrNotArray
}

// Split returns the elements of the JSON array b, which alias b. For arrays a peer sends in
// small numbers (choices, tool calls); a client's arrays are walked with Each.
func Split(b []byte) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, 0, 4)
	err := Each(b, func(_, start, end int) error {
		out = append(out, b[start:end:end])
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

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

// Index is the position of the member key, -1 when absent.
func (o *Object) Index(key string) int {
	for i, k := range o.Keys {
		if k == key {
			return i
		}
	}
	return -1
}

// Get returns the member's raw value, nil when absent.
func (o *Object) Get(key string) json.RawMessage {
	if i := o.Index(key); i >= 0 {
		return o.Vals[i]
	}
	return nil
}

// Has reports whether the member is present and not null.
func (o *Object) Has(key string) bool {
	v := o.Get(key)
	return v != nil && string(v) != "null"
}

// Set replaces the member's value in place, or appends the member.
func (o *Object) Set(key string, v json.RawMessage) {
	if i := o.Index(key); i >= 0 {
		o.Vals[i] = v
		return
	}
	o.Keys = append(o.Keys, key)
	o.Vals = append(o.Vals, v)
}

// Del removes the member.
func (o *Object) Del(key string) {
	if i := o.Index(key); i >= 0 {
		o.Keys = append(o.Keys[:i:i], o.Keys[i+1:]...)
		o.Vals = append(o.Vals[:i:i], o.Vals[i+1:]...)
	}
}

// Clone copies the member lists (not the values, which are never modified in place).
func (o Object) Clone() Object {
	return Object{Keys: append([]string(nil), o.Keys...), Vals: append([]json.RawMessage(nil), o.Vals...)}
}

// Own copies the object with its values, so that it outlives the buffer it was parsed from.
func (o Object) Own() Object {
	n := 0
	for _, v := range o.Vals {
		n += len(v)
	}
	buf := make([]byte, 0, n)
	c := Object{Keys: append([]string(nil), o.Keys...), Vals: make([]json.RawMessage, len(o.Vals))}
	for i, v := range o.Vals {
		start := len(buf)
		buf = append(buf, v...)
		c.Vals[i] = buf[start:len(buf):len(buf)]
	}
	return c
}

// AppendTo appends the object's encoding to buf.
func (o *Object) AppendTo(buf []byte) []byte {
	buf = append(buf, '{')
	for i, k := range o.Keys {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = AppendString(buf, k)
		buf = append(buf, ':')
		buf = append(buf, o.Vals[i]...)
	}
	return append(buf, '}')
}

// Bytes is the object's encoding.
func (o *Object) Bytes() []byte { return o.AppendTo(make([]byte, 0, o.Size())) }

// Size is an upper bound of the encoding's length (exact for keys without escapes).
func (o *Object) Size() int {
	n := 2
	for i, k := range o.Keys {
		n += len(k) + 4 + len(o.Vals[i])
	}
	return n
}

// AppendString appends s as a JSON string, escaping what JSON requires (quotes, backslashes,
// control characters) and nothing else; invalid UTF-8 becomes U+FFFD, as encoding/json does.
func AppendString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	buf = AppendEscaped(buf, s)
	return append(buf, '"')
}

// AppendEscaped appends s escaped as the inside of a JSON string (AppendString without the
// quotes).
func AppendEscaped(buf []byte, s string) []byte {
	const hex = "0123456789abcdef"
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
	return append(buf, s[start:]...)
}

// AppendArray appends a JSON array of raw values. A value may itself be several elements joined
// by commas (a run of an array's elements, as they came).
func AppendArray(buf []byte, vals []json.RawMessage) []byte {
	buf = append(buf, '[')
	for i, v := range vals {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, v...)
	}
	return append(buf, ']')
}

// String is s as a raw JSON string.
func String(s string) json.RawMessage { return AppendString(nil, s) }

// Int is n as a raw JSON number.
func Int(n int) json.RawMessage { return json.RawMessage(strconv.Itoa(n)) }

// Unquote decodes a raw JSON string; ok is false for anything else (null included).
func Unquote(v json.RawMessage) (string, bool) {
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

// Marshal encodes v with encoding/json, without escaping <, > and & (as OpenAI's own responses
// do).
func Marshal(v any) ([]byte, error) {
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
