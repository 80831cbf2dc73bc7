package workspace_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// scopes is a store with a thread t whose parents are repo-x then alice, each scope holding
// preferences of its own, and a second thread u with the same parents.
type scopes struct {
	store             *Store
	t, u, repo, alice *Workspace
}

func setupScopes(t *testing.T) *scopes {
	t.Helper()
	ctx := context.Background()
	store := NewStore(dbtest.NewPool(t, nil), Options{})
	s := &scopes{store: store, t: store.Workspace(ThreadID{Name: "t"}), u: store.Workspace(ThreadID{Name: "u"}),
		repo: store.Workspace(ThreadID{Name: "repo-x"}), alice: store.Workspace(ThreadID{Name: "alice"})}
	for _, in := range []struct {
		ws *Workspace
		PreferenceInput
	}{
		{s.repo, PreferenceInput{Title: "Go 1.26, no cgo", Kind: Hard, Locked: true}},
		{s.repo, PreferenceInput{Title: "Tabs over spaces", Subtitle: "the project's rule", Kind: Hard}},
		{s.alice, PreferenceInput{Title: "tabs  over spaces", Kind: Soft}},
		{s.alice, PreferenceInput{Title: "Answer in French", Kind: Soft}},
	} {
		_, err := in.ws.AddPreference(ctx, in.PreferenceInput)
		require.NoError(t, err)
	}
	parents := []ThreadID{{Name: "repo-x"}, {Name: "alice"}}
	require.NoError(t, s.t.SetParents(ctx, parents))
	require.NoError(t, s.u.SetParents(ctx, parents))
	return s
}

const inheritedBlock = "<workspace>\nObjective: (none yet)\nPreferences:" +
	"%s" +
	"\nFrom repo-x (the user's; ask the user to change these):\n- [hard] Go 1.26, no cgo (locked)\n- [hard] Tabs over spaces — the project's rule" +
	"\nFrom alice (the user's; ask the user to change these):\n- [soft] Answer in French\n</workspace>"

// TestInheritedPreferencesInTheBlock: a turn's block shows the thread's own list, then each
// ancestor's preferences under its heading, nearest first, a title nearer hiding the same one
// further (case and spaces aside); the turn's snapshot holds what the block showed; an
// ancestor's change reaches every inheriting thread's next turn.
func TestInheritedPreferencesInTheBlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupScopes(t)

	start, err := s.t.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf(inheritedBlock, " (none yet)"), start.Block())
	again, err := s.t.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, start.Block(), again.Block(), "byte-identical while nothing changed")

	// The thread's own title wins over the scopes'.
	_, err = s.t.AddPreference(ctx, PreferenceInput{Title: "Answer in French", Kind: Hard})
	require.NoError(t, err)
	start, err = s.t.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Contains(t, start.Block(), "#1 [hard] Answer in French\nFrom repo-x")
	require.NotContains(t, start.Block(), "From alice", "alice's only item left is the thread's own title")

	// A change in alice reaches both children's next turns, and the snapshot keeps it.
	_, err = s.alice.AddPreference(ctx, PreferenceInput{Title: "Short answers", Kind: Soft})
	require.NoError(t, err)
	for _, ws := range []*Workspace{s.t, s.u} {
		st, err := ws.StartTurn(ctx, TurnOptions{})
		require.NoError(t, err)
		require.Contains(t, st.Block(), "- [soft] Short answers\n</workspace>")
		snap, err := ws.SnapshotForTurn(ctx, st.Number)
		require.NoError(t, err)
		require.Equal(t, st.Inherited, snap.Inherited, "the snapshot holds what the block showed")
	}

	d, err := s.t.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"repo-x", "alice"}, d.Parents)
	require.Len(t, d.Inherited, 2)
	require.Equal(t, "repo-x", d.Inherited[0].Thread.Name)
	require.Equal(t, AgentWritesDirect, d.AgentWrites)
	require.True(t, d.AgentWritesInherited)

	children, err := s.alice.Children(ctx, "", 10)
	require.NoError(t, err)
	require.Equal(t, []ThreadID{{Name: "t"}, {Name: "u"}}, children)
}

// TestParentsRefused: a cycle, a thread of its own, a name twice and a ninth ancestor are
// refused, changing nothing; another client's thread is not found.
func TestParentsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := NewStore(dbtest.NewPool(t, nil), Options{})
	ws := func(name string) *Workspace { return store.Workspace(ThreadID{Name: name}) }
	require.NoError(t, ws("b").SetParents(ctx, []ThreadID{{Name: "a"}}))
	require.NoError(t, ws("c").SetParents(ctx, []ThreadID{{Name: "b"}}))

	var pe *ParentsError
	require.ErrorAs(t, ws("a").SetParents(ctx, []ThreadID{{Name: "c"}}), &pe, "a cycle a → c → b → a")
	require.ErrorAs(t, ws("a").SetParents(ctx, []ThreadID{{Name: "a"}}), &pe)
	require.ErrorAs(t, ws("d").SetParents(ctx, []ThreadID{{Name: "a"}, {Name: "a"}}), &pe)

	// A chain of eight ancestors is allowed, a ninth is not.
	for i := 1; i < 8; i++ {
		require.NoError(t, ws(fmt.Sprintf("s%d", i)).SetParents(ctx, []ThreadID{{Name: fmt.Sprintf("s%d", i+1)}}))
	}
	require.NoError(t, ws("eight").SetParents(ctx, []ThreadID{{Name: "s1"}}), "s1 … s8: eight ancestors")
	require.ErrorAs(t, ws("nine").SetParents(ctx, []ThreadID{{Name: "x"}, {Name: "s1"}}), &pe, "x and s1 … s8: nine")

	_, err := ws("nine").Get(ctx)
	require.ErrorIs(t, err, ErrNotFound, "a refused list creates nothing")
	d, err := ws("a").Get(ctx)
	require.NoError(t, err)
	require.Empty(t, d.Parents)

	alice := store.Workspace(ThreadID{Client: "alice", Name: "t"})
	require.ErrorIs(t, alice.SetParents(ctx, []ThreadID{{Client: "bob", Name: "scope"}}), ErrNotFound)

	// A turn naming parents it cannot store begins no turn.
	_, err = ws("fresh").StartTurn(ctx, TurnOptions{Parents: []ThreadID{{Name: "fresh"}}})
	require.ErrorAs(t, err, &pe)
	_, err = ws("fresh").Get(ctx)
	require.ErrorIs(t, err, ErrNotFound, "no empty thread is left behind")
}

// TestParentsFromATurn: a turn's parents are stored when they differ (a parents_set event by the
// client) and its block shows them at once; THREAD_PARENTS' kind (ParentsIfNew) only on the
// thread's first turn.
func TestParentsFromATurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupScopes(t)
	fresh := s.store.Workspace(ThreadID{Name: "session-1"})
	start, err := fresh.StartTurn(ctx, TurnOptions{Parents: []ThreadID{{Name: "repo-x"}}, ParentsIfNew: true})
	require.NoError(t, err)
	require.Equal(t, 1, start.Number)
	require.Contains(t, start.Block(), "From repo-x")
	evs, err := fresh.Events(ctx, EventQuery{Limit: 10})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, ParentsSet, evs[0].Kind)
	require.Equal(t, ByClient, evs[0].Actor)
	require.JSONEq(t, `{"parents":["repo-x"]}`, string(evs[0].After))

	// The user changes them; THREAD_PARENTS does not put them back on a later turn.
	require.NoError(t, fresh.SetParents(ctx, []ThreadID{{Name: "alice"}}))
	start, err = fresh.StartTurn(ctx, TurnOptions{Parents: []ThreadID{{Name: "repo-x"}}, ParentsIfNew: true})
	require.NoError(t, err)
	require.Contains(t, start.Block(), "From alice")
	require.NotContains(t, start.Block(), "From repo-x")

	// A header's parents are stored on any turn, once.
	for range 2 {
		start, err = fresh.StartTurn(ctx, TurnOptions{Parents: []ThreadID{{Name: "repo-x"}, {Name: "alice"}}})
		require.NoError(t, err)
		require.Contains(t, start.Block(), "From repo-x")
	}
	evs, err = fresh.Events(ctx, EventQuery{Limit: 10})
	require.NoError(t, err)
	require.Len(t, evs, 3, "one parents_set per change")
}

// TestMovePreference: a preference moves from a thread to a scope as a user change, one event in
// each workspace; a title the destination has is refused.
func TestMovePreference(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupScopes(t)
	p, err := s.t.AddPreference(ctx, PreferenceInput{Title: "No emojis", Kind: Hard, Locked: true})
	require.NoError(t, err)
	moved, err := s.t.MovePreference(ctx, p.ID, ThreadID{Name: "alice"})
	require.NoError(t, err)
	require.Equal(t, "No emojis", moved.Title)
	require.True(t, moved.Locked)
	require.Equal(t, 3, moved.Index)

	d, err := s.t.Get(ctx)
	require.NoError(t, err)
	require.Empty(t, d.Preferences)
	require.Contains(t, d.Block, "- [hard] No emojis (locked)", "inherited now")
	for _, ws := range []*Workspace{s.t, s.alice} {
		evs, err := ws.Events(ctx, EventQuery{Descending: true, Limit: 1})
		require.NoError(t, err)
		require.Equal(t, PreferenceMoved, evs[0].Kind)
		require.JSONEq(t, `{"from":"t","to":"alice"}`, string(evs[0].Moved))
	}

	other, err := s.t.AddPreference(ctx, PreferenceInput{Title: "answer in french"})
	require.NoError(t, err)
	_, err = s.t.MovePreference(ctx, other.ID, ThreadID{Name: "alice"})
	var de *DuplicateError
	require.ErrorAs(t, err, &de)
	_, err = s.t.MovePreference(ctx, other.ID, ThreadID{Client: "bob", Name: "alice"})
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.t.MovePreference(ctx, 999, ThreadID{Name: "alice"})
	require.True(t, errors.Is(err, ErrNotFound))
}

// TestReviewMode: with agent_writes propose (set on a scope, inherited by its children), every
// change a tool would make is a proposal that changes nothing until the user applies it; a
// dismissed one never applies; locked items keep their locked_skip proposals.
func TestReviewMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupScopes(t)
	_, err := s.t.AddPreference(ctx, PreferenceInput{Title: "Short answers"})
	require.NoError(t, err)
	_, err = s.t.AddPreference(ctx, PreferenceInput{Title: "No emojis", Locked: true})
	require.NoError(t, err)
	require.NoError(t, s.alice.SetAgentWrites(ctx, AgentWritesPropose))
	start, err := s.t.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, AgentWritesPropose, start.AgentWrites, "inherited from alice")

	view := tools.NewView(start)
	run := func(name, args string) string {
		t.Helper()
		res, err := tools.Run(ctx, s.t, tools.Call{Turn: start.Number, Round: 1, Name: name, Arguments: args, View: view})
		require.NoError(t, err)
		require.True(t, res.OK, res.Text)
		return res.Text
	}
	require.Equal(t, `proposed; the user will review it: add "Bullet points"; already recorded (from repo-x): "Go 1.26, no cgo"`,
		run(tools.AddPreferences, `{"items":[{"title":"Bullet points"},{"title":"go 1.26, NO cgo"}],"action_and_reasoning":"The user asked."}`))
	require.Equal(t, `proposed; the user will review it: update #1 "Brief answers"; locked, ask the user to unlock first: #2 "No emojis"`,
		run(tools.UpdatePreferences, `{"updates":[{"index":1,"title":"Brief answers"},{"index":2,"title":"Emojis"}]}`))
	require.Equal(t, `proposed; the user will review it: objective: A tidy repository`, run(tools.SetObjective, `{"text":"A tidy repository"}`))
	require.Equal(t, `proposed; the user will review it: remove #1 "Short answers"`, run(tools.RemovePreferences, `{"indices":[1]}`))

	d, err := s.t.Get(ctx)
	require.NoError(t, err)
	require.Nil(t, d.Objective, "nothing changed")
	require.Equal(t, []string{"Short answers", "No emojis"}, []string{d.Preferences[0].Title, d.Preferences[1].Title})

	pending, err := s.t.PendingProposals(ctx, 10)
	require.NoError(t, err)
	kinds := make([]string, len(pending))
	for i, p := range pending {
		kinds[i] = p.Kind
	}
	require.Equal(t, []string{Proposed, Proposed, LockedSkip, Proposed, Proposed}, kinds)
	add, update, objective := pending[0], pending[1], pending[3]
	require.Equal(t, "The user asked.", *add.Reason)
	require.JSONEq(t, `{"title":"Bullet points","subtitle":"","kind":"soft"}`, string(add.Proposed))
	require.JSONEq(t, `{"text":"A tidy repository"}`, string(objective.Proposed))

	// Applied: the addition and the objective; dismissed: the update, which then never applies.
	ev, err := s.t.ApplyProposal(ctx, add.ID)
	require.NoError(t, err)
	require.Equal(t, PreferenceAdded, ev.Kind)
	require.Equal(t, add.ID, *ev.Answers)
	_, err = s.t.ApplyProposal(ctx, objective.ID)
	require.NoError(t, err)
	ev, err = s.t.DismissProposal(ctx, update.ID)
	require.NoError(t, err)
	require.Equal(t, ProposalDismissed, ev.Kind)
	var ae *AnsweredError
	_, err = s.t.ApplyProposal(ctx, update.ID)
	require.ErrorAs(t, err, &ae)
	_, err = s.t.DismissProposal(ctx, add.ID)
	require.ErrorAs(t, err, &ae, "applied already")
	var ve *ValidationError
	_, err = s.t.DismissProposal(ctx, ev.ID)
	require.ErrorAs(t, err, &ve, "a dismissal is no proposal")

	d, err = s.t.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, "A tidy repository", d.Objective.Text)
	require.Equal(t, []string{"Short answers", "No emojis", "Bullet points"}, []string{d.Preferences[0].Title, d.Preferences[1].Title, d.Preferences[2].Title})
	pending, err = s.t.PendingProposals(ctx, 10)
	require.NoError(t, err)
	require.Len(t, pending, 2, "the locked_skip and the removal are left")

	// Back to direct: the tools write again.
	require.NoError(t, s.t.SetAgentWrites(ctx, AgentWritesDirect))
	start, err = s.t.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	view = tools.NewView(start)
	require.Equal(t, "recorded 1 preference", run(tools.AddPreferences, `{"items":[{"title":"Numbered lists"}]}`))
}

// TestParentsChangesAtOnceMakeNoCycle: two threads that name each other as their parent at the
// same moment (PUT a/parents [b] and PUT b/parents [a], or one of them a turn's
// X-Workspace-Parents) never both store their lists (docs/spec.md §17: no cycle): one is
// stored, the other refused as a cycle (a *ParentsError: 400 invalid_parents), and neither fails
// otherwise (a deadlock would be a 500). Thirty pairs of each kind race at once: new threads,
// threads that exist, and a user's change against a new thread's first turn.
func TestParentsChangesAtOnceMakeNoCycle(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := dbtest.NewPool(t, &dbtest.Options{MaxConns: 16})
	store := NewStore(pool, Options{Timeout: time.Minute})
	const pairs = 30
	type pair struct {
		kind string
		a, b *Workspace
		errs [2]error
	}
	var all []*pair
	for _, kind := range []string{"new", "existing", "turn"} {
		for i := range pairs {
			p := &pair{kind: kind, a: store.Workspace(ThreadID{Name: fmt.Sprintf("%s-a%d", kind, i)}),
				b: store.Workspace(ThreadID{Name: fmt.Sprintf("%s-b%d", kind, i)})}
			if kind == "existing" {
				for _, ws := range []*Workspace{p.a, p.b} {
					_, err := ws.SetObjective(ctx, "exists")
					require.NoError(t, err)
				}
			}
			all = append(all, p)
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Go(func() {
			<-start
			p.errs[0] = p.a.SetParents(ctx, []ThreadID{p.b.ThreadID()})
		})
		wg.Go(func() {
			<-start
			if p.kind == "turn" {
				_, p.errs[1] = p.b.StartTurn(ctx, TurnOptions{Parents: []ThreadID{p.a.ThreadID()}})
				return
			}
			p.errs[1] = p.b.SetParents(ctx, []ThreadID{p.a.ThreadID()})
		})
	}
	close(start)
	wg.Wait()
	for _, p := range all {
		stored := 0
		for i, err := range p.errs {
			var pe *ParentsError
			switch {
			case err == nil:
				stored++
			case !errors.As(err, &pe):
				t.Errorf("%s pair %s/%s: side %d failed: %v", p.kind, p.a.ThreadID(), p.b.ThreadID(), i, err)
			}
		}
		if stored != 1 {
			t.Errorf("%s pair %s/%s: %d lists stored, want 1 (errors %v)", p.kind, p.a.ThreadID(), p.b.ThreadID(), stored, p.errs)
		}
	}
	var cycles []string
	rows, err := pool.Query(ctx, `SELECT t.id FROM threads t, thread_scope(t.id, t.parents, NULL) s WHERE s.cycle ORDER BY t.id`)
	require.NoError(t, err)
	cycles, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, cycles, "threads that are their own ancestors")
}

// TestTurnStartWaitsForNoHeldParent: a new thread's first turn that stores its parents does not
// wait for a parent whose row an edit holds (its transaction still open): nor, then, does any
// other thread's turn start that goes in the same batch. The parent exists; the start names it,
// it does not write it.
func TestTurnStartWaitsForNoHeldParent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := dbtest.NewPool(t, &dbtest.Options{MaxConns: 8})
	store := NewStore(pool, Options{Timeout: time.Minute})
	scope := store.Workspace(ThreadID{Name: "held-scope"})
	_, err := scope.AddPreference(ctx, PreferenceInput{Title: "Tabs over spaces"})
	require.NoError(t, err)
	edit, err := pool.Begin(ctx) // a user's edit of the scope, under way: ThreadLockTouch
	require.NoError(t, err)
	defer edit.Rollback(ctx)
	var pid int32
	require.NoError(t, edit.QueryRow(ctx, `UPDATE threads SET updated_at = now() WHERE id = $1 RETURNING pg_backend_pid()`, scope.ThreadID().String()).Scan(&pid))

	type started struct {
		turn TurnStart
		err  error
	}
	done := make(chan started, 1)
	go func() {
		turn, err := store.Workspace(ThreadID{Name: "session"}).StartTurn(ctx, TurnOptions{Parents: []ThreadID{scope.ThreadID()}, ParentsIfNew: true})
		done <- started{turn, err}
	}()
	got := awaitUnblocked(ctx, t, pool, pid, done, "the turn start waits for its parent's row")
	require.NoError(t, got.err)
	require.Equal(t, 1, got.turn.Number)
	require.Contains(t, got.turn.Block(), "From held-scope")
}

// TestGiveBackOfAFirstTurnThatStoredParents: a first turn that stored its parents and never
// reached its model is given back with what its start made (docs/spec.md §2, §17): the thread,
// its parents_set event, and the parents it created that are still empty and named by no other
// thread. A parent that existed, one another thread names, and one a user wrote to since stay.
func TestGiveBackOfAFirstTurnThatStoredParents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := NewStore(dbtest.NewPool(t, nil), Options{})
	ws := func(name string) *Workspace { return store.Workspace(ThreadID{Name: name}) }
	_, err := ws("existing").AddPreference(ctx, PreferenceInput{Title: "Tabs over spaces"})
	require.NoError(t, err)
	parents := []ThreadID{{Name: "new-empty"}, {Name: "existing"}, {Name: "new-shared"}, {Name: "new-written"}}
	start, err := ws("session").StartTurn(ctx, TurnOptions{Parents: parents, ParentsIfNew: true})
	require.NoError(t, err)
	require.Equal(t, 1, start.Number)
	require.NoError(t, ws("other").SetParents(ctx, []ThreadID{{Name: "new-shared"}}))
	_, err = ws("new-written").SetObjective(ctx, "A user's")
	require.NoError(t, err)

	require.NoError(t, ws("session").UndoTurn(ctx, start)) // its first upstream round failed
	for _, th := range []struct {
		name  string
		stays bool
	}{{"session", false}, {"new-empty", false}, {"existing", true}, {"new-shared", true}, {"new-written", true}, {"other", true}} {
		_, err := ws(th.name).Get(ctx)
		switch {
		case th.stays && err != nil:
			t.Errorf("%s should stay: %v", th.name, err)
		case !th.stays && !errors.Is(err, ErrNotFound):
			t.Errorf("%s should be given back with the turn: %v", th.name, err)
		}
	}
}

// TestReviewModeBoundsProposals: in review mode at most MaxPendingProposals (20) proposals wait
// for the user in a workspace (docs/spec.md §17, §19): past them, a call's change is not
// proposed and its result says why; an MCP batch of calls queues no more. A proposal equal to one
// that waits, or to one the user dismissed, is not made again; a newer objective proposal
// replaces the pending one (which then is answered: it no longer applies). A locked item's
// locked_skip past the bound is still recorded, without a proposal to apply.
func TestReviewModeBoundsProposals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := NewStore(dbtest.NewPool(t, nil), Options{})
	ws := store.Workspace(ThreadID{Name: "review"})
	_, err := ws.AddPreference(ctx, PreferenceInput{Title: "No emojis", Locked: true})
	require.NoError(t, err)
	require.NoError(t, ws.SetAgentWrites(ctx, AgentWritesPropose))
	start, err := ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	view := tools.NewView(start)
	run := func(name, args string, mcp bool) string {
		t.Helper()
		c := tools.Call{Turn: start.Number, Round: 1, Name: name, Arguments: args, View: view}
		if mcp {
			c = tools.Call{Name: name, Arguments: args, Via: ViaMCP}
		}
		res, err := tools.Run(ctx, ws, c)
		require.NoError(t, err)
		require.True(t, res.OK, res.Text)
		return res.Text
	}
	items := func(from, to int) string {
		var b strings.Builder
		for i := from; i <= to; i++ {
			if b.Len() > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"title":"Item %d"}`, i)
		}
		return `{"items":[` + b.String() + `]}`
	}
	pending := func() []Event {
		t.Helper()
		evs, err := ws.PendingProposals(ctx, 1000)
		require.NoError(t, err)
		return evs
	}

	text := run(tools.AddPreferences, items(1, 25), false)
	require.Equal(t, 20, len(pending()), "proposals waiting")
	require.True(t, strings.HasPrefix(text, `proposed; the user will review it: add "Item 1"; `), text)
	require.True(t, strings.HasSuffix(text, `add "Item 20"; not proposed: 20 proposals already wait for the user's review: add "Item 21", add "Item 22", add "Item 23", add "Item 24", add "Item 25"`), text)
	for range 5 { // an MCP batch of calls
		require.Equal(t, `nothing to propose; not proposed: 20 proposals already wait for the user's review: add "Item 26"`, run(tools.AddPreferences, items(26, 26), true))
	}
	require.Equal(t, `nothing to propose; not proposed: 20 proposals already wait for the user's review: objective: Tidy`, run(tools.SetObjective, `{"text":"Tidy"}`, false))
	require.Equal(t, `nothing to propose; locked, ask the user to unlock first: #1 "No emojis"`, run(tools.UpdatePreferences, `{"updates":[{"index":1,"title":"Emojis"}]}`, false))
	require.Equal(t, 20, len(pending()), "a locked_skip past the bound keeps no proposal")
	evs, err := ws.Events(ctx, EventQuery{Descending: true, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, LockedSkip, evs[0].Kind, "the locked_skip is recorded")
	require.Nil(t, evs[0].Proposed)

	// The user answers four: one dismissed, three applied.
	waiting := pending()
	_, err = ws.DismissProposal(ctx, waiting[0].ID) // Item 1
	require.NoError(t, err)
	for _, p := range waiting[1:4] { // Items 2 to 4
		_, err = ws.ApplyProposal(ctx, p.ID)
		require.NoError(t, err)
	}
	require.Equal(t, `nothing to propose; already recorded: #2 "Item 2"; dismissed by the user: add "Item 1"; already proposed, for the user to review: add "Item 5"`,
		run(tools.AddPreferences, `{"items":[{"title":"Item 1"},{"title":"Item 2"},{"title":"Item 5"}]}`, true))
	require.Equal(t, `proposed; the user will review it: objective: Tidy`, run(tools.SetObjective, `{"text":"Tidy"}`, false))
	require.Equal(t, `proposed; the user will review it: objective: Tidier; it replaces the objective proposed before`, run(tools.SetObjective, `{"text":"Tidier"}`, false))
	tidy := pending()[16]
	require.JSONEq(t, `{"text":"Tidier"}`, string(tidy.Proposed))
	require.Equal(t, 17, len(pending()), "the replaced proposal no longer waits")
	var ae *AnsweredError
	_, err = ws.ApplyProposal(ctx, tidy.ID-1)
	require.ErrorAs(t, err, &ae, "the replaced proposal no longer applies")
	require.Equal(t, fmt.Sprintf("this proposal was replaced by a newer one (event %d)", tidy.ID), ae.Error())
	require.Equal(t, `proposed; the user will review it: objective: Tidy; it replaces the objective proposed before`, run(tools.SetObjective, `{"text":"Tidy"}`, false),
		"a replaced proposal was not dismissed: it may be made again")
	require.Equal(t, `proposed; the user will review it: add "Item 26"; add "Item 27"; add "Item 28"; not proposed: 20 proposals already wait for the user's review: add "Item 29"`,
		run(tools.AddPreferences, items(26, 29), false))
	require.Equal(t, 20, len(pending()))
}
