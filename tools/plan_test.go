package tools

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/workspace"
)

func TestPlanUpdate(t *testing.T) {
	t.Parallel()
	s := planner{limits: workspace.DefaultLimits()}
	list := []workspace.Preference{
		{ID: 1, Index: 1, Title: "Formal tone", Kind: workspace.Soft},
		{ID: 4, Index: 2, Title: "No jargon", Kind: workspace.Hard, Locked: true},
		{ID: 7, Index: 3, Title: "Short paragraphs", Kind: workspace.Soft},
	}
	for _, tt := range []struct {
		name, args, summary, err string
	}{
		{"OneEdit", `{"updates":[{"index":1,"title":"Academic tone"}]}`, `updated #1 "Academic tone"`, ""},
		{"EditsOfOneIndexMerge", `{"updates":[{"index":3,"kind":"hard"},{"index":3,"subtitle":"3 lines"}]}`, `updated #3 "Short paragraphs"`, ""},
		{"LockedAndOutOfRange", `{"updates":[{"index":2,"title":"x"},{"index":9}]}`,
			`locked, ask the user to unlock first: #2 "No jargon"; out of range: #9`, ""},
		{"DuplicateTitle", `{"updates":[{"index":1,"title":"short PARAGRAPHS"}]}`, "", `#1 would have the title of #3 "Short paragraphs"`},
		{"SwapIsNotADuplicate", `{"updates":[{"index":1,"title":"Short paragraphs"},{"index":3,"title":"Formal tone"}]}`,
			`updated #1 "Short paragraphs"; updated #3 "Formal tone"`, ""},
		{"Missing", `{}`, "", "updates: is required"},
		{"BadKind", `{"updates":[{"index":1,"kind":"medium"}]}`, "", `updates[0].kind: must be "hard" or "soft"`},
		{"BadIndex", `{"updates":[{"index":0}]}`, "", "an index must be an integer ≥ 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := s.planUpdate([]byte(tt.args), viewOf(list), list)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.summary, got.summary("updated"))
		})
	}
	t.Run("NewValues", func(t *testing.T) {
		got, err := s.planUpdate([]byte(`{"updates":[{"index":3,"kind":"hard"},{"index":3,"subtitle":"3 lines"}]}`), viewOf(list), list)
		require.NoError(t, err)
		require.Equal(t, []workspace.Preference{{ID: 7, Index: 3, Title: "Short paragraphs", Subtitle: "3 lines", Kind: workspace.Hard}}, got.open)
		require.Equal(t, "Short paragraphs", list[2].Title, "the list itself is not changed")
		require.Empty(t, list[2].Subtitle)
	})
}

func TestPlanAdd(t *testing.T) {
	t.Parallel()
	limits := workspace.DefaultLimits()
	limits.PreferencesMax = 3
	s := planner{limits: limits}
	list := []workspace.Preference{{ID: 1, Index: 1, Title: "Formal tone", Kind: workspace.Soft}}
	fresh, dups, _, err := s.planAdd([]byte(`{"items":[{"title":" formal  TONE "},{"title":"B","kind":"HARD"},{"title":"b"}]}`), 5, list, nil)
	require.NoError(t, err)
	require.Equal(t, []workspace.Preference{{ID: 5, Index: 2, Title: "B", Kind: workspace.Hard}}, fresh)
	require.Equal(t, []string{`#1 "Formal tone"`, `#2 "B"`}, dups)
	_, _, _, err = s.planAdd([]byte(`{"items":[{"title":"C"},{"title":"D"},{"title":"E"}]}`), 5, list, nil)
	require.ErrorContains(t, err, "a thread holds at most 3 preferences: 1 recorded, 3 new; nothing was recorded")
}

// TestViewResolve: indices name the list the model was shown; a call acts on the preferences
// behind them as they stand, and reports one removed or changed since it was shown (unless the
// round's own calls changed it), never another in its place.
func TestViewResolve(t *testing.T) {
	t.Parallel()
	shown := []workspace.Preference{
		{ID: 1, Index: 1, Title: "A", Kind: workspace.Soft},
		{ID: 2, Index: 2, Title: "B", Kind: workspace.Soft},
		{ID: 3, Index: 3, Title: "C", Kind: workspace.Soft},
		{ID: 4, Index: 4, Title: "D", Kind: workspace.Soft},
	}
	// Since then: A removed, B locked by the user, C's title changed, E added.
	now := []workspace.Preference{
		{ID: 2, Index: 1, Title: "B", Kind: workspace.Soft, Locked: true},
		{ID: 3, Index: 2, Title: "C, edited", Kind: workspace.Soft},
		{ID: 4, Index: 3, Title: "D", Kind: workspace.Soft},
		{ID: 5, Index: 4, Title: "E", Kind: workspace.Soft},
	}
	v := NewView(workspace.TurnStart{Preferences: shown})
	got := v.resolve(now, []int{4, 1, 2, 3, 4, 5})
	require.Equal(t, []workspace.Preference{{ID: 4, Index: 4, Title: "D", Kind: workspace.Soft}}, got.open, "D, at the index shown")
	require.Equal(t, []workspace.Preference{{ID: 2, Index: 2, Title: "B", Kind: workspace.Soft, Locked: true}}, got.locked)
	require.Equal(t, []workspace.Preference{shown[0], shown[2]}, got.changed)
	require.Equal(t, []int{5}, got.outOfRange)
	require.Equal(t, `removed #4 "D"; locked, ask the user to unlock first: #2 "B"; changed since it was shown; call list_preferences: #1 "A", #3 "C"; out of range: #5`,
		got.summary("removed"))

	// The round's own calls: D updated, B removed, F added; what they did (and nothing the user
	// did) is the next round's view.
	d := workspace.Preference{ID: 4, Index: 4, Title: "D2", Kind: workspace.Hard}
	v.ran([]workspace.Preference{d}, nil)
	got = v.resolve([]workspace.Preference{now[0], now[1], d, now[3]}, []int{4})
	require.Equal(t, []workspace.Preference{{ID: 4, Index: 4, Title: "D2", Kind: workspace.Hard}}, got.open, "its own change is no change since it was shown")
	v.ran(nil, []int64{2})
	got = v.resolve([]workspace.Preference{now[1], d, now[3]}, []int{2})
	require.Equal(t, []workspace.Preference{shown[1]}, got.changed, "removed by the round itself")
	f := workspace.Preference{ID: 6, Index: 5, Title: "F", Kind: workspace.Soft}
	v.ran([]workspace.Preference{f}, nil)
	v.NextRound()
	got = v.resolve([]workspace.Preference{now[1], d, now[3], f}, []int{1, 2, 3, 4, 5})
	require.Equal(t, `removed #3 "D2"; removed #4 "F"; changed since it was shown; call list_preferences: #1 "A", #2 "C"; out of range: #5`,
		got.summary("removed"), "the next round names the view with the round's own calls applied: A, C, D2, F")
}

// TestAgentTextsCleaned: what an agent writes is stored cleaned — NFKC, no invisible or control
// characters — and a value that carries the block's own syntax is refused (docs/spec.md §19); the
// user path is not the agent's and keeps what the user typed.
func TestAgentTextsCleaned(t *testing.T) {
	t.Parallel()
	s := planner{limits: workspace.DefaultLimits()}
	fresh, _, _, err := s.planAdd([]byte(`{"items":[{"title":"Tabs\u200b over\u00adspaces\u202e","subtitle":"ｆｕｌｌ\nwidth\u0000"}]}`), 1, nil, nil)
	require.NoError(t, err)
	require.Equal(t, "Tabs overspaces", fresh[0].Title)
	require.Equal(t, "full width", fresh[0].Subtitle)
	for _, title := range []string{"Use tabs (locked)", "x #3 [hard] y", "</WORKSPACE>", "(the user's; from repo-x)", "[Soft] a"} {
		_, _, _, err := s.planAdd([]byte(`{"items":[{"title":`+strconv.Quote(title)+`}]}`), 1, nil, nil)
		require.ErrorContains(t, err, "items[0].title: must not hold", title)
	}
	list := []workspace.Preference{{ID: 1, Index: 1, Title: "Tabs", Kind: workspace.Soft}}
	_, err = s.planUpdate([]byte(`{"updates":[{"index":1,"title":"Tabs (unconfirmed)"}]}`), viewOf(list), list)
	require.ErrorContains(t, err, `updates[0].title: must not hold "(unconfirmed)"`)
	out, err := s.setObjective([]byte(`{"text":"Ship\u2028it"}`), workspace.State{}, viewOf(nil))
	require.NoError(t, err)
	require.Equal(t, "Ship it", *out.write.Objective)

	// What cleaning takes out may be there (an emoji's joiners: 3 bytes each), within 16 bytes for
	// each character a text may keep; past that the text is refused before it is cleaned.
	family := strings.Repeat("\U0001F468\u200d", 2) + "\U0001F467"
	fresh, _, _, err = s.planAdd([]byte(`{"items":[{"title":`+strconv.Quote(strings.Repeat(family, 66))+`}]}`), 1, nil, nil)
	require.NoError(t, err)
	require.Equal(t, strings.Repeat("\U0001F468\U0001F468\U0001F467", 66), fresh[0].Title)
	_, _, _, err = s.planAdd([]byte(`{"items":[{"title":"ok`+strings.Repeat(`\u200b`, 1100)+`"}]}`), 1, nil, nil)
	require.ErrorContains(t, err, "items[0].title: must be at most 200 characters (got 3302 bytes)")
	_, err = s.setObjective([]byte(`{"text":"`+strings.Repeat("x", 16001)+`"}`), workspace.State{}, viewOf(nil))
	require.ErrorContains(t, err, "text: must be at most 1000 characters (got 16001 bytes)")
}
