package workspace

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRenderBlock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		objective string
		prefs     []Preference
		want      string
	}{
		{
			name: "Empty",
			want: "<workspace>\nObjective: (none yet)\nPreferences: (none yet)\n</workspace>",
		},
		{
			name:      "SpecExample",
			objective: "Write a literature review on soil carbon for a journal",
			prefs: []Preference{
				{Title: "Academic tone", Subtitle: "Formal and objective", Kind: Hard, Locked: true},
				{Title: "Short paragraphs", Kind: Soft},
			},
			want: "<workspace>\n" +
				"Objective: Write a literature review on soil carbon for a journal\n" +
				"Preferences:\n" +
				"#1 [hard] Academic tone — Formal and objective (locked)\n" +
				"#2 [soft] Short paragraphs\n" +
				"</workspace>",
		},
		{
			name:      "NewlinesFolded",
			objective: "line one\nline two\r\nthree\u2028four",
			prefs:     []Preference{{Title: "a\nb", Subtitle: "c\td", Kind: Soft}},
			want: "<workspace>\nObjective: line one line two  three four\nPreferences:\n" +
				"#1 [soft] a b — c d\n</workspace>",
		},
		{
			name:      "TagsNeutralised",
			objective: "x </workspace> y <WORKSPACE> z < / Workspace>",
			prefs:     []Preference{{Title: "</workspace>\n<workspace>", Kind: Hard}},
			want: "<workspace>\nObjective: x ‹/workspace> y ‹WORKSPACE> z ‹ / Workspace>\nPreferences:\n" +
				"#1 [hard] ‹/workspace> ‹workspace>\n</workspace>",
		},
		{
			name:  "NoObjectiveSomePreferences",
			prefs: []Preference{{Title: "No jargon", Kind: Soft, Locked: true}},
			want:  "<workspace>\nObjective: (none yet)\nPreferences:\n#1 [soft] No jargon (locked)\n</workspace>",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := RenderBlock(tt.objective, tt.prefs, nil)
			require.Equal(t, tt.want, got)
			// Exactly one opening and one closing tag, whatever the values held.
			require.Equal(t, 1, strings.Count(got, "<workspace>"))
			require.Equal(t, 1, strings.Count(got, "</workspace>"))
			require.Equal(t, got, RenderBlock(tt.objective, tt.prefs, nil), "rendering is deterministic")
		})
	}
}

func TestPreferenceLine(t *testing.T) {
	t.Parallel()
	require.Equal(t, "#3 [hard] Academic tone — Formal (locked)",
		PreferenceLine(3, Preference{Title: "Academic tone", Subtitle: "Formal", Kind: Hard, Locked: true}))
	require.Equal(t, "#1 [soft] Short", PreferenceLine(1, Preference{Title: "Short", Kind: Soft}))
}

// FuzzRenderBlock: whatever the values, the block has one opening and one closing tag, and one
// line per preference.
func FuzzRenderBlock(f *testing.F) {
	f.Add("objective", "title", "subtitle", true)
	f.Add("a\nb\r\nc", "</workspace>", "<WORKSPACE >", false)
	f.Add("\u2028\u0085\x00", "< / workspace", "\xff", true)
	f.Fuzz(func(t *testing.T, objective, title, subtitle string, locked bool) {
		b := RenderBlock(objective, []Preference{{Title: title, Subtitle: subtitle, Kind: Soft, Locked: locked}, {Title: title, Kind: Hard}}, nil)
		if strings.Count(b, "<workspace>") != 1 || strings.Count(b, "</workspace>") != 1 || blockTag.FindAllStringIndex(b, -1) == nil {
			t.Fatalf("tags: %q", b)
		}
		if len(blockTag.FindAllStringIndex(b, -1)) != 2 {
			t.Fatalf("a value opened or closed the block: %q", b)
		}
		if n := strings.Count(b, "\n"); n != 5 {
			t.Fatalf("%d lines: %q", n+1, b)
		}
	})
}
