package workspace

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// argumentsJSON is how a call's arguments are stored (jsonb): the JSON value the model sent, or
// a JSON string of the raw text when it was not JSON. jsonb cannot hold NUL characters, invalid
// UTF-8 or a lone surrogate escape (\ud800), so those become U+FFFD.
func argumentsJSON(raw string) []byte {
	if json.Valid([]byte(raw)) {
		if utf8.ValidString(raw) && !strings.Contains(raw, `\u0000`) && !hasSurrogateEscape(raw) {
			return []byte(raw)
		}
		var v any
		if err := json.Unmarshal([]byte(raw), &v); err == nil {
			if b, err := json.Marshal(scrub(v)); err == nil {
				return b
			}
		}
	}
	b, _ := json.Marshal(storableText(raw))
	return b
}

// hasSurrogateEscape reports a \uD800-\uDFFF escape in raw JSON (decoding and encoding again
// replaces the lone ones with U+FFFD and writes the pairs as UTF-8).
func hasSurrogateEscape(raw string) bool {
	for i := 0; i+5 < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if raw[i+1] == 'u' && (raw[i+2]|0x20) == 'd' && strings.IndexByte("89abcdefABCDEF", raw[i+3]) >= 0 {
			return true
		}
		i++ // the escaped character
	}
	return false
}

// scrub replaces NUL characters in every string of a decoded JSON value.
func scrub(v any) any {
	switch x := v.(type) {
	case string:
		return storableText(x)
	case []any:
		for i := range x {
			x[i] = scrub(x[i])
		}
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[storableText(k)] = scrub(e)
		}
		return m
	}
	return v
}

// storableText makes s storable in a Postgres text or jsonb value: valid UTF-8, no NUL.
func storableText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// Truncate is s cut to its first n bytes at a character's boundary, marked with an ellipsis.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
