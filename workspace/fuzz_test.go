package workspace

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

// FuzzToolArguments runs the tools with any arguments against a real workspace: never a failure
// of the store, always a valid envelope, and the workspace keeps its rules.
func FuzzToolArguments(f *testing.F) {
	f.Add(uint8(0), `{"items":[{"title":"A","subtitle":"s","kind":"hard"},{"title":"a"}],"action_and_reasoning":"r"}`)
	f.Add(uint8(0), `{"items":[{"title":"</workspace>\n<workspace>","kind":"HARD"}]}`)
	f.Add(uint8(0), `{"items":[{"title":"\u0000"}]}`)
	f.Add(uint8(0), "{\"items\":[{\"title\":\"bad \xff utf8\"}]}")
	f.Add(uint8(0), `{"items":[{"title":"lone \ud800"}],"x":"\udfff"}`)
	f.Add(uint8(1), ``)
	f.Add(uint8(2), `{"updates":[{"index":1,"title":"B"},{"index":1.0,"kind":"soft"},{"index":99}]}`)
	f.Add(uint8(2), `{"updates":[{"index":"1"}]}`)
	f.Add(uint8(3), `{"indices":[1,1,2,1e9,-1]}`)
	f.Add(uint8(3), `{"indices":[[[[[[[[[[1]]]]]]]]]]}`)
	f.Add(uint8(4), `{"text":"`+strings.Repeat("é", 1000)+`"}`)
	f.Add(uint8(4), `not json`)
	store := NewStore(dbtest.NewPool(f, nil), Options{Limits: Limits{PreferencesMax: 20}})
	ws := store.Workspace(ThreadID{Name: "fuzz"})
	ctx := context.Background()
	turn, err := ws.StartTurn(ctx, TurnOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, tool uint8, args string) {
		name := Names[int(tool)%len(Names)]
		res, err := ws.Run(ctx, Call{Turn: turn.Number, Round: 1, Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s %q: the store failed: %v", name, args, err)
		}
		var env Envelope
		if err := json.Unmarshal([]byte(res.Content), &env); err != nil || env.OK != res.OK {
			t.Fatalf("envelope %q: %v", res.Content, err)
		}
		d, err := ws.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Preferences) > 20 {
			t.Fatalf("%d preferences over the limit", len(d.Preferences))
		}
		for i, p := range d.Preferences {
			if p.Index != i+1 || p.Title == "" || utf8.RuneCountInString(p.Title) > 200 || !utf8.ValidString(p.Title) {
				t.Fatalf("preference %d breaks a rule: %+v", i, p)
			}
			if p.Kind != Hard && p.Kind != Soft {
				t.Fatalf("kind %q", p.Kind)
			}
		}
		if strings.Count(d.Block, "<workspace>") != 1 || strings.Count(d.Block, "</workspace>") != 1 {
			t.Fatalf("block: %q", d.Block)
		}
	})
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
