package workspace_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

type fixture struct {
	pool  *pgxpool.Pool
	store *Store
	ws    *Workspace
	turn  TurnStart
}

// setup gives a test a store on a fresh schema and a thread whose first turn has started.
func setup(t *testing.T) *fixture {
	t.Helper()
	pool := dbtest.NewPool(t, nil)
	return setupOn(t, pool, Options{})
}

func setupOn(t *testing.T, pool *pgxpool.Pool, opts Options) *fixture {
	t.Helper()
	store := NewStore(pool, opts)
	ws := store.Workspace(ThreadID{Name: "t1"})
	turn, err := ws.StartTurn(context.Background(), TurnOptions{})
	require.NoError(t, err)
	return &fixture{pool: pool, store: store, ws: ws, turn: turn}
}

// call runs a tool and decodes its envelope.
func (f *fixture) call(t *testing.T, name string, args any) (tools.Envelope, tools.Result) {
	t.Helper()
	raw, ok := args.(string)
	if !ok {
		b, err := json.Marshal(args)
		require.NoError(t, err)
		raw = string(b)
	}
	res, err := tools.Run(context.Background(), f.ws, tools.Call{Turn: f.turn.Number, Round: 1, Name: name, Arguments: raw})
	require.NoError(t, err)
	var env tools.Envelope
	require.NoError(t, json.Unmarshal([]byte(res.Content), &env), res.Content)
	require.Equal(t, env.OK, res.OK)
	return env, res
}

// ok runs a tool that must succeed and returns its result text.
func (f *fixture) ok(t *testing.T, name string, args any) string {
	t.Helper()
	env, _ := f.call(t, name, args)
	require.True(t, env.OK, "error: %s", env.Error)
	return env.Result
}

func (f *fixture) fails(t *testing.T, name string, args any) string {
	t.Helper()
	env, _ := f.call(t, name, args)
	require.False(t, env.OK, "result: %s", env.Result)
	require.Empty(t, env.Result)
	return env.Error
}

func (f *fixture) list(t *testing.T) []Preference {
	t.Helper()
	d, err := f.ws.Get(context.Background())
	require.NoError(t, err)
	return d.Preferences
}

func (f *fixture) titles(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, p := range f.list(t) {
		out = append(out, p.Title)
	}
	return out
}

type item struct {
	Title    string `json:"title"`
	Subtitle string `json:"subtitle,omitempty"`
	Kind     string `json:"kind,omitempty"`
}

func add(items ...item) map[string]any {
	return map[string]any{"items": items, "action_and_reasoning": "The user stated preferences."}
}

func (f *fixture) lock(t *testing.T, index int) {
	t.Helper()
	p := f.list(t)[index-1]
	locked := true
	_, err := f.ws.UpdatePreference(context.Background(), p.ID, PreferencePatch{Locked: &locked})
	require.NoError(t, err)
}

func TestEnvelopeAndResultTexts(t *testing.T) {
	t.Parallel()
	f := setup(t)

	require.Equal(t, "no preferences recorded yet", f.ok(t, tools.ListPreferences, map[string]any{}))
	require.Equal(t, "recorded 1 preference", f.ok(t, tools.AddPreferences, add(item{Title: "Academic tone", Subtitle: "Formal and objective", Kind: "hard"})))
	require.Equal(t, "recorded 2 preferences", f.ok(t, tools.AddPreferences, add(item{Title: "Short paragraphs"}, item{Title: "No jargon", Kind: "soft"})))
	f.lock(t, 3)
	require.Equal(t, "#1 [hard] Academic tone — Formal and objective\n#2 [soft] Short paragraphs\n#3 [soft] No jargon (locked)",
		f.ok(t, tools.ListPreferences, map[string]any{"action_and_reasoning": "Checking indices."}))
	require.Equal(t, "objective set: Write a literature review on soil carbon",
		f.ok(t, tools.SetObjective, map[string]any{"text": "  Write a literature review on soil carbon "}))

	// The raw envelope bytes: compact JSON, no HTML escaping.
	res, err := tools.Run(context.Background(), f.ws, tools.Call{Turn: 1, Round: 1, Name: tools.SetObjective, Arguments: `{"text":"a <b> & c"}`})
	require.NoError(t, err)
	require.Equal(t, `{"ok":true,"result":"objective set: a <b> & c"}`, res.Content)
	res, err = tools.Run(context.Background(), f.ws, tools.Call{Turn: 1, Round: 1, Name: "nope", Arguments: `{}`})
	require.NoError(t, err)
	require.JSONEq(t, `{"ok":false,"error":"unknown tool \"nope\": the tools are add_preferences, list_preferences, update_preferences, remove_preferences, set_objective"}`, res.Content)
}

func TestUpdateSummaries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.ok(t, tools.AddPreferences, add(item{Title: "Academic tone"}, item{Title: "Short paragraphs"}, item{Title: "No jargon"}))
	f.lock(t, 3)

	got := f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []map[string]any{
		{"index": 1, "title": "Formal tone", "kind": "hard"},
		{"index": 2, "subtitle": "Three sentences at most"},
		{"index": 3, "title": "Some jargon"},
		{"index": 9},
		{"index": 12, "title": "x"},
	}})
	require.Equal(t, `updated #1 "Formal tone"; updated #2 "Short paragraphs"; locked, ask the user to unlock first: #3 "No jargon"; out of range: #9, #12`, got)
	list := f.list(t)
	require.Equal(t, "Formal tone", list[0].Title)
	require.Equal(t, Hard, list[0].Kind)
	require.Equal(t, "Three sentences at most", list[1].Subtitle)
	require.Equal(t, Soft, list[1].Kind)
	require.Equal(t, "No jargon", list[2].Title)

	require.Equal(t, "no matching preferences found; out of range: #7",
		f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []map[string]any{{"index": 7, "title": "x"}}}))
	require.Equal(t, `locked, ask the user to unlock first: #3 "No jargon"`,
		f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []map[string]any{{"index": 3, "kind": "hard"}}}))

	// Two edits of one index merge; later fields win.
	require.Equal(t, `updated #2 "B"`, f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []map[string]any{
		{"index": 2, "title": "A", "kind": "hard"}, {"index": 2, "title": "B"},
	}}))
	require.Equal(t, Hard, f.list(t)[1].Kind)

	// An edit that would duplicate another title is refused whole.
	msg := f.fails(t, tools.UpdatePreferences, map[string]any{"updates": []map[string]any{
		{"index": 1, "subtitle": "changed"}, {"index": 2, "title": "  formal   TONE "},
	}})
	require.Contains(t, msg, `#1 "Formal tone"`)
	require.Equal(t, "", f.list(t)[0].Subtitle)
}

func TestRemove(t *testing.T) {
	t.Parallel()

	t.Run("FirstTwo", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}, item{Title: "C"}, item{Title: "D"}))
		require.Equal(t, `removed #1 "A"; removed #2 "B"`, f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{1, 2}}))
		require.Equal(t, []string{"C", "D"}, f.titles(t))
	})

	t.Run("LockedAndOutOfRange", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}, item{Title: "C"}))
		f.lock(t, 2)
		require.Equal(t, `removed #3 "C"; removed #1 "A"; locked, ask the user to unlock first: #2 "B"; out of range: #9, #12`,
			f.ok(t, tools.RemovePreferences, map[string]any{"indices": []any{3, 1, 2, 9, 3, 12.0}}))
		require.Equal(t, []string{"B"}, f.titles(t))
		require.Equal(t, "no matching preferences found; out of range: #4", f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{4}}))
	})

	t.Run("IndicesFollowTheList", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}, item{Title: "C"}))
		f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{1}})
		// B is now #1, C #2: indices resolve against the list as it stands.
		require.Equal(t, `removed #2 "C"`, f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{2}}))
		require.Equal(t, []string{"B"}, f.titles(t))
	})
}

func TestDuplicates(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "Short paragraphs"}))
	require.Equal(t, `recorded 1 preference; already recorded: #2 "Short paragraphs"`,
		f.ok(t, tools.AddPreferences, add(item{Title: "  short   PARAGRAPHS "}, item{Title: "New one"})))
	require.Equal(t, `recorded 0 preferences; already recorded: #1 "A", #3 "New one"`,
		f.ok(t, tools.AddPreferences, add(item{Title: "a"}, item{Title: "new one"})))
	// Within one batch: the second names the first.
	require.Equal(t, `recorded 1 preference; already recorded: #4 "Tone"`,
		f.ok(t, tools.AddPreferences, add(item{Title: "Tone"}, item{Title: "tone"})))
	// A retried call cannot double the list.
	f.ok(t, tools.AddPreferences, add(item{Title: "Tone"}))
	require.Equal(t, []string{"A", "Short paragraphs", "New one", "Tone"}, f.titles(t))
}

func TestErrorEnvelopesWriteNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}))
	before := f.list(t)

	cases := []struct {
		name, tool, args, want string
	}{
		{"NotJSON", tools.AddPreferences, `{"items": [`, "arguments are not a JSON object"},
		{"NotAnObject", tools.AddPreferences, `[1,2]`, "arguments are not a JSON object"},
		{"ItemsMissing", tools.AddPreferences, `{}`, "items: is required"},
		{"ItemsEmpty", tools.AddPreferences, `{"items":[]}`, "items: must hold at least one preference"},
		{"ItemsNotArray", tools.AddPreferences, `{"items":"A"}`, "items: must be an array"},
		{"TitleMissing", tools.AddPreferences, `{"items":[{"subtitle":"x"}]}`, "items[0].title: is required"},
		{"TitleEmpty", tools.AddPreferences, `{"items":[{"title":"   "}]}`, "items[0].title: must not be empty"},
		{"BadKind", tools.AddPreferences, `{"items":[{"title":"B"},{"title":"C","kind":"medium"}]}`, `items[1].kind: must be "hard" or "soft"`},
		{"TitleTooLong", tools.AddPreferences, `{"items":[{"title":"B"},{"title":"` + strings.Repeat("é", 201) + `"}]}`, "items[1].title: must be at most 200 characters (got 201)"},
		{"SubtitleTooLong", tools.AddPreferences, `{"items":[{"title":"B","subtitle":"` + strings.Repeat("x", 501) + `"}]}`, "items[0].subtitle: must be at most 500 characters"},
		{"BlockSyntaxBehindNUL", tools.AddPreferences, `{"items":[{"title":"B\u0000 (locked)"}]}`, `items[0].title: must not hold "(locked)"`},
		{"IndexZero", tools.RemovePreferences, `{"indices":[0]}`, "an index must be an integer ≥ 1"},
		{"IndexFraction", tools.RemovePreferences, `{"indices":[1.5]}`, "an index must be an integer ≥ 1"},
		{"IndexString", tools.RemovePreferences, `{"indices":["1"]}`, "an index must be an integer ≥ 1"},
		{"IndicesEmpty", tools.RemovePreferences, `{"indices":[]}`, "indices: must hold at least one index"},
		{"UpdateNoIndex", tools.UpdatePreferences, `{"updates":[{"title":"x"}]}`, "updates[0].index: is required"},
		{"ObjectiveMissing", tools.SetObjective, `{"action_and_reasoning":"x"}`, "text: is required"},
		{"ObjectiveTooLong", tools.SetObjective, `{"text":"` + strings.Repeat("x", 1001) + `"}`, "text: must be at most 1000 characters"},
		{"UnknownTool", "delete_everything", `{}`, `unknown tool "delete_everything"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Contains(t, f.fails(t, c.tool, c.args), c.want)
		})
	}
	require.Equal(t, before, f.list(t), "nothing written")
	d, err := f.ws.Get(context.Background())
	require.NoError(t, err)
	require.Nil(t, d.Objective)

	// Every call is recorded, the failed ones with their envelope and the raw arguments.
	calls, err := f.ws.ToolCalls(context.Background(), 0, 500)
	require.NoError(t, err)
	require.Len(t, calls, 1+len(cases))
	require.True(t, calls[0].OK)
	require.False(t, calls[1].OK)
	require.JSONEq(t, `"{\"items\": ["`, string(calls[1].Arguments), "raw text kept when not JSON")
	require.JSONEq(t, `{"ok":false,"error":"arguments are not a JSON object"}`, string(calls[1].Result))
	require.JSONEq(t, `{"items":[{"title":"B\ufffd (locked)"}]}`, string(calls[11].Arguments), "NUL scrubbed for jsonb")
}

func TestLimits(t *testing.T) {
	t.Parallel()
	f := setupOn(t, dbtest.NewPool(t, nil), Options{Limits: Limits{PreferencesMax: 3}})
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}))
	// A batch over the limit writes nothing of the batch…
	msg := f.fails(t, tools.AddPreferences, add(item{Title: "C"}, item{Title: "D"}))
	require.Contains(t, msg, "at most 3 preferences")
	require.Equal(t, []string{"A", "B"}, f.titles(t))
	// …while duplicates do not count towards it.
	require.Equal(t, `recorded 1 preference; already recorded: #1 "A"`, f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "C"})))
	_, err := f.ws.AddPreference(context.Background(), PreferenceInput{Title: "D"})
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
}

// TestLocksLiveInSQL calls the agent-path statements directly on a locked row: the statement
// itself leaves it alone, whatever a caller checked before.
func TestLocksLiveInSQL(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.ok(t, tools.AddPreferences, add(item{Title: "Locked"}, item{Title: "Open"}))
	f.lock(t, 1)
	list := f.list(t)
	q := db.New()

	ids, err := q.PreferenceUpdateUnlocked(ctx, f.pool, db.PreferenceUpdateUnlockedParams{
		ThreadID: "t1", Ids: []int64{list[0].ID, list[1].ID},
		Titles: []string{"changed", "changed too"}, Subtitles: []string{"", ""}, Kinds: []string{Hard, Hard},
	})
	require.NoError(t, err)
	require.Equal(t, []int64{list[1].ID}, ids)

	deleted, err := q.PreferenceDeleteUnlocked(ctx, f.pool, db.PreferenceDeleteUnlockedParams{ThreadID: "t1", Ids: []int64{list[0].ID, list[1].ID}})
	require.NoError(t, err)
	require.Equal(t, []int64{list[1].ID}, deleted)

	after := f.list(t)
	require.Len(t, after, 1)
	require.Equal(t, "Locked", after[0].Title)
	require.Equal(t, Soft, after[0].Kind)
	require.True(t, after[0].Locked)
}

func TestLockedSkipsCounted(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}))
	f.lock(t, 1)
	f.lock(t, 2)
	_, res := f.call(t, tools.RemovePreferences, map[string]any{"indices": []int{1, 2}})
	require.Equal(t, 2, res.LockedSkips)
	require.Equal(t, []string{"A", "B"}, f.titles(t))
}

func TestTurns(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	require.Equal(t, 1, f.turn.Number)
	require.Equal(t, "<workspace>\nObjective: (none yet)\nPreferences: (none yet)\n</workspace>", f.turn.Block())

	f.ok(t, tools.SetObjective, map[string]any{"text": "Plan a trip"})
	f.ok(t, tools.AddPreferences, add(item{Title: "Trains", Subtitle: "no flights", Kind: "hard"}))
	f.lock(t, 1)
	turn2, err := f.ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, 2, turn2.Number)
	want := "<workspace>\nObjective: Plan a trip\nPreferences:\n#1 [hard] Trains — no flights (locked)\n</workspace>"
	require.Equal(t, want, turn2.Block())
	turn3, err := f.ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, turn3.Number)
	require.Equal(t, turn2.Block(), turn3.Block(), "an unchanged workspace renders the same bytes")

	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, want, d.Block)

	// Turn 3 found the workspace of turn 2: no new snapshot; turn 2's applies to it.
	snaps, err := f.ws.Snapshots(ctx, 0, 50)
	require.NoError(t, err)
	require.Len(t, snaps, 2)
	require.Nil(t, snaps[0].Objective)
	require.Empty(t, snaps[0].Preferences)
	require.Equal(t, 2, snaps[1].Turn)
	require.Equal(t, "Plan a trip", *snaps[1].Objective)
	require.Equal(t, []Preference{{ID: 1, Index: 1, Title: "Trains", Subtitle: "no flights", Kind: Hard, Locked: true, Source: SourceConfirmed}}, snaps[1].Preferences)
	page, err := f.ws.Snapshots(ctx, 1, 50)
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, 2, page[0].Turn)
	for turn, want := range map[int]int{1: 1, 2: 2, 3: 2} {
		snap, err := f.ws.SnapshotForTurn(ctx, turn)
		require.NoError(t, err)
		require.Equal(t, want, snap.Turn, "turn %d", turn)
	}
	for _, turn := range []int{0, 4} {
		_, err := f.ws.SnapshotForTurn(ctx, turn)
		require.ErrorIs(t, err, ErrNotFound)
	}

	threads, err := f.store.Threads(ctx, "", "", ThreadFilter{}, 50)
	require.NoError(t, err)
	require.Len(t, threads, 1)
	require.Equal(t, 3, threads[0].Turns)
	require.Equal(t, 1, threads[0].PreferenceCount)
}

// countingTracer counts the queries a pool sends (each is one round trip; a batch goes out as
// one pipeline: one round trip), and keeps every connection it sent them on.
type countingTracer struct {
	n     atomic.Int64
	conns sync.Map
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.conns.Store(conn, true)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *countingTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	c.conns.Store(conn, true)
	return ctx
}
func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// cut closes, as its process's death does, the socket of the connection whose backend is pid:
// no cancel, no Terminate; Postgres reads what was sent before the close, then the end.
func (c *countingTracer) cut(t *testing.T, pid uint32) {
	t.Helper()
	cut := false
	c.conns.Range(func(k, _ any) bool {
		if conn := k.(*pgx.Conn); conn.PgConn().PID() == pid {
			require.NoError(t, conn.PgConn().Conn().Close())
			cut = true
		}
		return !cut
	})
	require.True(t, cut, "no connection of the pool has backend %d", pid)
}

// TestToolCallRoundTrips: a tool call outside a turn makes two round trips (begin+lock+read;
// the tool's statement+record+events+commit), three when it rewrites rows (their locks, taken
// before the commit goes out: TestCallCutOffWhileWaitingWritesNothing), one refused before it
// is planned one. Once warm,
// it prepares no statement: each one's text is the same every time (its time bound a
// parameter), so none takes a round trip of its own to be prepared, or crowds the connection's
// cache. A turn's calls make one round trip each (TestTurnToolCallsInOneRoundTrip).
func TestToolCallRoundTrips(t *testing.T) {
	t.Parallel()
	tracer := &countingTracer{}
	pool := dbtest.NewPool(t, &dbtest.Options{Tracer: tracer, MaxConns: 1})
	f := setupOn(t, pool, Options{Timeout: time.Minute}) // each operation bounded, as DATABASE_TIMEOUT bounds it
	calls := []struct {
		tool, args string
		want       int64
	}{
		{tools.AddPreferences, `{"items":[{"title":"A"},{"title":"B"}]}`, 2},
		{tools.ListPreferences, `{}`, 2},
		{tools.UpdatePreferences, `{"updates":[{"index":1,"kind":"hard"}]}`, 3},
		{tools.SetObjective, `{"text":"x"}`, 3},
		{tools.RemovePreferences, `{"indices":[2]}`, 3},
		{tools.AddPreferences, `{"items":[]}`, 2},
		{tools.AddPreferences, `not json`, 1},
	}
	for _, c := range calls { // warm: the connection prepares each statement once
		f.call(t, c.tool, c.args)
	}
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{1, 2, 3}})
	prepared := func() (n int) { // on the pool's one connection
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_prepared_statements`).Scan(&n))
		return n
	}
	warm := prepared()
	for i, c := range calls {
		// Each call with a time bound of its own: another lock_timeout.
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(30+i)*time.Second)
		before := tracer.n.Load()
		_, err := tools.Run(ctx, f.ws, tools.Call{Turn: f.turn.Number, Round: 1, Name: c.tool, Arguments: c.args})
		cancel()
		require.NoError(t, err)
		require.Equal(t, c.want, tracer.n.Load()-before, "%s %s", c.tool, c.args)
	}
	require.Equal(t, warm, prepared(), "statements prepared by warm tool calls")
}

// TestTurnToolCallsInOneRoundTrip: a turn's tool calls, planned on the workspace its start or
// its last call left, make one round trip each, a refused one too; a call that finds the
// workspace changed meanwhile (a user's edit) writes nothing in that round trip, reads the
// workspace under the lock and runs on it (two more, one for the locks of the rows it rewrites,
// and one to read the proposals the workspace holds, as its locked_skip proposes), and the calls
// after it are back to one.
// What each call did is what the same calls do outside a turn.
func TestTurnToolCallsInOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tracer := &countingTracer{}
	pool := dbtest.NewPool(t, &dbtest.Options{Tracer: tracer, MaxConns: 1})
	f := setupOn(t, pool, Options{Timeout: time.Minute})
	f.ok(t, tools.AddPreferences, add(item{Title: "Warm"})) // the connection prepares its statements
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{1}})
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []map[string]any{{"index": 1, "kind": "hard"}}})
	start, err := f.ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	view := tools.NewView(start)
	run := func(tool, args string) (tools.Result, int64) {
		before := tracer.n.Load()
		res, err := tools.Run(ctx, f.ws, tools.Call{Turn: start.Number, Round: 1, Name: tool, Arguments: args, View: view})
		require.NoError(t, err)
		view.NextRound() // a call a round: each call's indices name what the calls before it left
		return res, tracer.n.Load() - before
	}
	for _, c := range []struct {
		tool, args string
		want       string
	}{
		{tools.AddPreferences, `{"items":[{"title":"A"},{"title":"B"},{"title":"C"}]}`, `recorded 3 preferences`},
		{tools.UpdatePreferences, `{"updates":[{"index":1,"kind":"hard"}]}`, `updated #1 "A"`},
		{tools.SetObjective, `{"text":"x"}`, `objective set: x`},
		{tools.RemovePreferences, `{"indices":[2]}`, `removed #2 "B"`},
		{tools.AddPreferences, `{"items":[{"title":"a"}]}`, `recorded 0 preferences; already recorded: #1 "A"`},
		{tools.ListPreferences, `{}`, "#1 [hard] A\n#2 [soft] C"},
		{tools.AddPreferences, `{"items":[]}`, ``},
	} {
		res, n := run(c.tool, c.args)
		require.Equal(t, int64(1), n, "%s %s", c.tool, c.args)
		require.Contains(t, res.Text, c.want)
	}
	f.lock(t, 2) // the user's edit: the workspace moves on
	res, n := run(tools.UpdatePreferences, `{"updates":[{"index":2,"title":"D"},{"index":1,"title":"E"}]}`)
	require.Equal(t, int64(5), n, "planned on the list before the edit, then on the list under the lock")
	require.Equal(t, `updated #1 "E"; locked, ask the user to unlock first: #2 "C"`, res.Text)
	res, n = run(tools.AddPreferences, `{"items":[{"title":"F"}]}`)
	require.Equal(t, int64(1), n)
	require.Equal(t, "recorded 1 preference", res.Text)
	require.Equal(t, []string{"E", "C", "F"}, f.titles(t))
	d, err := f.ws.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, "x", d.Objective.Text)
	require.True(t, d.Preferences[1].Locked)
}

// TestTurnStartIsOneRoundTrip: a turn costs one round trip, its start; its usage, once the client
// has its answer, goes with that of other threads' turns in one round trip that does not wait for
// the disk.
func TestTurnStartIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	tracer := &countingTracer{}
	pool := dbtest.NewPool(t, &dbtest.Options{Tracer: tracer})
	f := setupOn(t, pool, Options{})
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B"}))
	f.ok(t, tools.SetObjective, map[string]any{"text": "x"})
	require.NoError(t, pool.Ping(context.Background())) // warm: the pool has a connection

	before := tracer.n.Load()
	turn, err := f.ws.StartTurn(context.Background(), TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(1), tracer.n.Load()-before)
	require.Len(t, turn.Preferences, 2)
	require.Equal(t, "x", turn.Objective)

	other := f.store.Workspace(ThreadID{Name: "other"})
	_, err = other.StartTurn(context.Background(), TurnOptions{})
	require.NoError(t, err)
	before = tracer.n.Load()
	require.NoError(t, f.store.AddUsage(context.Background(), UsageBatch{Writer: "w", Number: 1, Usage: map[ThreadID]Usage{
		f.ws.ThreadID():         {PromptTokens: 10, CachedPromptTokens: 4, CompletionTokens: 3},
		other.ThreadID():        {PromptTokens: 7},
		{Name: "never-started"}: {PromptTokens: 1}, // no thread: skipped
	}}))
	require.Equal(t, int64(1), tracer.n.Load()-before)
	d, err := f.ws.Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, Usage{PromptTokens: 10, CachedPromptTokens: 4, CompletionTokens: 3}, d.Usage)
	d, err = other.Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, Usage{PromptTokens: 7}, d.Usage)
	_, err = f.store.Workspace(ThreadID{Name: "never-started"}).Get(context.Background())
	require.ErrorIs(t, err, ErrNotFound)
}

func TestUserPath(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	store := NewStore(pool, Options{})
	ctx := context.Background()
	ws := store.Workspace(ThreadID{Name: "user-made"})

	_, err := ws.Get(ctx)
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, ws.DeletePreference(ctx, 1), ErrNotFound)

	p, err := ws.AddPreference(ctx, PreferenceInput{Title: "Academic tone", Subtitle: "Formal", Kind: "hard", Locked: true})
	require.NoError(t, err, "creates the thread")
	require.Equal(t, 1, p.Index)
	require.True(t, p.Locked)
	p2, err := ws.AddPreference(ctx, PreferenceInput{Title: "Short"})
	require.NoError(t, err)
	require.Equal(t, Soft, p2.Kind)
	require.Equal(t, 2, p2.Index)

	_, err = ws.AddPreference(ctx, PreferenceInput{Title: "academic TONE"})
	var de *DuplicateError
	require.ErrorAs(t, err, &de)
	require.Equal(t, `already recorded: #1 "Academic tone"`, de.Error())
	_, err = ws.AddPreference(ctx, PreferenceInput{Title: "x", Kind: "maybe"})
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "kind", ve.Field)

	// The user path ignores locks.
	title := "Plain tone"
	up, err := ws.UpdatePreference(ctx, p.ID, PreferencePatch{Title: &title})
	require.NoError(t, err)
	require.Equal(t, "Plain tone", up.Title)
	require.True(t, up.Locked)
	unlock := false
	up, err = ws.UpdatePreference(ctx, p.ID, PreferencePatch{Locked: &unlock})
	require.NoError(t, err)
	require.False(t, up.Locked)
	dup := "short"
	_, err = ws.UpdatePreference(ctx, p.ID, PreferencePatch{Title: &dup})
	require.ErrorAs(t, err, &de)
	_, err = ws.UpdatePreference(ctx, 99, PreferencePatch{Title: &title})
	require.ErrorIs(t, err, ErrNotFound)

	// Stable ids: removing the first keeps the second's id; its index moves.
	require.NoError(t, ws.DeletePreference(ctx, p.ID))
	d, err := ws.Get(ctx)
	require.NoError(t, err)
	require.Len(t, d.Preferences, 1)
	require.Equal(t, p2.ID, d.Preferences[0].ID)
	require.Equal(t, 1, d.Preferences[0].Index)
	p3, err := ws.AddPreference(ctx, PreferenceInput{Title: "Third"})
	require.NoError(t, err)
	require.Equal(t, p2.ID+1, p3.ID, "ids are never reused")

	o, err := ws.SetObjective(ctx, "Write a review")
	require.NoError(t, err)
	require.Equal(t, ByUser, o.UpdatedBy)
	_, err = ws.SetObjective(ctx, "")
	require.ErrorAs(t, err, &ve)

	require.NoError(t, ws.Delete(ctx))
	require.ErrorIs(t, ws.Delete(ctx), ErrNotFound)
	_, err = ws.Snapshots(ctx, 0, 10)
	require.ErrorIs(t, err, ErrNotFound)
}

func TestThreadsPagination(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	store := NewStore(pool, Options{})
	ctx := context.Background()
	for i := range 5 {
		_, err := store.Workspace(ThreadID{Name: fmt.Sprintf("t%d", i)}).StartTurn(ctx, TurnOptions{})
		require.NoError(t, err)
	}
	// A turn moves updated_at once it is a second old: let two seconds pass for the five.
	_, err := pool.Exec(ctx, `UPDATE threads SET updated_at = updated_at - interval '2 seconds'`)
	require.NoError(t, err)
	_, err = store.Workspace(ThreadID{Name: "t2"}).StartTurn(ctx, TurnOptions{}) // t2 is now the most recent
	require.NoError(t, err)

	var got []string
	after := ""
	for {
		page, err := store.Threads(ctx, after, "", ThreadFilter{}, 2)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, th := range page {
			got = append(got, th.ID)
		}
		after = page[len(page)-1].ID
	}
	require.Equal(t, []string{"t2", "t4", "t3", "t1", "t0"}, got)
}

// TestConcurrentAgentAndUserEdits runs agent removes and user edits on one thread at once: the
// thread lock serializes them, so no call touches a row its indices did not name when it ran.
func TestConcurrentAgentAndUserEdits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	const n = 40
	var items []item
	for i := range n {
		items = append(items, item{Title: fmt.Sprintf("P%02d", i)})
	}
	f.ok(t, tools.AddPreferences, add(items...))
	all := f.list(t)

	var wg sync.WaitGroup
	removed := make(chan string, n)
	// Agents each remove "#1": exactly the first of the list as it stands when the call runs.
	for range n / 2 {
		wg.Go(func() {
			res, err := tools.Run(ctx, f.ws, tools.Call{Turn: 1, Round: 1, Name: tools.RemovePreferences, Arguments: `{"indices":[1]}`})
			if err != nil {
				t.Error(err)
				return
			}
			removed <- res.Content
		})
	}
	// Users lock the last ten and rename them by stable id at the same time.
	for _, p := range all[n-10:] {
		wg.Go(func() {
			locked := true
			title := p.Title + " (user)"
			if _, err := f.ws.UpdatePreference(ctx, p.ID, PreferencePatch{Locked: &locked, Title: &title}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	close(removed)

	// Each agent call removed a distinct preference, in list order.
	var got []string
	for c := range removed {
		var env tools.Envelope
		require.NoError(t, json.Unmarshal([]byte(c), &env))
		require.True(t, env.OK)
		got = append(got, env.Result)
	}
	require.Len(t, got, n/2)
	seen := map[string]bool{}
	for _, g := range got {
		require.False(t, seen[g], "removed twice: %s", g)
		seen[g] = true
	}
	list := f.list(t)
	require.Len(t, list, n/2)
	for i, p := range list {
		require.Equal(t, i+1, p.Index)
		if i >= n/2-10 {
			require.True(t, p.Locked)
			require.Equal(t, fmt.Sprintf("P%02d (user)", n/2+i), p.Title)
		} else {
			require.Equal(t, fmt.Sprintf("P%02d", n/2+i), p.Title)
		}
	}
}

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	_, cfg := dbtest.Schema(t)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- db.Migrate(context.Background(), pool) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, db.Migrate(context.Background(), pool))
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM schema_migrations`).Scan(&n))
	files, err := filepath.Glob("../db/migration/*.sql")
	require.NoError(t, err)
	require.Equal(t, len(files), n, "each migration applied once")
}

// TestOversizedArguments: a model's megabytes of arguments get an error envelope (over
// MAX_TOOL_ARGUMENT_BYTES, or within it over a field's limit), nothing is written but the call's
// record, which keeps a bounded prefix of them; nested or broken arguments are recorded too.
func TestOversizedArguments(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.Contains(t, f.fails(t, tools.AddPreferences, `{"items":[{"title":"`+strings.Repeat("x", 2<<20)+`"}]}`), "arguments: at most 1048576 bytes")
	long := strings.Repeat("x", 500<<10)
	require.Contains(t, f.fails(t, tools.AddPreferences, `{"items":[{"title":"`+long+`"}]}`), "items[0].title: must be at most 200 characters")
	require.Contains(t, f.fails(t, tools.SetObjective, `{"text":"`+long+`"}`), "text: must be at most 1000 characters")
	require.Contains(t, f.fails(t, tools.RemovePreferences, `{"indices":`+strings.Repeat("[", 5000)+strings.Repeat("]", 5000)+`}`), "an index must be an integer")
	require.Empty(t, f.list(t))
	calls, err := f.ws.ToolCalls(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, calls, 4)
	for _, c := range calls {
		require.LessOrEqual(t, len(c.Arguments), MaxRefusedArguments+16, "a bounded prefix")
	}
}

// TestEveryChangeReachesTheNextTurn: a turn's start reads the workspace's tables only when the
// thread's events moved on since its last snapshot (migration 005), so every way of changing a
// workspace — each tool, each user edit, a revert — must reach the next turn; a turn after
// changes that changed nothing (a refused edit of a locked item, an unchanged set) reuses the last
// snapshot, and so does every turn while nothing changes.
func TestEveryChangeReachesTheNextTurn(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	stored := 1 // the fixture's first turn stored the empty workspace
	turn := func(changed bool) {
		t.Helper()
		start, err := f.ws.StartTurn(ctx, TurnOptions{})
		require.NoError(t, err)
		d, err := f.ws.Get(ctx)
		require.NoError(t, err)
		want := ""
		if d.Objective != nil {
			want = d.Objective.Text
		}
		require.Equal(t, want, start.Objective)
		require.Equal(t, d.Block, start.Block())
		if changed {
			stored++
		}
		snaps, err := f.ws.Snapshots(ctx, 0, 100)
		require.NoError(t, err)
		require.Len(t, snaps, stored)
		if last := snaps[len(snaps)-1].Turn; changed {
			require.Equal(t, start.Number, last, "the turn's snapshot")
		} else {
			require.Less(t, last, start.Number, "an earlier turn's snapshot")
		}
	}

	turn(false)
	f.ok(t, tools.AddPreferences, add(item{Title: "A"}, item{Title: "B", Kind: "hard"}))
	turn(true)
	turn(false)
	f.ok(t, tools.UpdatePreferences, map[string]any{"updates": []any{map[string]any{"index": 1, "subtitle": "more"}}})
	turn(true)
	f.ok(t, tools.SetObjective, map[string]any{"text": "Goal"})
	turn(true)
	f.ok(t, tools.SetObjective, map[string]any{"text": "Goal"}) // unchanged
	turn(false)
	f.lock(t, 2)
	turn(true)
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{2}}) // locked: skipped, an event, no change
	turn(false)
	turn(false)
	f.ok(t, tools.RemovePreferences, map[string]any{"indices": []int{1}})
	turn(true)
	_, err := f.ws.UpdatePreference(ctx, f.list(t)[0].ID, PreferencePatch{Locked: boolPtr(false), Kind: strPtr("soft")})
	require.NoError(t, err)
	turn(true)
	_, err = f.ws.UpdatePreference(ctx, f.list(t)[0].ID, PreferencePatch{Title: strPtr("B2")})
	require.NoError(t, err)
	turn(true)
	p, err := f.ws.AddPreference(ctx, PreferenceInput{Title: "C"})
	require.NoError(t, err)
	turn(true)
	require.NoError(t, f.ws.DeletePreference(ctx, p.ID))
	turn(true)
	_, err = f.ws.SetObjective(ctx, "User goal")
	require.NoError(t, err)
	turn(true)
	evs := f.events(t)
	_, err = f.ws.RevertEvent(ctx, evs[len(evs)-1].ID) // the objective back to "Goal"
	require.NoError(t, err)
	turn(true)
	_, err = f.ws.RevertEvent(ctx, evs[len(evs)-2].ID) // C restored
	require.NoError(t, err)
	turn(true)
}

// TestCallOverMCP: a call over MCP (Via ViaMCP) belongs to no turn: it creates its thread when
// new, records no turn or round, and its events say via "mcp"; a proxied turn's say "proxy", a
// user's "admin". Its result carries the envelope's text, an error's too.
func TestCallOverMCP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := NewStore(dbtest.NewPool(t, nil), Options{UntrustedWrites: UntrustedApply}) // its writes apply (docs/spec.md §19)
	ws := store.Workspace(ThreadID{Client: "alice", Name: "elsewhere"})
	res, err := tools.Run(ctx, ws, tools.Call{Name: tools.AddPreferences, Via: ViaMCP,
		Arguments: `{"items":[{"title":"Window seat"}],"action_and_reasoning":"The user said so."}`})
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, "recorded 1 preference", res.Text)
	res, err = tools.Run(ctx, ws, tools.Call{Name: tools.AddPreferences, Via: ViaMCP, Arguments: `{"items":[]}`})
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, "items: must hold at least one preference", res.Text)

	turn, err := ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, turn.Number, "the call created the thread, no turn")
	_, err = tools.Run(ctx, ws, tools.Call{Turn: 1, Round: 1, Name: tools.SetObjective, Arguments: `{"text":"Fly","action_and_reasoning":"named"}`})
	require.NoError(t, err)
	_, err = ws.SetObjective(ctx, "Fly to Porto")
	require.NoError(t, err)

	evs, err := ws.Events(ctx, EventQuery{Limit: 10})
	require.NoError(t, err)
	require.Len(t, evs, 3)
	require.Equal(t, []string{ViaMCP, ViaProxy, ViaAdmin}, []string{evs[0].Via, evs[1].Via, evs[2].Via})
	require.Nil(t, evs[0].Turn)
	require.Nil(t, evs[0].Round)
	require.Equal(t, "The user said so.", *evs[0].Reason)
	require.Equal(t, 1, *evs[1].Turn)
	calls, err := ws.ToolCalls(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, calls, 3)
	require.Nil(t, calls[0].Turn)
	require.Nil(t, calls[1].Round, "a refused call over MCP has no turn either")
	require.Equal(t, 1, *calls[2].Turn)
}

// TestCallCutOffWhileWaitingWritesNothing: a call whose replica dies (its connection closed,
// nothing cancelled) while the call waits for a lock writes nothing, whichever row it waits for:
// a call's commit goes out only once every statement of it that can wait for a lock has run. A
// turn's call, whose statements and commit go in one round trip (ToolCallGuard), therefore
// waits for no lock: when the thread's row, or a preference row the call writes, is held, that
// round trip writes nothing and the call waits on the locked path.
func TestCallCutOffWhileWaitingWritesNothing(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, hold string
		turn       bool
	}{
		{"turn, thread's row", `SELECT pg_backend_pid() FROM threads WHERE id = $1 FOR NO KEY UPDATE`, true},
		{"turn, preference's row", `SELECT pg_backend_pid() FROM preferences WHERE thread_id = $1 AND id = 1 FOR UPDATE`, true},
		{"outside a turn, thread's row", `SELECT pg_backend_pid() FROM threads WHERE id = $1 FOR NO KEY UPDATE`, false},
		{"outside a turn, preference's row", `SELECT pg_backend_pid() FROM preferences WHERE thread_id = $1 AND id = 1 FOR UPDATE`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tracer := &countingTracer{}
			pool := dbtest.NewPool(t, &dbtest.Options{Tracer: tracer})
			f := setupOn(t, pool, Options{Timeout: time.Minute})
			f.ok(t, tools.AddPreferences, add(item{Title: "A"}))
			call := tools.Call{Turn: f.turn.Number, Round: 1, Name: tools.UpdatePreferences, Arguments: `{"updates":[{"index":1,"title":"B"}]}`}
			if c.turn {
				start, err := f.ws.StartTurn(ctx, TurnOptions{})
				require.NoError(t, err)
				call.Turn, call.View = start.Number, tools.NewView(start)
			}
			calls := func() (n int) {
				require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM tool_calls WHERE thread_id = $1`, f.ws.ThreadID().String()).Scan(&n))
				return n
			}
			before := calls()
			holder, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(context.Background()) }()
			var pid int32
			require.NoError(t, holder.QueryRow(ctx, c.hold, f.ws.ThreadID().String()).Scan(&pid))

			ran := make(chan error, 1)
			go func() {
				_, err := tools.Run(ctx, f.ws, call)
				ran <- err
			}()
			var waiting uint32
			require.Eventually(t, func() bool {
				err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, pid).Scan(&waiting)
				return err == nil
			}, time.Minute, 5*time.Millisecond, "the call waits for the held row")
			tracer.cut(t, waiting)
			require.NoError(t, holder.Rollback(ctx)) // the row is free: the cut-off call's statements could run now
			require.Error(t, <-ran)

			require.Eventually(t, func() bool { // its backend has gone
				var n int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, waiting).Scan(&n)
				return err == nil && n == 0
			}, time.Minute, 5*time.Millisecond)
			require.Equal(t, []string{"A"}, f.titles(t), "the cut-off update changed nothing")
			require.Equal(t, before, calls(), "the cut-off call left no record")
		})
	}
}
