package workspace

import (
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// Provenance (docs/spec.md §19): which of an agent's writes rest on the user's own words. The
// rules here are pure functions of texts: what a write stores once cleaned, the tokens of a text,
// the vocabulary of the user's last messages, and whether a write is grounded in it. Who wrote
// what the model read is the turn's (proxy/internal/turn classifies a request: Reading).

// Reading is what a turn's model read, classified by who wrote it (docs/spec.md §19).
type Reading struct {
	// Tainted: the model read content the user did not write (Sources), or the thread had before.
	Tainted bool
	// Sources are the untrusted contents read, by kind and tool, in the order first met.
	Sources []Source
	// Nearest is the untrusted part nearest before the write: the last one of the request (a
	// round's server-tool result moves it); nil for none.
	Nearest *Part
	// UserTexts are the user-authored texts of the last two user-authored messages, oldest first
	// (each message's texts joined by a line break).
	UserTexts []string
	// ClientTools: the request carries tools of the client's own (a thread whose earlier turns
	// did, and whose turn carries none, is tainted: the client may have dropped what it read).
	ClientTools bool
}

// Where an item of the workspace came from (Preference.Source, Objective.Source; docs/spec.md
// §19), highest first: an agent write never raises an item's source.
const (
	SourceUser        = "user"        // written or edited by the user path
	SourceConfirmed   = "confirmed"   // a proposal the user applied, or an agent's item the user locked
	SourceAgent       = "agent"       // an agent write of a turn that was not tainted, or grounded
	SourceUnconfirmed = "unconfirmed" // applied under untrusted_writes apply, from a tainted, ungrounded write
)

// sourceRank orders sources, highest first; "" (a state stored before sources) counts as agent.
func sourceRank(s string) int {
	switch s {
	case SourceUser:
		return 3
	case SourceConfirmed:
		return 2
	case SourceUnconfirmed:
		return 0
	}
	return 1
}

// LowerSource is the source an agent write of source by leaves an item of source was: the lower
// of the two (docs/spec.md §19: never raised).
func LowerSource(was, by string) string {
	if was == "" || sourceRank(by) < sourceRank(was) {
		return by
	}
	return was
}

// UsersOwn reports whether an item of source is the user's own (written or confirmed by the
// user): a tainted turn's change of it is never grounded.
func UsersOwn(source string) bool { return source == SourceUser || source == SourceConfirmed }

// Confirmed is the source of an item the user locks: an agent's or unconfirmed one becomes
// confirmed, the user's stays the user's.
func Confirmed(source string) string {
	if source == SourceUser {
		return source
	}
	return SourceConfirmed
}

// WriteContext is what an agent write's events carry (docs/spec.md §19, events.context): whether
// its turn was tainted, whether the write was grounded in the user's words (in a turn that was
// not tainted too, where it applied either way), the tokens that failed, the rule it failed first
// (tools' Rule… names; absent when grounded), the untrusted part nearest before it, and the
// untrusted contents its turn read by kind and tool.
type WriteContext struct {
	Tainted    bool     `json:"tainted"`
	Grounded   bool     `json:"grounded"`
	Ungrounded []string `json:"ungrounded"`
	Rule       string   `json:"rule,omitempty"`
	Nearest    *Part    `json:"nearest"`
	Sources    []Source `json:"sources"`
}

// Context is the context of a write of the turn that read r: grounded (rule ""), or not by rule
// for the tokens of ungrounded.
func (r *Reading) Context(rule string, ungrounded []string) WriteContext {
	c := WriteContext{Tainted: r.Tainted, Grounded: rule == "", Ungrounded: ungrounded, Rule: rule, Nearest: r.Nearest, Sources: r.Sources}
	if c.Ungrounded == nil {
		c.Ungrounded = []string{}
	}
	if c.Sources == nil {
		c.Sources = []Source{}
	}
	return c
}

// JSON is the context as events store it.
func (c WriteContext) JSON() []byte {
	b, _ := json.Marshal(c)
	return b
}

// Kinds of untrusted content (Source.Type, Part.Type).
const (
	SourceToolResult  = "tool_result"
	SourceServerTool  = "server_tool"
	SourceFile        = "file"
	SourceImage       = "image"
	SourceClientText  = "client_text"
	SourceSystem      = "system"
	SourceServerHeld  = "server_held"
	SourceMCP         = "mcp"
	SourceEarlierTurn = "earlier_turn"
)

// Source counts the untrusted contents of one kind, and tool, a turn read.
type Source struct {
	Type  string `json:"type"`
	Tool  string `json:"tool,omitempty"`
	Count int    `json:"count"`
}

// Part is one untrusted content: its kind, the tool whose result it is, the call it answers.
type Part struct {
	Type   string `json:"type"`
	Tool   string `json:"tool,omitempty"`
	CallID string `json:"call_id,omitempty"`
}

// Read adds an untrusted part to r: it taints the turn, counts in Sources, and is the nearest.
func (r *Reading) Read(p Part) {
	r.Tainted = true
	r.Nearest = &p
	for i := range r.Sources {
		if r.Sources[i].Type == p.Type && r.Sources[i].Tool == p.Tool {
			r.Sources[i].Count++
			return
		}
	}
	r.Sources = append(r.Sources, Source{Type: p.Type, Tool: p.Tool, Count: 1})
}

// Vocabulary is the tokens of the user's last two messages (Reading.UserTexts), outside fenced
// code blocks and quoted ("> ") lines.
func (r *Reading) Vocabulary() map[string]bool {
	v := map[string]bool{}
	for _, t := range r.UserTexts {
		for _, tok := range Tokens(spoken(t)) {
			v[tok] = true
		}
	}
	return v
}

// LastWords is the words of the user's last message (the last of UserTexts), outside fenced
// code and quotes; and the #N it names.
func (r *Reading) LastWords() (words map[string]bool, refs map[int]bool) {
	words, refs = map[string]bool{}, map[int]bool{}
	if len(r.UserTexts) == 0 {
		return words, refs
	}
	last := spoken(r.UserTexts[len(r.UserTexts)-1])
	for _, tok := range Tokens(last) {
		words[tok] = true
	}
	for _, m := range itemRef.FindAllStringSubmatch(last, -1) {
		if n, err := strconv.Atoi(m[1]); err == nil {
			refs[n] = true
		}
	}
	return words, refs
}

var itemRef = regexp.MustCompile(`#(\d{1,6})\b`)

// spoken is text without its fenced code blocks and its quoted lines: what the user said, not
// what they pasted to show.
func spoken(text string) string {
	var b strings.Builder
	fenced := false
	for line := range strings.Lines(text) {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fenced = !fenced
			continue
		case fenced, strings.HasPrefix(trimmed, ">"):
			continue
		}
		b.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Clean is the text an agent write stores (docs/spec.md §19): NFKC-normalised, then without its
// default-ignorable, control (a line break becomes a space), private-use, surrogate and
// unassigned code points. What is checked, stored, rendered and shown is the cleaned text.
func Clean(s string) string {
	s = norm.NFKC.String(s)
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\r' || r == '\u2028' || r == '\u2029' || r == '\u0085':
			return ' '
		case unicode.Is(unicode.Cc, r), unicode.Is(unicode.Co, r), unicode.Is(unicode.Cs, r), ignorable(r), unassigned(r):
			return -1
		}
		return r
	}, s)
}

// ignorable reports a Default_Ignorable_Code_Point: format characters (zero-width joiners and
// spaces, bidi controls, tags, the soft hyphen), variation selectors, and the others Unicode
// names (Hangul fillers, the combining grapheme joiner …).
func ignorable(r rune) bool {
	return unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Variation_Selector, r) || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) ||
		r == '\u034f' || r == '\u115f' || r == '\u1160' || r == '\u3164' || r == '\uffa0'
}

// unassigned reports a code point of no general category (Cn).
func unassigned(r rune) bool {
	return !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs)
}

// blockSyntax is what a stored text must not hold, case-insensitively: what the block writes
// around an item, which a forged value could use to pass for another item or a lock.
var blockSyntax = regexp.MustCompile(`(?i)\(locked\)|\(unconfirmed\)|\[hard\]|\[soft\]|\(the user's;|<workspace|</workspace|#\d+ \[`)

// BlockSyntax is the first piece of the block's own syntax a cleaned text holds; "" for none.
func BlockSyntax(s string) string {
	return blockSyntax.FindString(s)
}

// glue are the words a grounded write may add that no user message needs to hold.
var glue = map[string]bool{"a": true, "an": true, "the": true, "to": true, "of": true, "in": true, "on": true, "at": true,
	"by": true, "for": true, "with": true, "and": true, "use": true, "as": true}

// joiners join words into a compound (a host, a path, an address), matched whole.
const joiners = "./:@\\="

// Tokens are the tokens of text, cleaned and case-folded (docs/spec.md §19): words (maximal runs
// of letters, marks and digits) and compounds (words joined by single joiners), each compound
// one token and its words not tokens of their own; in scripts written without spaces, each pair
// of adjacent characters (a lone character alone).
func Tokens(text string) []string {
	text = strings.ToLower(Clean(text))
	var out []string
	runes := []rune(text)
	for i := 0; i < len(runes); {
		if !wordRune(runes[i]) {
			i++
			continue
		}
		if unspaced(runes[i]) {
			j := i
			for j < len(runes) && unspaced(runes[j]) {
				j++
			}
			if j-i == 1 {
				out = append(out, string(runes[i]))
			}
			for k := i; k+1 < j; k++ {
				out = append(out, string(runes[k:k+2]))
			}
			i = j
			continue
		}
		// A word, and the words a single joiner chains to it.
		j := i
		for {
			for j < len(runes) && wordRune(runes[j]) && !unspaced(runes[j]) {
				j++
			}
			if j+1 < len(runes) && strings.ContainsRune(joiners, runes[j]) && wordRune(runes[j+1]) && !unspaced(runes[j+1]) {
				j++
				continue
			}
			break
		}
		out = append(out, string(runes[i:j]))
		i = j
	}
	return out
}

func wordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) || unicode.IsNumber(r)
}

// unspaced reports the scripts written without spaces between words (with the marks of common
// script they write inside words: the prolonged sound mark, the iteration marks).
func unspaced(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Thai, unicode.Lao, unicode.Khmer, unicode.Myanmar) ||
		r == '\u30fc' || r == '\u3005' || r == '\u303b'
}

// Ungrounded are the non-glue tokens of text that vocabulary lacks, in order, each once; and
// whether text has any non-glue token at all.
func Ungrounded(text string, vocabulary map[string]bool) (missing []string, any bool) {
	for _, t := range Tokens(text) {
		if glue[t] {
			continue
		}
		any = true
		if !vocabulary[t] && !slices.Contains(missing, t) {
			missing = append(missing, t)
		}
	}
	return missing, any
}

// GroundedText is the grounding of an add or an objective (docs/spec.md §19): every non-glue
// token it writes is in the vocabulary, and it has one; missing are those that are not (when it
// has none, the text itself, quoted).
func GroundedText(text string, vocabulary map[string]bool) (missing []string, ok bool) {
	missing, any := Ungrounded(text, vocabulary)
	if !any {
		return []string{strconv.Quote(text)}, false
	}
	return missing, len(missing) == 0
}

// GroundedEdit is the grounding of an update of a field from before to after: every non-glue
// token it adds or deletes is in the vocabulary (a field left as it was adds and deletes none).
func GroundedEdit(before, after string, vocabulary map[string]bool) (missing []string, ok bool) {
	if before == after {
		return nil, true
	}
	was, now := counts(before), counts(after)
	for t, n := range now {
		if n > was[t] && !glue[t] && !vocabulary[t] {
			missing = append(missing, t)
		}
	}
	for t, n := range was {
		if n > now[t] && !glue[t] && !vocabulary[t] && !slices.Contains(missing, t) {
			missing = append(missing, t)
		}
	}
	slices.Sort(missing)
	return missing, len(missing) == 0
}

func counts(text string) map[string]int {
	m := map[string]int{}
	for _, t := range Tokens(text) {
		m[t]++
	}
	return m
}

// GroundedNaming is whether the user's last message names an item (a removal, a change of
// kind): every non-glue word of its title is among words, or refs holds the #N it was shown as.
func GroundedNaming(title string, shownAs int, words map[string]bool, refs map[int]bool) (missing []string, ok bool) {
	if shownAs > 0 && refs[shownAs] {
		return nil, true
	}
	missing, any := Ungrounded(title, words)
	if !any {
		return []string{strconv.Quote(title)}, false
	}
	return missing, len(missing) == 0
}
