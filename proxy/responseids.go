package proxy

import (
	"encoding/json"
)

// The ids a Responses API answer holds, read as its bytes pass on to the client (neither held
// back nor changed): the response's id and its output items' ids, from a JSON body (id,
// output[].id) or an event stream's events (response.id, response.output[].id, item.id). With
// client keys they are what the client may continue from or reference later (docs/spec.md §12).
// Reading costs constant memory whatever the answer's size: the JSON is scanned, never held.

// maxResponseIDs bounds the ids kept of one answer; maxIDBytes the length of one id.
const (
	maxResponseIDs = 4096
	maxIDBytes     = 256
)

// idPaths are where ids stand, as member names from the top of a JSON value ("" for an array's
// element).
var idPaths = [][]string{
	{"id"}, {"output", "", "id"},
	{"response", "id"}, {"response", "output", "", "id"}, {"item", "id"},
	{"type"}, // an event's type (typePath): not an id
}

// typePath is the index in idPaths of an event's type.
const typePath = 5

// terminalEvents are the types of the events that end a Responses stream (docs/spec.md §12).
var terminalEvents = map[string]bool{"response.completed": true, "response.failed": true, "response.incomplete": true, "error": true}

// responseIDs collects the ids of an answer written to it: a JSON body, or an event stream
// (sse) whose data lines it reads as JSON, event by event.
type responseIDs struct {
	sse  bool
	scan idScanner
	seen map[string]bool
	ids  []string
	// typ is the type of the stream's event being read; ended: the answer's end was read (the
	// JSON body's value, or a stream's terminal event).
	typ   string
	ended bool

	// The stream's line: its field name so far (before a colon), whether it is a data line
	// being read, and whether the last byte ended a line with CR (CRLF ends one line).
	field   []byte
	inData  bool
	inField bool
	skipSP  bool
	afterCR bool
	blank   bool // nothing on the line yet
}

func newResponseIDs(sse bool) *responseIDs {
	x := &responseIDs{sse: sse, seen: map[string]bool{}, blank: true, inField: true}
	x.scan.found = x.add
	return x
}

func (x *responseIDs) add(path int, id string) {
	if path == typePath {
		x.typ = id
		return
	}
	if !x.seen[id] && len(x.ids) < maxResponseIDs {
		x.seen[id] = true
		x.ids = append(x.ids, id)
	}
}

// Write reads p as the next bytes of the answer.
func (x *responseIDs) Write(p []byte) (int, error) {
	if !x.sse {
		x.scan.write(p)
		x.ended = x.scan.done
		return len(p), nil
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '\n' && x.afterCR {
			x.afterCR = false
			continue
		}
		x.afterCR = c == '\r'
		if c == '\n' || c == '\r' {
			if x.blank { // a blank line ends an event
				x.ended = x.ended || terminalEvents[x.typ]
				x.scan.reset()
				x.typ = ""
			} else if x.inData {
				x.scan.write(newline) // data lines join with a newline
			}
			x.field, x.inData, x.inField, x.skipSP, x.blank = x.field[:0], false, true, false, true
			continue
		}
		x.blank = false
		switch {
		case x.inField && c == ':':
			x.inField = false
			x.inData, x.skipSP = string(x.field) == "data", true
		case x.inField:
			if len(x.field) < 8 {
				x.field = append(x.field, c)
			} else {
				x.field = append(x.field[:0], '?') // no field of interest is that long
			}
		case x.inData:
			if x.skipSP && c == ' ' {
				x.skipSP = false
				continue
			}
			x.skipSP = false
			j := i
			for j < len(p) && p[j] != '\n' && p[j] != '\r' {
				j++
			}
			x.scan.write(p[i:j])
			i = j - 1
		}
	}
	return len(p), nil
}

// idScanner scans one JSON value for the strings at idPaths, calling found with each (and the
// index of its path). It reads well-formed JSON; what is not (the upstream's to answer for) at
// worst yields no id.
type idScanner struct {
	found func(int, string)
	stack []frame
	state scanState
	str   []byte // the string being read: a member name, or a value at an id path (raw, escapes kept)
	keep  bool   // the string is kept (a member name, or a value at an id path)
	path  int    // the index in idPaths of a value kept
	long  bool   // it outgrew maxIDBytes
	esc   bool   // after a backslash in a string
	done  bool   // the top-level value ended
}

// frame is an open object (name: the member being read) or array.
type frame struct {
	object bool
	name   string
}

type scanState uint8

const (
	scanValue     scanState = iota // a value is due
	scanNameOrEnd                  // in an object: a member name, or its end
	scanName                       // in a member name
	scanColon                      // after a member name
	scanString                     // in a string value
	scanLiteral                    // in a number, true, false or null
	scanAfter                      // after a value: a comma, or the end of its container
)

func (s *idScanner) reset() {
	found := s.found
	*s = idScanner{found: found, stack: s.stack[:0], str: s.str[:0]}
}

// atIDPath is the index in idPaths of the path a string value here stands at, -1 for none.
func (s *idScanner) atIDPath() int {
	for p, path := range idPaths {
		if len(path) != len(s.stack) {
			continue
		}
		match := true
		for i, f := range s.stack {
			if (f.object && f.name != path[i]) || (!f.object && path[i] != "") {
				match = false
				break
			}
		}
		if match {
			return p
		}
	}
	return -1
}

func (s *idScanner) write(p []byte) {
	for i := 0; i < len(p) && !s.done; i++ {
		c := p[i]
		switch s.state {
		case scanString, scanName:
			if !s.esc && c == '"' {
				s.endString()
				continue
			}
			s.esc = !s.esc && c == '\\'
			if s.keep && !s.long {
				if len(s.str) < maxIDBytes {
					s.str = append(s.str, c)
				} else {
					s.long = true
				}
			}
		case scanLiteral:
			if c == ',' || c == '}' || c == ']' || isSpace(c) {
				s.state = scanAfter
				i-- // the byte ends the literal and is read again
			}
		case scanValue:
			switch {
			case isSpace(c):
			case c == '{':
				s.stack = append(s.stack, frame{object: true})
				s.state = scanNameOrEnd
			case c == '[':
				s.stack = append(s.stack, frame{})
				s.state = scanValue
			case c == ']' && len(s.stack) > 0 && !s.stack[len(s.stack)-1].object: // an empty array
				s.pop()
			case c == '"':
				s.path = s.atIDPath()
				s.startString(scanString, s.path >= 0)
			default:
				s.state = scanLiteral
			}
		case scanNameOrEnd:
			switch {
			case isSpace(c):
			case c == '"':
				s.startString(scanName, true)
			case c == '}':
				s.pop()
			}
		case scanColon:
			if c == ':' {
				s.state = scanValue
			}
		case scanAfter:
			switch {
			case isSpace(c):
			case c == ',' && len(s.stack) > 0 && s.stack[len(s.stack)-1].object:
				s.state = scanNameOrEnd
			case c == ',':
				s.state = scanValue
			case c == '}' || c == ']':
				s.pop()
			}
		}
	}
}

func (s *idScanner) startString(state scanState, keep bool) {
	s.state, s.keep, s.long, s.esc, s.str = state, keep, false, false, s.str[:0]
}

func (s *idScanner) endString() {
	switch s.state {
	case scanName:
		if len(s.stack) > 0 {
			s.stack[len(s.stack)-1].name = s.text()
		}
		s.state = scanColon
	case scanString:
		if s.keep && !s.long {
			if id := s.text(); id != "" {
				s.found(s.path, id)
			}
		}
		s.state = scanAfter
		s.endValue()
	}
}

// text is the string read (its escapes decoded), "" when it outgrew maxIDBytes.
func (s *idScanner) text() string {
	if s.long {
		return ""
	}
	for _, c := range s.str {
		if c == '\\' {
			var v string
			if json.Unmarshal(append(append([]byte{'"'}, s.str...), '"'), &v) != nil {
				return ""
			}
			return v
		}
	}
	return string(s.str)
}

// pop closes the innermost container: a value ended.
func (s *idScanner) pop() {
	if len(s.stack) > 0 {
		s.stack = s.stack[:len(s.stack)-1]
	}
	s.state = scanAfter
	s.endValue()
}

// endValue notes that a value ended: the top-level one ends the scan.
func (s *idScanner) endValue() {
	if len(s.stack) == 0 {
		s.done = true
	}
}

var newline = []byte{'\n'}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
