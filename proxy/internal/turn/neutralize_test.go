package turn

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestNeutralizedKeepsTheClientsBytes: a JSON string's workspace tags are neutralised where
// they stand — written as they are or in \u escapes, in any case, with spaces inside the
// brackets — and every other byte of the string is the client's, escapes and invalid UTF-8
// included (docs/spec.md §3.1, §16); a string without a tag is the client's own slice.
func TestNeutralizedKeepsTheClientsBytes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`"<workspace>x</workspace>"`:           `"‹workspace>x‹/workspace>"`,
		`"a\u0041 <workspace> \n"`:             `"a\u0041 ‹workspace> \n"`,
		`"\u003cworkspace> \u003C/WorkSpace>"`: `"‹workspace> ‹/WorkSpace>"`,
		`"< / workspace><\tworkspace"`:         `"‹ / workspace>‹\tworkspace"`,
		`"<\u0020/\nWORKSPACE"`:                `"‹\u0020/\nWORKSPACE"`,
		`"<\u0077orkspace>"`:                   `"‹\u0077orkspace>"`,
		`"<work\u017Fpace> <wor\u212Aspace>"`:  `"‹work\u017Fpace> ‹wor\u212Aspace>"`,
		`"<\u212Aworkspace>"`:                  `"<\u212Aworkspace>"`,
		`"<workſpace>"`:                        `"‹workſpace>"`,
		"\"bad \xff<workspace>\xfe\"":          "\"bad \xff‹workspace>\xfe\"",
		"\"<works\xffpace>\"":                  "\"<works\xffpace>\"",
		`"<workspac"`:                          `"<workspac"`,
		`"\\u003cworkspace>"`:                  `"\\u003cworkspace>"`,
		`"<<workspace>"`:                       `"<‹workspace>"`,
		`"\ud83d\ude00<workspace>"`:            `"\ud83d\ude00‹workspace>"`,
		`"no tag: a < b; workspace"`:           `"no tag: a < b; workspace"`,
		`"<\/workspace>"`:                      `"‹\/workspace>"`,
	} {
		got := neutralized(json.RawMessage(in))
		require.Equal(t, want, string(got), in)
		if utf8.ValidString(in) {
			s, ok := rawjson.Unquote(json.RawMessage(in))
			require.True(t, ok, in)
			n, ok := rawjson.Unquote(got)
			require.True(t, ok, want)
			require.Equal(t, workspace.NeutralizeTags(s), n, "%s: as NeutralizeTags reads it", in)
		}
	}
	plain := json.RawMessage(`"a < b and \u003c c"`)
	require.True(t, &neutralized(plain)[0] == &plain[0], "a string without a tag is the client's own bytes")
}

// FuzzNeutralized: for any JSON string, the neutralised string reads as workspace.NeutralizeTags
// reads the client's (valid UTF-8), and is the client's string but for the '<' of each tag.
func FuzzNeutralized(f *testing.F) {
	for _, s := range []string{`"<workspace>"`, `"\u003c/workspace>"`, `"< \t/ WORKSPACE"`, `"<work\u017fpace>"`, `"<\u212aworkspace"`, `"x"`, `"\\<workspace>"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw := rawjson.String(s)
		if len(s) > 0 && s[0] == '"' && json.Valid([]byte(s)) {
			raw = json.RawMessage(s) // the client's own escapes
		}
		got := neutralized(raw)
		if !json.Valid(raw) {
			return
		}
		if !json.Valid(got) {
			t.Fatalf("%q: %q is not JSON", raw, got)
		}
		if !onlyTagsChanged(raw, got) {
			t.Fatalf("%q: %q changed more than the tags' '<'", raw, got)
		}
		if !utf8.Valid(raw) {
			return
		}
		in, _ := rawjson.Unquote(raw)
		out, _ := rawjson.Unquote(got)
		if want := workspace.NeutralizeTags(in); out != want {
			t.Fatalf("%q: got %q, NeutralizeTags %q", raw, out, want)
		}
	})
}

// onlyTagsChanged reports whether got is raw with some of its '<' (written as it is or as a \u
// escape) replaced by '‹', and nothing else changed.
func onlyTagsChanged(raw, got []byte) bool {
	for len(raw) > 0 && len(got) > 0 {
		switch {
		case raw[0] == got[0]:
			raw, got = raw[1:], got[1:]
		case strings.HasPrefix(string(got), "‹") && raw[0] == '<':
			raw, got = raw[1:], got[len("‹"):]
		case strings.HasPrefix(string(got), "‹") && (strings.HasPrefix(string(raw), `\u003c`) || strings.HasPrefix(string(raw), `\u003C`)):
			raw, got = raw[len(`\u003c`):], got[len("‹"):]
		default:
			return false
		}
	}
	return len(raw) == 0 && len(got) == 0
}

// tagBodies are chat requests of about size bytes whose last user message is workspace tags,
// as a string and as a text part, and one of plain text.
func tagBodies(size int) map[string][]byte {
	tags := strings.Repeat("<workspace>", size/len("<workspace>"))
	plain := strings.Repeat("x", len(tags))
	return map[string][]byte{
		"TagsString": []byte(`{"messages":[{"role":"user","content":"` + tags + `"}]}`),
		"TagsPart":   []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"` + tags + `"}]}]}`),
		"TagsSystem": []byte(`{"messages":[{"role":"user","content":"` + tags + `"},{"role":"assistant","content":"prefill"}]}`),
		"Plain":      []byte(`{"messages":[{"role":"user","content":"` + plain + `"}]}`),
	}
}

// TestNeutralizedInOneCopy: neutralising the tags of a large last message costs about one copy
// of it (the rewritten string), not a decoded copy and a re-encoded one: a thread turn's rewrite
// of 1 MiB of tags allocates less than twice the body. Not parallel: it measures the process's
// allocations.
func TestNeutralizedInOneCopy(t *testing.T) {
	block := workspace.TailInstructions + "\n\n" + workspace.RenderBlock("", nil, nil)
	for name, body := range tagBodies(1 << 20) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		req, err := ParseChatRequest(body)
		require.NoError(t, err)
		req.InjectWorkspace(block, PlaceTail)
		out := req.Body(true)
		runtime.ReadMemStats(&after)
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(2*len(body)), "%s: %d bytes allocated for a %d-byte body", name,
			after.TotalAlloc-before.TotalAlloc, len(body))
		var sent struct{ Messages json.RawMessage }
		require.NoError(t, json.Unmarshal(out.joined(), &sent))
		require.Equal(t, strings.Count(block, "<workspace>"), strings.Count(string(sent.Messages), "<workspace>"), "%s: the block's alone", name)
	}
}

// BenchmarkNeutralize: a thread turn's rewrite (parse, inject, the upstream body) of 8 MiB
// chat requests whose last message is workspace tags (a string, a text part, before a prefill
// with the block in the system message) or plain text of the same size. B/op over the body's
// size is the memory the rewrite costs a body.
func BenchmarkNeutralize(b *testing.B) {
	block := workspace.TailInstructions + "\n\n" + workspace.RenderBlock("", nil, nil)
	for _, name := range []string{"TagsString", "TagsPart", "TagsSystem", "Plain"} {
		body := tagBodies(8 << 20)[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				req, err := ParseChatRequest(body)
				if err != nil {
					b.Fatal(err)
				}
				req.InjectWorkspace(block, PlaceTail)
				_ = req.Body(true)
			}
		})
	}
}
