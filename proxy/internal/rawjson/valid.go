package rawjson

import "bytes"

// Reading JSON already checked. A request's body is checked whole once (Parse, Valid); what is
// read of it again — an element's role, the types of its parts — need not be checked twice.
// These functions walk a value known to be valid JSON, skipping strings with bytes.IndexByte:
// a long tool result costs a memory scan, not a byte-by-byte check. On input that is not valid
// JSON their results are meaningless, but they stay within the input and always end.

// skipValid returns the index just past the valid JSON value starting at b[i] (after any space).
func skipValid(b []byte, i int) int {
	i = skipSpace(b, i)
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return skipStringValid(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipStringValid(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	}
	for i < len(b) {
		switch b[i] {
		case ',', ']', '}', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// skipStringValid returns the index just past the valid JSON string at b[i] == '"'.
func skipStringValid(b []byte, i int) int {
	for j := i + 1; j < len(b); {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return len(b)
		}
		end := j + k
		n := 0 // the backslashes before it: an odd number escapes it
		for p := end - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return end + 1
		}
		j = end + 1
	}
	return len(b)
}

// EachValid calls fn for every element of b, a valid JSON array, in order, with where it lies
// (b[start:end]), until fn returns false. It calls fn for nothing when b is not an array.
func EachValid(b []byte, fn func(start, end int) bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return
	}
	for i = skipSpace(b, i+1); i < len(b) && b[i] != ']'; {
		e := skipValid(b, i)
		if !fn(i, e) {
			return
		}
		i = skipSpace(b, e)
		if i >= len(b) || b[i] != ',' {
			return
		}
		i = skipSpace(b, i+1)
	}
}

// MemberValid finds the member key of b, a valid JSON object, and returns where its value lies,
// b[start:end]; ok is false when b has no such member or is not an object. A repeated key gives
// its last value, as Parse and Member do.
func MemberValid(b []byte, key string) (start, end int, ok bool) {
	MembersValid(b, func(k []byte, s, e int) {
		if KeyIs(k, key) {
			start, end, ok = s, e, true
		}
	})
	return start, end, ok
}

// keyIs reports whether the quoted key q, which holds escapes, reads as key.
func keyIs(q []byte, key string) bool {
	k, err := unquoteKey(q)
	return err == nil && k == key
}

// MembersValid calls fn with each member of b, a valid JSON object, in order: its key as it lies
// in b (quoted, escapes and all: KeyIs reads it) and where its value lies, b[start:end]. It calls
// fn for nothing when b is not an object.
func MembersValid(b []byte, fn func(key []byte, start, end int)) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return
	}
	for i = skipSpace(b, i+1); i < len(b) && b[i] == '"'; {
		kstart, kend := i, skipStringValid(b, i)
		i = skipSpace(b, kend)
		if i >= len(b) || b[i] != ':' {
			return
		}
		vs := skipSpace(b, i+1)
		ve := skipValid(b, vs)
		fn(b[kstart:kend], vs, ve)
		i = skipSpace(b, ve)
		if i >= len(b) || b[i] != ',' {
			return
		}
		i = skipSpace(b, i+1)
	}
}

// KeyIs reports whether q, a member's key as MembersValid gives it (quoted), reads as key.
func KeyIs(q []byte, key string) bool {
	if len(q) < 2 {
		return false
	}
	if k := q[1 : len(q)-1]; bytes.IndexByte(k, '\\') < 0 {
		return string(k) == key
	}
	return keyIs(q, key)
}
