package rawjson

// maxDepth is encoding/json's nesting limit, kept so that Valid agrees with encoding/json.Valid.
const maxDepth = 10000

// Valid reports whether data is one valid JSON value, exactly as encoding/json.Valid does
// (strings are not checked for valid UTF-8 there either), in one pass without allocating for
// depths up to 64. FuzzValid compares the two.
func Valid(data []byte) bool {
	end := scanValue(data, skipSpace(data, 0))
	return end >= 0 && skipSpace(data, end) == len(data)
}

// scanValue is the package's one scanner: it checks the JSON value starting at data[i] and
// returns the index just past it, or -1 when it is not valid JSON. Containers are scanned
// iteratively (no recursion), up to maxDepth levels.
func scanValue(data []byte, i int) int {
	var buf [64]byte
	closers := buf[:0] // the closing bracket each open container expects
	for {
		// A value starts at i.
		if i >= len(data) {
			return -1
		}
		switch c := data[i]; {
		case c == '{' || c == '[':
			if len(closers) >= maxDepth {
				return -1
			}
			i = skipSpace(data, i+1)
			if c == '{' {
				if i < len(data) && data[i] == '}' {
					i++
					break
				}
				if i = scanMember(data, i); i < 0 {
					return -1
				}
				closers = append(closers, '}')
			} else {
				if i < len(data) && data[i] == ']' {
					i++
					break
				}
				closers = append(closers, ']')
			}
			continue
		case c == '"':
			if i = scanString(data, i); i < 0 {
				return -1
			}
		case c == '-' || (c >= '0' && c <= '9'):
			if i = scanNumber(data, i); i < 0 {
				return -1
			}
		case c == 't':
			if i = scanLiteral(data, i, "true"); i < 0 {
				return -1
			}
		case c == 'f':
			if i = scanLiteral(data, i, "false"); i < 0 {
				return -1
			}
		case c == 'n':
			if i = scanLiteral(data, i, "null"); i < 0 {
				return -1
			}
		default:
			return -1
		}
		// A value ended: close containers, or find the next value.
		for {
			if len(closers) == 0 {
				return i
			}
			i = skipSpace(data, i)
			if i >= len(data) {
				return -1
			}
			top := closers[len(closers)-1]
			if data[i] == top {
				closers = closers[:len(closers)-1]
				i++
				continue
			}
			if data[i] != ',' {
				return -1
			}
			i = skipSpace(data, i+1)
			if top == '}' {
				if i = scanMember(data, i); i < 0 {
					return -1
				}
			}
			break
		}
	}
}

// scanMember scans `"name" :` and the space after it; -1 when it is not there.
func scanMember(data []byte, i int) int {
	if i >= len(data) || data[i] != '"' {
		return -1
	}
	if i = scanString(data, i); i < 0 {
		return -1
	}
	i = skipSpace(data, i)
	if i >= len(data) || data[i] != ':' {
		return -1
	}
	return skipSpace(data, i+1)
}

// scanString returns the index past the string at data[i] == '"', or -1.
func scanString(data []byte, i int) int {
	for i++; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			i++
			if i >= len(data) {
				return -1
			}
			switch data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(data) {
					return -1
				}
				for _, h := range data[i+1 : i+5] {
					if !isHex(h) {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// scanNumber returns the index past the number at data[i], or -1.
func scanNumber(data []byte, i int) int {
	if data[i] == '-' {
		i++
	}
	digits := func() bool {
		start := i
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		return i > start
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case !digits():
		return -1
	}
	if i < len(data) && data[i] == '.' {
		i++
		if !digits() {
			return -1
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if !digits() {
			return -1
		}
	}
	return i
}

func scanLiteral(data []byte, i int, lit string) int {
	if len(data)-i < len(lit) || string(data[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
