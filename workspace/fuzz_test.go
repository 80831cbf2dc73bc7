package workspace_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
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
		name := tools.Names[int(tool)%len(tools.Names)]
		res, err := tools.Run(ctx, ws, tools.Call{Turn: turn.Number, Round: 1, Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s %q: the store failed: %v", name, args, err)
		}
		var env tools.Envelope
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
