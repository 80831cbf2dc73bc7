package db_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
)

// TestUpgradeFromFirstSchema: a database populated under the first schema (001) upgrades to the
// current one with every row kept; what the later migrations add starts empty or at zero.
func TestUpgradeFromFirstSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace"},
		`INSERT INTO threads (id, turns, next_preference_id) VALUES ('old', 3, 3)`,
		`INSERT INTO objectives (thread_id, text, updated_by) VALUES ('old', 'An old goal', 'agent')`,
		`INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES ('old', 1, 'Formal', 'hard', true), ('old', 2, 'Short', 'soft', false)`,
		`INSERT INTO workspace_snapshots (thread_id, turn, objective, preferences) VALUES ('old', 3, 'An old goal', '[{"id":1,"title":"Formal","subtitle":"","kind":"hard","locked":true}]')`,
		`INSERT INTO tool_calls (thread_id, turn, round, tool, arguments, ok, result) VALUES ('old', 3, 1, 'set_objective', '{"text":"An old goal"}', true, '{"ok":true,"result":"objective set: An old goal"}')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	th, err := q.ThreadGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, int32(3), th.Turns)
	require.Equal(t, int64(3), th.NextPreferenceID)
	require.Zero(t, th.PromptTokens+th.CachedPromptTokens+th.CompletionTokens, "usage starts at zero")
	prefs, err := q.PreferenceListByThread(ctx, pool, "old")
	require.NoError(t, err)
	require.Len(t, prefs, 2)
	require.True(t, prefs[0].Locked)
	o, err := q.ObjectiveGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, "An old goal", o.Text)
	calls, err := q.ToolCallListByThread(ctx, pool, db.ToolCallListByThreadParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, calls, 1)
	snaps, err := q.SnapshotListByThread(ctx, pool, db.SnapshotListByThreadParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, snaps, 1)

	// The upgraded database takes the current statements.
	require.NoError(t, q.ThreadUsageAdd(ctx, pool, db.ThreadUsageAddParams{ID: "old", PromptTokens: 5, CachedPromptTokens: 1, CompletionTokens: 2}))
	_, err = q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "old"})
	require.NoError(t, err)
}

// TestUpgradeFromPreviousSchema: a database populated under the previous schema (001 and 002)
// upgrades to the current one with every row kept: its tool calls get an empty call_id, and no
// Responses turn is recorded until the first one runs.
func TestUpgradeFromPreviousSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace", "002_thread_usage"},
		`INSERT INTO threads (id, turns, next_preference_id, prompt_tokens) VALUES ('old', 2, 2, 40)`,
		`INSERT INTO preferences (thread_id, id, title, kind) VALUES ('old', 1, 'Formal', 'hard')`,
		`INSERT INTO tool_calls (thread_id, turn, round, tool, arguments, ok, result) VALUES ('old', 2, 1, 'add_preferences', '{"items":[{"title":"Formal"}]}', true, '{"ok":true,"result":"added"}')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	th, err := q.ThreadGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, int64(40), th.PromptTokens)
	calls, err := q.ToolCallListByThread(ctx, pool, db.ToolCallListByThreadParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, calls, 1)
	require.Equal(t, "", calls[0].CallID, "calls recorded before keep no id")
	rows, err := q.ResponseTurnContinuation(ctx, pool, db.ResponseTurnContinuationParams{ThreadID: "old", ResponseID: "resp_1"})
	require.NoError(t, err)
	require.Empty(t, rows, "no Responses turn recorded yet")

	// The upgraded database takes the current statements.
	require.NoError(t, q.ToolCallInsert(ctx, pool, db.ToolCallInsertParams{ThreadID: "old", Turn: pgtype.Int4{Int32: 3, Valid: true}, Round: pgtype.Int4{Int32: 1, Valid: true}, CallID: "call_x", Tool: "list_preferences",
		Arguments: []byte(`{}`), Ok: true, Result: []byte(`{"ok":true,"result":"#1"}`)}))
	require.NoError(t, q.ResponseTurnRecord(ctx, pool, db.ResponseTurnRecordParams{ThreadID: "old", ResponseID: "resp_1", Turn: 3,
		LastResponseID: "resp_2", OwedCallIds: []string{"call_x", "call_never_run"}}))
	rows, err = q.ResponseTurnContinuation(ctx, pool, db.ResponseTurnContinuationParams{ThreadID: "old", ResponseID: "resp_1"})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	for _, r := range rows {
		require.Equal(t, "resp_2", r.LastResponseID)
		if r.CallID == "call_x" {
			require.JSONEq(t, `{"ok":true,"result":"#1"}`, string(r.Result))
		} else {
			require.Equal(t, "call_never_run", r.CallID)
			require.Nil(t, r.Result)
		}
	}
}

// TestUpgradeToHistory: a database populated under schema 003 upgrades to the current one: its
// threads start with an empty history (next_event_id 1), and the first change writes event 1.
func TestUpgradeToHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses"},
		`INSERT INTO threads (id, turns, next_preference_id) VALUES ('old', 4, 3)`,
		`INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES ('old', 1, 'Formal', 'hard', true), ('old', 2, 'Short', 'soft', false)`,
		`INSERT INTO tool_calls (thread_id, turn, round, call_id, tool, arguments, ok, result) VALUES ('old', 4, 1, 'call_1', 'add_preferences', '{}', true, '{"ok":true}')`,
		`INSERT INTO response_turns (thread_id, response_id, turn, last_response_id) VALUES ('old', 'resp_1', 4, 'resp_2')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	last, err := q.EventLastID(ctx, pool, "old")
	require.NoError(t, err)
	require.Zero(t, last, "an existing thread starts with an empty history")
	rows, err := q.ResponseTurnContinuation(ctx, pool, db.ResponseTurnContinuationParams{ThreadID: "old", ResponseID: "resp_1"})
	require.NoError(t, err)
	require.Equal(t, "resp_2", rows[0].LastResponseID)
	tx, err := db.BeginLocked(ctx, pool, db.LockThreadTouch, "old", false)
	require.NoError(t, err)
	require.Len(t, tx.Preferences, 2)
	var first int64
	require.NoError(t, tx.Commit(ctx, func(b *pgx.Batch) {
		db.QueueEventInsert(b, db.EventInsertParams{ThreadID: "old", Actor: "user", Via: "admin", Kinds: []string{"preference_unlocked"},
			TargetTypes: []string{"preference"}, TargetIds: []int64{1}, Befores: []string{`{"locked":true}`}, Afters: []string{`{"locked":false}`},
			Reverts: []int64{0}}, &first)
	}))
	require.Equal(t, int64(1), first)
}

// TestUpgradeToTurnStart: a database populated under schema 004 upgrades to the current one: its
// snapshots have no version, so the first turn of a thread compares the last snapshot's contents
// — equal: no new copy, the version recorded; different: a new snapshot — and the turns after it
// read the workspace's tables no more while nothing changes.
func TestUpgradeToTurnStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	prefs := `[{"id":1,"title":"Formal","subtitle":"","kind":"hard","locked":true}]`
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('same', 4, 2, 3), ('changed', 2, 2, 2)`,
		`INSERT INTO objectives (thread_id, text, updated_by) VALUES ('same', 'A goal', 'user')`,
		`INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES ('same', 1, 'Formal', 'hard', true), ('changed', 1, 'Formal', 'hard', true)`,
		`INSERT INTO workspace_snapshots (thread_id, turn, objective, preferences) VALUES ('same', 3, 'A goal', '`+prefs+`'), ('changed', 1, NULL, '[]')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	snapshots := func(thread string) []db.WorkspaceSnapshot {
		s, err := q.SnapshotListByThread(ctx, pool, db.SnapshotListByThreadParams{ThreadID: thread, MaxRows: 10})
		require.NoError(t, err)
		return s
	}
	for range 2 {
		start, err := q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "same"})
		require.NoError(t, err)
		require.Equal(t, "A goal", start.Objective.String)
		require.JSONEq(t, prefs, string(start.Preferences))
		s := snapshots("same")
		require.Len(t, s, 1, "the workspace did not change: no new copy")
		require.Equal(t, int32(3), s[0].Turn)
		require.Equal(t, int64(3), s[0].Version.Int64, "the snapshot's version is recorded")
	}
	start, err := q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "changed"})
	require.NoError(t, err)
	require.Equal(t, int32(3), start.Turn)
	require.False(t, start.Objective.Valid)
	require.JSONEq(t, `[{"id":1,"title":"Formal","subtitle":"","kind":"hard","locked":true,"source":"confirmed"}]`, string(start.Preferences),
		"a new snapshot keeps each preference's source (migration 019)")
	s := snapshots("changed")
	require.Len(t, s, 2)
	require.Equal(t, int32(3), s[1].Turn)
	require.Equal(t, int64(2), s[1].Version.Int64)
}

// TestUpgradeToClientResponses: a database populated under schema 005 upgrades to the current
// one (migration 007): no client's response is recorded, so with client keys a continuation of
// a response made before is a 404 until the client makes new ones; a Responses turn recorded
// before still continues on its thread, records its client's ids with the next turn, and the
// history retention prunes both.
func TestUpgradeToClientResponses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('alice~t1', 2, 1, 1)`,
		`INSERT INTO response_turns (thread_id, response_id, turn, last_response_id, created_at) VALUES ('alice~t1', 'resp_old', 1, 'resp_old_last', now() - interval '2 days')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	unknown, err := q.ClientResponseUnknown(ctx, pool, db.ClientResponseUnknownParams{Client: "alice", Ids: []string{"resp_old", "msg_old"}})
	require.NoError(t, err)
	require.Equal(t, []string{"resp_old", "msg_old"}, unknown, "nothing recorded for a client yet")
	rows, err := q.ResponseTurnContinuation(ctx, pool, db.ResponseTurnContinuationParams{ThreadID: "alice~t1", ResponseID: "resp_old"})
	require.NoError(t, err)
	require.Equal(t, "resp_old_last", rows[0].LastResponseID)

	require.NoError(t, db.RecordResponseTurn(ctx, pool, db.ResponseTurnRecordParams{ThreadID: "alice~t1", ResponseID: "resp_new", Turn: 3,
		LastResponseID: "resp_new_last", OwedCallIds: []string{}}, db.ClientResponseRecordParams{Client: "alice", Ids: []string{"resp_new", "msg_new", "resp_new"}}))
	unknown, err = q.ClientResponseUnknown(ctx, pool, db.ClientResponseUnknownParams{Client: "alice", Ids: []string{"resp_new", "msg_new", "resp_old"}})
	require.NoError(t, err)
	require.Equal(t, []string{"resp_old"}, unknown)
	unknown, err = q.ClientResponseUnknown(ctx, pool, db.ClientResponseUnknownParams{Client: "bob", Ids: []string{"resp_new"}})
	require.NoError(t, err)
	require.Equal(t, []string{"resp_new"}, unknown, "another client's")

	day := pgtype.Timestamptz{Time: time.Now().Add(-24 * time.Hour), Valid: true}
	n, err := q.ResponseTurnPrune(ctx, pool, day)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the turn older than the retention")
	n, err = q.ClientResponsePrune(ctx, pool, day)
	require.NoError(t, err)
	require.Zero(t, n)
}

// populate applies the named migrations (as the program would have, recording them) and then
// stmts, on a fresh schema: a database of an earlier version.
func populate(t *testing.T, migrations []string, stmts ...string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	_, cfg := dbtest.Schema(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	all := []string{`CREATE TABLE schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`}
	for _, name := range migrations {
		b, err := os.ReadFile("migration/" + name + ".sql")
		require.NoError(t, err)
		all = append(all, string(b), `INSERT INTO schema_migrations (version) VALUES ('`+name+`')`)
	}
	for _, sql := range append(all, stmts...) {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	return pool
}

// TestUpgradeToBatchesAndTombstones: a database populated under schema 005 upgrades to the
// current one: its threads keep their rows and counters and start without usage marks; a turn
// starts as before (now also saying when its thread was created); a batch of usage counts once
// however often it is sent; and a thread deleted and created again numbers its events and
// preferences on from the deleted one's.
func TestUpgradeToBatchesAndTombstones(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id, prompt_tokens) VALUES ('old', 4, 3, 5, 40)`,
		`INSERT INTO preferences (thread_id, id, title, kind) VALUES ('old', 2, 'Formal', 'hard')`,
		`INSERT INTO events (thread_id, id, actor, kind, target_type, target_id) VALUES ('old', 4, 'user', 'preference_added', 'preference', 2)`,
		`INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences) VALUES ('old', 4, 5, NULL, '[{"id":2,"title":"Formal","subtitle":"","kind":"hard","locked":false}]')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	th, err := q.ThreadGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, int64(40), th.PromptTokens)
	var marks int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM usage_batches`).Scan(&marks))
	require.Zero(t, marks, "no usage marks yet")

	start, err := q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "old"})
	require.NoError(t, err)
	require.Equal(t, int32(5), start.Turn)
	require.JSONEq(t, `[{"id":2,"title":"Formal","subtitle":"","kind":"hard","locked":false}]`, string(start.Preferences))
	require.True(t, start.CreatedAt.Time.Equal(th.CreatedAt.Time))

	for range 2 {
		require.NoError(t, db.AddUsage(ctx, pool, []db.ThreadUsageAddParams{{ID: "old", WriterID: "w", Batch: 1, PromptTokens: 2}}))
	}
	u, err := q.ThreadUsageGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, int64(42), u.PromptTokens, "a batch sent twice counts once")

	n, err := q.ThreadDelete(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	start, err = q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "old"})
	require.NoError(t, err)
	require.Equal(t, int32(1), start.Turn)
	th, err = q.ThreadGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, []int64{5, 3}, []int64{th.NextEventID, th.NextPreferenceID}, "the counters go on from the deleted thread's")
}

// TestUpgradeToMCP: a database populated under schema 007 upgrades to the current one (migration
// 010): its events say the path they came by — the agent's the proxy, the user's the admin REST —
// and keep everything else; its tool calls keep their turns and rounds; no thread has a link. The
// upgraded database takes an MCP call (no turn, via mcp) and issues, checks and revokes links.
func TestUpgradeToMCP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('old', 2, 2, 3)`,
		`INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES ('old', 1, 'Formal', 'hard', true)`,
		`INSERT INTO tool_calls (thread_id, turn, round, call_id, tool, arguments, action_and_reasoning, ok, result)
		 VALUES ('old', 2, 1, 'call_1', 'add_preferences', '{"items":[{"title":"Formal"}]}', 'stated', true, '{"ok":true,"result":"recorded 1 preference"}')`,
		`INSERT INTO events (thread_id, id, actor, turn, round, tool_call_id, reason, kind, target_type, target_id, after)
		 VALUES ('old', 1, 'agent', 2, 1, 1, 'stated', 'preference_added', 'preference', 1, '{"title":"Formal","subtitle":"","kind":"hard","locked":false}')`,
		`INSERT INTO events (thread_id, id, actor, kind, target_type, target_id, before, after)
		 VALUES ('old', 2, 'user', 'preference_locked', 'preference', 1, '{"title":"Formal","subtitle":"","kind":"hard","locked":false}',
		         '{"title":"Formal","subtitle":"","kind":"hard","locked":true}')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	events, err := q.EventList(ctx, pool, db.EventListParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, events, 2)
	require.Equal(t, []string{"proxy", "admin"}, []string{events[0].Via, events[1].Via})
	require.Equal(t, "stated", events[0].Reason.String)
	require.Equal(t, int32(2), events[0].Turn.Int32)
	calls, err := q.ToolCallListByThread(ctx, pool, db.ToolCallListByThreadParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, calls, 1)
	require.Equal(t, pgtype.Int4{Int32: 2, Valid: true}, calls[0].Turn)
	require.Equal(t, pgtype.Int4{Int32: 1, Valid: true}, calls[0].Round)
	links, err := q.LinkListByThread(ctx, pool, db.LinkListByThreadParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Empty(t, links)

	// An MCP call: no turn, its event via mcp.
	tx, err := db.BeginLocked(ctx, pool, db.LockThreadUpsert, "old", false)
	require.NoError(t, err)
	var first int64
	require.NoError(t, tx.Commit(ctx, func(b *pgx.Batch) {
		db.QueueToolCallInsert(b, db.ToolCallInsertParams{ThreadID: "old", Tool: "set_objective", Arguments: []byte(`{"text":"A goal"}`),
			ActionAndReasoning: "named", Ok: true, Result: []byte(`{"ok":true,"result":"objective set: A goal"}`)})
		db.QueueEventInsert(b, db.EventInsertParams{ThreadID: "old", Actor: "agent", Via: "mcp", Kinds: []string{"objective_set"},
			TargetTypes: []string{"objective"}, TargetIds: []int64{0}, Befores: []string{""}, Afters: []string{`{"text":"A goal"}`},
			Reverts: []int64{0}, Reason: pgtype.Text{String: "named", Valid: true}, AfterToolCall: true}, &first)
	}))
	require.Equal(t, int64(3), first)
	ev, err := q.EventGet(ctx, pool, db.EventGetParams{ThreadID: "old", ID: 3})
	require.NoError(t, err)
	require.Equal(t, "mcp", ev.Via)
	require.False(t, ev.Turn.Valid)
	require.Equal(t, int64(2), ev.ToolCallID.Int64)
	calls, err = q.ToolCallListByThread(ctx, pool, db.ToolCallListByThreadParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.False(t, calls[1].Turn.Valid || calls[1].Round.Valid, "an MCP call has no turn")
	_, err = pool.Exec(ctx, `INSERT INTO events (thread_id, id, actor, via, kind, target_type) VALUES ('old', 9, 'user', 'panel', 'revert', 'objective')`)
	require.Error(t, err, "via is proxy, mcp or admin")

	link, err := q.LinkInsert(ctx, pool, db.LinkInsertParams{ThreadID: "old", Kind: "mcp", ExpiresAt: pgtype.Timestamptz{Time: time.Now().Add(time.Hour), Valid: true}})
	require.NoError(t, err)
	valid, err := q.LinkValid(ctx, pool, db.LinkValidParams{ThreadID: "old", ID: link.ID, Kind: "mcp"})
	require.NoError(t, err)
	require.True(t, valid)
	valid, err = q.LinkValid(ctx, pool, db.LinkValidParams{ThreadID: "old", ID: link.ID, Kind: "panel"})
	require.NoError(t, err)
	require.False(t, valid, "a token of one kind is not one of the other")
	n, err := q.LinkDelete(ctx, pool, db.LinkDeleteParams{ThreadID: "old", ID: link.ID})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	valid, err = q.LinkValid(ctx, pool, db.LinkValidParams{ThreadID: "old", ID: link.ID, Kind: "mcp"})
	require.NoError(t, err)
	require.False(t, valid, "revoked")
	_, err = q.LinkInsert(ctx, pool, db.LinkInsertParams{ThreadID: "gone", Kind: "mcp", ExpiresAt: pgtype.Timestamptz{Time: time.Now().Add(time.Hour), Valid: true}})
	require.Error(t, err, "a link needs its thread")
}

// TestUpgradeToProposals: a database populated under schema 007 upgrades to the current one
// (migration 009): its events keep every field; a locked_skip of a removal, known from its tool
// call's record, gets the removal's proposal (the JSON null), one of an update none (its fields
// were not recorded), other events none; new events keep their proposals.
func TestUpgradeToProposals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('old', 2, 2, 5)`,
		`INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES ('old', 1, 'Trains', 'soft', true)`,
		`INSERT INTO tool_calls (thread_id, turn, round, tool, arguments, ok, result)
		 SELECT 'old', 2, 1, 'update_preferences', '{"updates":[{"index":1,"title":"Planes"}]}', true, '{"ok":true}'`,
		`INSERT INTO tool_calls (thread_id, turn, round, tool, arguments, ok, result)
		 SELECT 'old', 2, 1, 'remove_preferences', '{"indices":[1]}', true, '{"ok":true}'`,
		`INSERT INTO events (thread_id, id, actor, kind, target_type, target_id, after) VALUES
		 ('old', 1, 'user', 'preference_added', 'preference', 1, '{"title":"Trains","subtitle":"","kind":"soft","locked":false}'),
		 ('old', 2, 'user', 'preference_locked', 'preference', 1, '{"title":"Trains","subtitle":"","kind":"soft","locked":true}')`,
		`INSERT INTO events (thread_id, id, actor, turn, round, tool_call_id, reason, kind, target_type, target_id, before, after)
		 SELECT 'old', 2 + c.n, 'agent', 2, 1, c.id, 'Why not.', 'locked_skip', 'preference', 1,
		        '{"title":"Trains","subtitle":"","kind":"soft","locked":true}', '{"title":"Trains","subtitle":"","kind":"soft","locked":true}'
		 FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM tool_calls WHERE thread_id = 'old') c`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	evs, err := q.EventList(ctx, pool, db.EventListParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, evs, 4)
	var proposed []string
	for _, e := range evs {
		proposed = append(proposed, string(e.Proposed))
	}
	require.Equal(t, []string{"", "", "", "null"}, proposed, "only the removal's is known")
	require.Equal(t, "Why not.", evs[3].Reason.String)
	require.JSONEq(t, `{"title":"Trains","subtitle":"","kind":"soft","locked":true}`, string(evs[3].Before))

	_, err = q.EventInsert(ctx, pool, db.EventInsertParams{ThreadID: "old", Actor: "user", Via: "admin", Kinds: []string{"locked_skip", "preference_updated"},
		TargetTypes: []string{"preference", "preference"}, TargetIds: []int64{1, 1}, Befores: []string{"{}", "{}"}, Afters: []string{"{}", "{}"},
		Reverts: []int64{0, 0}, Proposals: []string{`{"title":"Planes","subtitle":"","kind":"soft"}`, ""}})
	require.NoError(t, err)
	evs, err = q.EventList(ctx, pool, db.EventListParams{ThreadID: "old", AfterID: 4, MaxRows: 10})
	require.NoError(t, err)
	require.JSONEq(t, `{"title":"Planes","subtitle":"","kind":"soft"}`, string(evs[0].Proposed))
	require.Nil(t, evs[1].Proposed)
}

// TestUpgradeToCacheWrites: a database populated under schema 007 upgrades to the current one:
// its threads keep their usage and start with no cache writes, which the usage statement then
// adds up like the other counts.
func TestUpgradeToCacheWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id, prompt_tokens, cached_prompt_tokens, completion_tokens) VALUES ('old', 4, 3, 5, 40, 30, 7)`,
		`INSERT INTO preferences (thread_id, id, title, kind) VALUES ('old', 2, 'Formal', 'hard')`,
		`INSERT INTO usage_batches (thread_id, writer_id, batch) VALUES ('old', 'w', 1)`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	th, err := q.ThreadGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, []int64{40, 30, 7, 0}, []int64{th.PromptTokens, th.CachedPromptTokens, th.CompletionTokens, th.CacheWriteTokens})
	prefs, err := q.PreferenceListByThread(ctx, pool, "old")
	require.NoError(t, err)
	require.Len(t, prefs, 1)

	for range 2 {
		require.NoError(t, db.AddUsage(ctx, pool, []db.ThreadUsageAddParams{{ID: "old", WriterID: "w", Batch: 2,
			PromptTokens: 100, CachedPromptTokens: 60, CompletionTokens: 5, CacheWriteTokens: 30}}))
	}
	u, err := q.ThreadUsageGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, []int64{140, 90, 12, 30}, []int64{u.PromptTokens, u.CachedPromptTokens, u.CompletionTokens, u.CacheWriteTokens},
		"a batch counts once, its cache writes too")
	_, err = q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "old"})
	require.NoError(t, err)
}

// TestUpgradeToTurnStartUnlessHeld: a database populated under schema 010 upgrades to the current
// one (migration 011): a batch of turn starts numbers its threads' turns on from their counters,
// and begins none of a thread whose row another transaction holds (turn 0) without waiting for
// it, while the others in the batch begin theirs; the held thread's turn then begins on its own
// once the row is released, and a replica of the previous version still starts turns with
// turn_start.
func TestUpgradeToTurnStartUnlessHeld(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('old', 4, 2, 2)`,
		`INSERT INTO preferences (thread_id, id, title, kind) VALUES ('old', 1, 'Formal', 'hard')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	starts := func(threads ...string) []int32 {
		args := make([]db.TurnStartParams, len(threads))
		for i, th := range threads {
			args[i].ThreadID = th
		}
		rows, err := db.TurnStarts(ctx, conn, args)
		require.NoError(t, err)
		turns := make([]int32, len(rows))
		for i, r := range rows {
			turns[i] = r.Turn
		}
		return turns
	}
	require.Equal(t, []int32{5, 1}, starts("old", "new"))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT FROM threads WHERE id = 'old' FOR UPDATE`)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 2, 0}, starts("old", "new", "old"), "held: no turn, and no wait")
	require.Equal(t, []int32{0}, starts("old"))
	require.NoError(t, tx.Rollback(ctx))

	row, err := db.TurnStartWaiting(ctx, pool, db.TurnStartParams{ThreadID: "old"})
	require.NoError(t, err)
	require.Equal(t, int32(6), row.Turn)
	require.JSONEq(t, `[{"id":1,"title":"Formal","subtitle":"","kind":"hard","locked":false,"source":"agent"}]`, string(row.Preferences))
	row, err = db.New().TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "old"})
	require.NoError(t, err)
	require.Equal(t, int32(7), row.Turn)
}

// TestUpgradeWhileReplicasOfThePreviousVersionRun: during a rolling deploy, replicas still on the
// previous version write to the upgraded database as they always did: an event without via (a
// tool call's, the agent's, or a user's edit) and a tool call with its turn and round.
func TestUpgradeWhileReplicasOfThePreviousVersionRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('old', 2, 1, 1)`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	for _, stmt := range []string{
		`INSERT INTO tool_calls (thread_id, turn, round, call_id, tool, arguments, ok, result)
		 VALUES ('old', 3, 1, 'call_1', 'set_objective', '{"text":"A goal"}', true, '{"ok":true}')`,
		`INSERT INTO events (thread_id, id, actor, turn, round, tool_call_id, reason, kind, target_type, after)
		 VALUES ('old', 1, 'agent', 3, 1, 1, 'named', 'objective_set', 'objective', '{"text":"A goal"}')`,
		`INSERT INTO events (thread_id, id, actor, kind, target_type, before, after)
		 VALUES ('old', 2, 'user', 'objective_set', 'objective', '{"text":"A goal"}', '{"text":"Another"}')`,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	events, err := db.New().EventList(ctx, pool, db.EventListParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, events, 2)
	require.Equal(t, "proxy", events[0].Via, "the agent's, of a proxied turn")
}

// migrationFS is a set of migrations of the given SQL, named 001, 002, ….
func migrationFS(sql ...string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for i, s := range sql {
		fsys[fmt.Sprintf("migration/%03d_test.sql", i+1)] = &fstest.MapFile{Data: []byte(s)}
	}
	return fsys
}

// TestMigrationOutlivesTheStatementTimeout: a migration of a large table takes longer than the
// pool's statement_timeout (DATABASE_TIMEOUT), and runs to its end all the same; another replica
// starting meanwhile waits for it (on the migrations' lock, however long), then finds nothing
// left to do.
func TestMigrationOutlivesTheStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, cfg := dbtest.Schema(t)
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "50"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	fsys := migrationFS(`CREATE TABLE big (id int)`, `SELECT pg_sleep(0.5)`)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- db.MigrateFS(ctx, pool, fsys) }()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n))
	require.Equal(t, 2, n)
}

// TestMigrationFailsOnALockItCannotHave: a migration that needs a table another session holds
// (a transaction left open) fails after the migrations' lock_timeout, saying so, rather than
// waiting — with every statement of a turn queued behind it — for as long as that session
// lasts; nothing of it is applied.
func TestMigrationFailsOnALockItCannotHave(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, cfg := dbtest.Schema(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, db.MigrateFS(ctx, pool, migrationFS(`CREATE TABLE held (id int)`)))
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT * FROM held`)
	require.NoError(t, err)

	guard, cancel := context.WithTimeout(ctx, 30*time.Second) // the lock is never released: bounds the wait without the fix
	defer cancel()
	err = db.MigrateFS(guard, pool, migrationFS(`CREATE TABLE held (id int)`, `ALTER TABLE held ADD COLUMN x int`))
	require.Error(t, err)
	require.NoError(t, guard.Err(), "the migration waited for the lock: %v", err)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_not_available")
	require.Contains(t, err.Error(), "002_test")
	require.Contains(t, err.Error(), "locked by another session")
	require.NoError(t, holder.Rollback(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n))
	require.Equal(t, 1, n, "nothing of it was applied")
}

// TestUpgradeToScopes: a database populated under schema 011 (a thread with a snapshot, events of
// every earlier kind, a proposal) upgrades to scopes (012): every thread without parents and with
// agent_writes unset, its snapshot reused by its next turn (no ancestors: nothing changed), its
// events kept, and the new statements work on it.
func TestUpgradeToScopes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp", "011_turn_start_unless_held"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('old', 3, 2, 4)`,
		`INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES ('old', 1, 'Formal', 'hard', true)`,
		`INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences)
		 VALUES ('old', 3, 4, NULL, '[{"id":1,"title":"Formal","subtitle":"","kind":"hard","locked":true}]')`,
		`INSERT INTO events (thread_id, id, actor, via, kind, target_type, target_id, before, after) VALUES
		 ('old', 1, 'user', 'admin', 'preference_added', 'preference', 1, NULL, '{"title":"Formal","subtitle":"","kind":"hard","locked":false}'),
		 ('old', 2, 'user', 'admin', 'preference_locked', 'preference', 1, '{"title":"Formal","subtitle":"","kind":"hard","locked":false}', '{"title":"Formal","subtitle":"","kind":"hard","locked":true}')`,
		`INSERT INTO events (thread_id, id, actor, via, kind, target_type, target_id, before, after, proposed) VALUES
		 ('old', 3, 'agent', 'proxy', 'locked_skip', 'preference', 1, '{"title":"Formal","subtitle":"","kind":"hard","locked":true}', '{"title":"Formal","subtitle":"","kind":"hard","locked":true}', '{"title":"Casual","subtitle":"","kind":"hard"}')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	th, err := q.ThreadGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Empty(t, th.Parents)
	require.False(t, th.AgentWrites.Valid)
	scope, err := q.ThreadScopeGet(ctx, pool, "old")
	require.NoError(t, err)
	require.Equal(t, "direct", scope.AgentWrites)
	require.Empty(t, scope.Ancestors)

	start, err := q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "old"})
	require.NoError(t, err)
	require.Equal(t, int32(4), start.Turn)
	require.Nil(t, start.Inherited)
	snaps, err := q.SnapshotListByThread(ctx, pool, db.SnapshotListByThreadParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, snaps, 1, "the old snapshot still applies: no copy")

	pending, err := q.EventPendingProposals(ctx, pool, db.EventPendingProposalsParams{ThreadID: "old", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, pending, 1, "the locked_skip's proposal is pending")

	// The new statements: parents (a new scope created), and a turn that inherits.
	refused, err := q.ThreadSetParents(ctx, pool, db.ThreadSetParentsParams{ID: "old", Parents: []string{"scope"}, Actor: "user", Via: "admin"})
	require.NoError(t, err)
	require.Empty(t, refused)
	_, err = pool.Exec(ctx, `INSERT INTO preferences (thread_id, id, title, kind) VALUES ('scope', 1, 'Inherited', 'soft')`)
	require.NoError(t, err)
	start, err = q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "old"})
	require.NoError(t, err)
	require.Contains(t, string(start.Inherited), `"Inherited"`)
}

// TestUpgradeToCompaction: a database populated under schema 012 upgrades to the current one with
// its events kept, and takes a client's compaction (thread_compacted): an event of kind
// compaction by the client on the thread, numbered on from the thread's history — past a
// deleted thread's tombstone, and in a thread it creates without a turn — with its NOTIFY; the
// next turn reuses the snapshot, the workspace being unchanged.
func TestUpgradeToCompaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id, parents) VALUES ('pre-013', 3, 2, 4, '{scope}'), ('scope', 0, 1, 1, '{}')`,
		`INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES ('pre-013', 1, 'Formal', 'hard', true)`,
		`INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences, inherited, scope_versions)
		 VALUES ('pre-013', 3, 4, NULL, '[{"id":1,"title":"Formal","subtitle":"","kind":"hard","locked":true}]', '[{"scope":"scope","preferences":[]}]', '{1}')`,
		`INSERT INTO events (thread_id, id, actor, via, kind, target_type, target_id, before, after) VALUES
		 ('pre-013', 1, 'user', 'admin', 'preference_added', 'preference', 1, NULL, '{"title":"Formal","subtitle":"","kind":"hard","locked":false}'),
		 ('pre-013', 2, 'user', 'admin', 'preference_locked', 'preference', 1, '{"title":"Formal","subtitle":"","kind":"hard","locked":false}', '{"title":"Formal","subtitle":"","kind":"hard","locked":true}'),
		 ('pre-013', 3, 'client', 'proxy', 'parents_set', 'thread', NULL, '{"parents":[]}', '{"parents":["scope"]}')`,
		`INSERT INTO thread_tombstones (thread_id, next_event_id, next_preference_id) VALUES ('gone', 7, 3)`,
	)
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	events, err := q.EventList(ctx, pool, db.EventListParams{ThreadID: "pre-013", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, events, 3, "the events stored before")
	require.Equal(t, "parents_set", events[2].Kind)

	id, err := q.EventCompactionInsert(ctx, pool, "pre-013")
	require.NoError(t, err)
	require.Equal(t, int64(4), id, "the thread's next event id")
	ev, err := q.EventGet(ctx, pool, db.EventGetParams{ThreadID: "pre-013", ID: 4})
	require.NoError(t, err)
	require.Equal(t, "compaction", ev.Kind)
	require.Equal(t, "client", ev.Actor)
	require.Equal(t, "proxy", ev.Via)
	require.Equal(t, "thread", ev.TargetType)
	require.False(t, ev.TargetID.Valid)
	require.False(t, ev.Turn.Valid, "a compaction is no turn of the loop")
	require.Nil(t, ev.Before)
	require.Nil(t, ev.After)
	th, err := q.ThreadGet(ctx, pool, "pre-013")
	require.NoError(t, err)
	require.Equal(t, int32(3), th.Turns, "no turn number taken")
	require.Equal(t, int64(5), th.NextEventID)

	// The next turn: the workspace is as the last snapshot holds it (the event changed nothing).
	start, err := q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "pre-013"})
	require.NoError(t, err)
	require.Equal(t, int32(4), start.Turn)
	snaps, err := q.SnapshotListByThread(ctx, pool, db.SnapshotListByThreadParams{ThreadID: "pre-013", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, snaps, 1, "no copy of an unchanged workspace")

	// A thread it creates: no turn, its ids past its tombstone; and one that never existed.
	id, err = q.EventCompactionInsert(ctx, pool, "gone")
	require.NoError(t, err)
	require.Equal(t, int64(7), id, "past the tombstone")
	th, err = q.ThreadGet(ctx, pool, "gone")
	require.NoError(t, err)
	require.Zero(t, th.Turns)
	require.Equal(t, int64(3), th.NextPreferenceID)
	id, err = q.EventCompactionInsert(ctx, pool, "new")
	require.NoError(t, err)
	require.Equal(t, int64(1), id)

	// The check still refuses a kind it does not name.
	_, err = pool.Exec(ctx, `INSERT INTO events (thread_id, id, actor, kind, target_type) VALUES ('new', 2, 'client', 'compacted', 'thread')`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "events_kind_check", pgErr.ConstraintName)
}

// TestUpgradeToTurnUndo: a database populated under schema 013 upgrades to the current one, and
// gives back a turn that never reached its model (turn_undo): its number only while it is the
// thread's latest, its snapshot, and the thread when the turn made it and nothing names it or was
// written to it since.
func TestUpgradeToTurnUndo(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id, parents) VALUES
		 ('pre-014', 2, 1, 1, '{}'), ('fresh', 1, 1, 1, '{}'), ('scope', 1, 1, 1, '{}'), ('child', 3, 1, 1, '{scope}')`,
		`INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences) VALUES
		 ('pre-014', 1, 1, NULL, '[]'), ('pre-014', 2, 1, 'Ship', '[]'), ('fresh', 1, 1, NULL, '[]')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))
	q := db.New()
	turns := func(thread string) (int, bool) {
		var n int
		err := pool.QueryRow(ctx, `SELECT turns FROM threads WHERE id = $1`, thread).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, false
		}
		require.NoError(t, err)
		return n, true
	}
	undo := func(thread string, turn int32) error { // the thread as it stands (migration 017: the thread the turn began on)
		var created pgtype.Timestamptz
		err := pool.QueryRow(ctx, `SELECT created_at FROM threads WHERE id = $1`, thread).Scan(&created)
		if !errors.Is(err, pgx.ErrNoRows) {
			require.NoError(t, err)
		}
		return q.TurnUndo(ctx, pool, db.TurnUndoParams{ThreadID: thread, Turn: turn, CreatedAt: created})
	}
	snapshots := func(thread string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM workspace_snapshots WHERE thread_id = $1`, thread).Scan(&n))
		return n
	}

	require.NoError(t, undo("pre-014", 1))
	n, _ := turns("pre-014")
	require.Equal(t, 2, n, "a turn a later one followed keeps its number")
	require.NoError(t, undo("pre-014", 2))
	n, ok := turns("pre-014")
	require.True(t, ok)
	require.Equal(t, 1, n)
	require.Equal(t, 1, snapshots("pre-014"), "its snapshot goes, the earlier one stays")

	require.NoError(t, undo("fresh", 1))
	_, ok = turns("fresh")
	require.False(t, ok, "the thread its first turn made goes with it")
	require.Zero(t, snapshots("fresh"))
	require.NoError(t, undo("scope", 1))
	n, ok = turns("scope")
	require.True(t, ok, "a thread another names as its parent stays")
	require.Zero(t, n)
	require.NoError(t, undo("gone", 1), "no thread: nothing to give back")
}

// TestUpgradeToToolCallInOneRoundTrip: a database populated under schema 014 upgrades to the
// current one (migration 015). A turn's start then also says the workspace's version and the
// thread's next preference id, on the fast path and through turn_start alike; a call guarded by
// that version writes, and one guarded by a version the workspace moved past writes nothing
// (ErrGuardRefused). A replica of the previous version, whose connection prepared its turn start
// before the upgrade, still starts turns.
func TestUpgradeToToolCallInOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('unchanged', 2, 3, 5), ('changed', 1, 2, 4)`,
		`INSERT INTO preferences (thread_id, id, title, kind) VALUES ('unchanged', 2, 'Formal', 'hard'), ('changed', 1, 'Brief', 'soft')`,
		`INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences) VALUES
		 ('unchanged', 2, 5, NULL, '[{"id":2,"title":"Formal","subtitle":"","kind":"hard","locked":false}]'),
		 ('changed', 1, 3, NULL, '[]')`,
	)
	old, err := pool.Acquire(ctx) // a replica of the previous version: its statement prepared before the upgrade
	require.NoError(t, err)
	defer old.Release()
	const oldStart = `SELECT coalesce(turn, 0)::integer AS turn, objective, preferences, created_at, inherited, agent_writes, refused
		FROM turn_start_unless_held($1, NULL::text[], false)`
	var turn int32
	skip := []any{&turn, new(any), new(any), new(any), new(any), new(any), new(any)}
	require.NoError(t, old.QueryRow(ctx, oldStart, "old-replica").Scan(skip...))
	require.Equal(t, int32(1), turn)
	require.NoError(t, db.Migrate(ctx, pool))
	require.NoError(t, old.QueryRow(ctx, oldStart, "old-replica").Scan(skip...), "the previous version's prepared turn start")
	require.Equal(t, int32(2), turn)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	rows, err := db.TurnStarts(ctx, conn, []db.TurnStartParams{{ThreadID: "unchanged"}, {ThreadID: "changed"}, {ThreadID: "new"}})
	require.NoError(t, err)
	for i, want := range []struct {
		turn            int32
		version, nextID int64
	}{{3, 5, 3}, {2, 4, 2}, {1, 1, 1}} {
		require.Equal(t, want.turn, rows[i].Turn, i)
		require.Equal(t, want.version, rows[i].Version, "version %d", i)
		require.Equal(t, want.nextID, rows[i].NextPreferenceID, "next preference id %d", i)
	}
	row, err := db.New().TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "changed"})
	require.NoError(t, err)
	require.Equal(t, int64(4), row.Version)
	require.Equal(t, int64(2), row.NextPreferenceID)

	guarded := func(version int64) error {
		return db.SendGuarded(ctx, pool, db.ToolCallGuardParams{ThreadID: "unchanged", CreatedAt: rows[0].CreatedAt, Version: version},
			func(b *pgx.Batch) {
				db.QueuePreferenceDeleteUnlocked(b, db.PreferenceDeleteUnlockedParams{ThreadID: "unchanged", Ids: []int64{2}},
					func([]int64) error { return nil })
			})
	}
	count := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM preferences WHERE thread_id = 'unchanged'`).Scan(&n))
		return n
	}
	require.ErrorIs(t, guarded(4), db.ErrGuardRefused)
	require.Equal(t, 1, count(), "a call planned on an older version writes nothing")
	require.NoError(t, guarded(5))
	require.Zero(t, count())
}

// TestUpgradeToUsagePerWriter: a database populated under schema 015 upgrades to the current one
// (migration 016). A thread's usage is what its row counted before, plus what each writer counts
// since in its own row, once per batch; a replica of the previous version, which still counts
// into the thread's row (and its marks), adds to the same total.
func TestUpgradeToUsagePerWriter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo", "015_tool_call_in_one_round_trip"},
		`INSERT INTO threads (id, prompt_tokens, cached_prompt_tokens, completion_tokens, cache_write_tokens) VALUES ('old', 40, 30, 7, 2)`,
		`INSERT INTO usage_batches (thread_id, writer_id, batch) VALUES ('old', 'w', 1)`,
	)
	require.NoError(t, db.Migrate(ctx, pool))
	q := db.New()
	usage := func() []int64 {
		u, err := q.ThreadUsageGet(ctx, pool, "old")
		require.NoError(t, err)
		return []int64{u.PromptTokens, u.CachedPromptTokens, u.CompletionTokens, u.CacheWriteTokens}
	}
	require.Equal(t, []int64{40, 30, 7, 2}, usage(), "what the thread's row counted")
	for range 2 {
		require.NoError(t, db.AddUsage(ctx, pool, []db.ThreadUsageAddParams{{ID: "old", WriterID: "w", Batch: 1,
			PromptTokens: 100, CachedPromptTokens: 60, CompletionTokens: 5, CacheWriteTokens: 30}}))
	}
	require.Equal(t, []int64{140, 90, 12, 32}, usage(), "a batch counts once")
	// The previous version's usage statement, in essence: the thread's row and its mark.
	_, err := pool.Exec(ctx, `UPDATE threads SET prompt_tokens = prompt_tokens + 1 WHERE id = 'old'`)
	require.NoError(t, err)
	require.Equal(t, []int64{141, 90, 12, 32}, usage())
	require.NoError(t, db.AddUsage(ctx, pool, []db.ThreadUsageAddParams{{ID: "gone", WriterID: "w", Batch: 2, PromptTokens: 1}}),
		"a thread that does not exist is skipped")
}

// TestUpgradeToParentsLocksAndTurnGiveBacks: a database populated under schema 016 upgrades to
// the current one (migration 017), which changes functions alone. A replica of the previous
// version, whose connection prepared its turn start before the upgrade, still starts turns, and
// still gives a turn back by its number (turn_undo(text, integer)). Two threads left naming each
// other (a cycle two parents changes made at once before) still start turns, and a change of
// parents among them takes its keys and ends; the current give-back names the thread's life
// (created_at) and takes with it a first turn's thread, its client's parents_set and the empty
// parent made with it.
func TestUpgradeToParentsLocksAndTurnGiveBacks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo", "015_tool_call_in_one_round_trip",
		"016_usage_per_writer"},
		`INSERT INTO threads (id, turns, parents) VALUES ('a', 1, '{b}'), ('b', 1, '{a}'), ('old', 2, '{}')`,
		`INSERT INTO preferences (thread_id, id, title, kind) VALUES ('b', 1, 'Formal', 'hard')`,
	)
	old, err := pool.Acquire(ctx) // a replica of the previous version: its statements prepared before the upgrade
	require.NoError(t, err)
	defer old.Release()
	const oldStart = `SELECT coalesce(turn, 0)::integer AS turn, objective, preferences, created_at, inherited, agent_writes, refused, version, next_preference_id
		FROM turn_start_unless_held($1, NULL::text[], false)`
	var turn int32
	skip := []any{&turn, new(any), new(any), new(any), new(any), new(any), new(any), new(any), new(any)}
	require.NoError(t, old.QueryRow(ctx, oldStart, "old").Scan(skip...))
	require.Equal(t, int32(3), turn)
	require.NoError(t, db.Migrate(ctx, pool))
	require.NoError(t, old.QueryRow(ctx, oldStart, "old").Scan(skip...), "the previous version's prepared turn start")
	require.Equal(t, int32(4), turn)
	_, err = old.Exec(ctx, `SELECT turn_undo('old', 4)`)
	require.NoError(t, err, "the previous version's give-back")
	var turns int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT turns FROM threads WHERE id = 'old'`).Scan(&turns))
	require.Equal(t, int32(3), turns)

	q := db.New()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	rows, err := db.TurnStarts(ctx, conn, []db.TurnStartParams{{ThreadID: "a"}, {ThreadID: "b"}})
	require.NoError(t, err)
	require.Equal(t, []int32{2, 2}, []int32{rows[0].Turn, rows[1].Turn}, "threads of a cycle start their turns")
	require.JSONEq(t, `[{"scope":"b","preferences":[{"id":1,"title":"Formal","subtitle":"","kind":"hard","locked":false,"source":"agent"}]}]`, string(rows[0].Inherited))
	tx, err := db.BeginParentsLocked(ctx, pool, "a", []string{})
	require.NoError(t, err, "the keys of a change among a cycle")
	refused, err := q.ThreadSetParents(ctx, tx.Conn(), db.ThreadSetParentsParams{ID: "a", Parents: []string{}, Actor: "user", Via: "admin"})
	require.NoError(t, err)
	require.Empty(t, refused)
	require.NoError(t, tx.Commit(ctx, nil))

	start, err := q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "session", Parents: []string{"new-scope", "b"}, ParentsIfNew: true})
	require.NoError(t, err)
	require.Equal(t, int32(1), start.Turn)
	require.NoError(t, q.TurnUndo(ctx, pool, db.TurnUndoParams{ThreadID: "session", Turn: 1, CreatedAt: start.CreatedAt}))
	var left []string
	r, err := pool.Query(ctx, `SELECT id FROM threads ORDER BY id`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "old"}, left, "the first turn's thread and the empty scope made with it are given back")
}

// TestUpgradeToNoNotifyInWrites: after migration 018 no function of the schema, and no query
// wsproxy sends, calls pg_notify (docs/spec.md §13: no workspace write takes a lock shared by the
// whole database); upgraded from a database populated under 017, a parents change and a client's
// compaction still append their events, in the thread's order.
func TestUpgradeToNoNotifyInWrites(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo", "015_tool_call_in_one_round_trip",
		"016_usage_per_writer", "017_parents_locks_and_turn_give_backs"},
		`INSERT INTO threads (id, turns, next_event_id) VALUES ('a', 1, 3), ('b', 0, 1)`,
		`INSERT INTO events (thread_id, id, at, actor, via, kind, target_type, after) VALUES
		   ('a', 1, now(), 'user', 'admin', 'objective_set', 'objective', '{"text":"x"}'),
		   ('a', 2, now(), 'user', 'admin', 'objective_set', 'objective', '{"text":"y"}')`,
	)
	var notifying int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = current_schema() AND p.prosrc ILIKE '%pg_notify%'`).Scan(&notifying))
	require.Equal(t, 2, notifying, "017's thread_set_parents and thread_compacted notify")
	require.NoError(t, db.Migrate(ctx, pool))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = current_schema() AND p.prosrc ILIKE '%pg_notify%'`).Scan(&notifying))
	require.Zero(t, notifying, "no function of the schema notifies")

	tx, err := db.BeginParentsLocked(ctx, pool, "a", []string{"b"})
	require.NoError(t, err)
	refused, err := db.New().ThreadSetParents(ctx, tx.Conn(), db.ThreadSetParentsParams{ID: "a", Parents: []string{"b"}, Actor: "user", Via: "admin"})
	require.NoError(t, err)
	require.Empty(t, refused)
	require.NoError(t, tx.Commit(ctx, func(*pgx.Batch) {}))
	id, err := db.New().EventCompactionInsert(ctx, pool, "a")
	require.NoError(t, err)
	require.Equal(t, int64(4), id)
	var kinds []string
	rows, err := pool.Query(ctx, `SELECT kind FROM events WHERE thread_id = 'a' ORDER BY id`)
	require.NoError(t, err)
	kinds, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"objective_set", "objective_set", "parents_set", "compaction"}, kinds)

	// Nor does any query wsproxy sends (the generated code holds every one).
	files, err := filepath.Glob("*.sql.go")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NotContains(t, strings.ToLower(string(b)), "pg_notify", f)
	}
}

// TestUpgradeToProvenance: a database populated under schema 018 upgrades to the current one
// (migration 019, docs/spec.md §19): each preference and objective takes its source from the
// last event that wrote its text (the user's 'user', or 'confirmed' when it applied a proposal;
// the agent's 'agent', 'confirmed' once the user locked it; none kept: 'agent', or 'confirmed'
// when locked); threads start neither tainted nor known clients of their own tools, and inherit
// untrusted_writes like agent_writes; a turn start stores what its request read and says what
// the thread had before; the snapshot stored before is reused while the workspace is the same;
// and a replica of the previous version still starts its turns with its prepared statement,
// and adds preferences and events as it did.
func TestUpgradeToProvenance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo", "015_tool_call_in_one_round_trip",
		"016_usage_per_writer", "017_parents_locks_and_turn_give_backs", "018_no_notify_in_writes"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id, agent_writes) VALUES ('t', 3, 7, 10, NULL), ('scope', 0, 1, 1, NULL), ('o2', 1, 1, 2, NULL), ('o3', 1, 1, 3, NULL)`,
		`UPDATE threads SET parents = '{scope}' WHERE id = 't'`,
		`INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES
		 ('t', 1, 'Tabs', 'hard', false), ('t', 2, 'Short', 'soft', false), ('t', 3, 'Formal', 'soft', true),
		 ('t', 4, 'Proposed', 'soft', false), ('t', 5, 'Ancient', 'soft', false), ('t', 6, 'Edited', 'soft', false)`,
		`INSERT INTO objectives (thread_id, text, updated_by) VALUES ('t', 'A user goal', 'user'), ('o2', 'An agent goal', 'agent'), ('o3', 'An applied goal', 'user')`,
		`INSERT INTO events (thread_id, id, actor, via, kind, target_type, target_id, before, after, proposed, answers) VALUES
		 ('t', 1, 'user', 'admin', 'preference_added', 'preference', 1, NULL, '{"title":"Tabs","subtitle":"","kind":"hard","locked":false}', NULL, NULL),
		 ('t', 2, 'agent', 'proxy', 'preference_added', 'preference', 2, NULL, '{"title":"Short","subtitle":"","kind":"soft","locked":false}', NULL, NULL),
		 ('t', 3, 'agent', 'proxy', 'preference_added', 'preference', 3, NULL, '{"title":"Formal","subtitle":"","kind":"soft","locked":false}', NULL, NULL),
		 ('t', 4, 'user', 'admin', 'preference_locked', 'preference', 3, '{"title":"Formal","subtitle":"","kind":"soft","locked":false}', '{"title":"Formal","subtitle":"","kind":"soft","locked":true}', NULL, NULL),
		 ('t', 5, 'agent', 'proxy', 'proposed', 'preference', NULL, NULL, NULL, '{"title":"Proposed","subtitle":"","kind":"soft"}', NULL),
		 ('t', 6, 'user', 'admin', 'preference_added', 'preference', 4, NULL, '{"title":"Proposed","subtitle":"","kind":"soft","locked":false}', NULL, 5),
		 ('t', 7, 'agent', 'proxy', 'preference_added', 'preference', 6, NULL, '{"title":"Edit me","subtitle":"","kind":"soft","locked":false}', NULL, NULL),
		 ('t', 8, 'user', 'admin', 'preference_updated', 'preference', 6, '{"title":"Edit me","subtitle":"","kind":"soft","locked":false}', '{"title":"Edited","subtitle":"","kind":"soft","locked":false}', NULL, NULL),
		 ('t', 9, 'user', 'admin', 'objective_set', 'objective', NULL, NULL, '{"text":"A user goal"}', NULL, NULL),
		 ('o2', 1, 'agent', 'proxy', 'objective_set', 'objective', NULL, NULL, '{"text":"An agent goal"}', NULL, NULL),
		 ('o3', 1, 'agent', 'proxy', 'proposed', 'objective', NULL, NULL, NULL, '{"text":"An applied goal"}', NULL),
		 ('o3', 2, 'user', 'admin', 'objective_set', 'objective', NULL, NULL, '{"text":"An applied goal"}', NULL, 1)`,
		`INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences, inherited, scope_versions) VALUES
		 ('o2', 1, 2, 'An agent goal', '[]', NULL, '{}')`,
	)
	old, err := pool.Acquire(ctx) // a replica of the previous version: its statement prepared before the upgrade
	require.NoError(t, err)
	defer old.Release()
	const oldStart = `SELECT coalesce(turn, 0)::integer AS turn, objective, preferences, created_at, inherited, agent_writes, refused, version, next_preference_id
		FROM turn_start_unless_held($1, NULL::text[], false)`
	var turn int32
	skip := []any{&turn, new(any), new(any), new(any), new(any), new(any), new(any), new(any), new(any)}
	require.NoError(t, old.QueryRow(ctx, oldStart, "o3").Scan(skip...))
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	prefs, err := q.PreferenceListByThread(ctx, pool, "t")
	require.NoError(t, err)
	sources := map[string]string{}
	for _, p := range prefs {
		sources[p.Title] = p.Source
	}
	require.Equal(t, map[string]string{"Tabs": "user", "Short": "agent", "Formal": "confirmed", "Proposed": "confirmed",
		"Ancient": "agent", "Edited": "user"}, sources)
	for thread, want := range map[string]string{"t": "user", "o2": "agent", "o3": "confirmed"} {
		o, err := q.ObjectiveGet(ctx, pool, thread)
		require.NoError(t, err)
		require.Equal(t, want, o.Source, thread)
	}
	th, err := q.ThreadGet(ctx, pool, "t")
	require.NoError(t, err)
	require.False(t, th.Tainted || th.ClientTools || th.UntrustedWrites.Valid, "what earlier turns read was not classified")

	// untrusted_writes is inherited like agent_writes, and set with an event of its own.
	_, err = pool.Exec(ctx, `UPDATE threads SET untrusted_writes = 'apply' WHERE id = 'scope'`)
	require.NoError(t, err)
	tx, err := db.BeginLocked(ctx, pool, db.LockThread, "t", true)
	require.NoError(t, err)
	require.Equal(t, "apply", tx.Scope.UntrustedWrites)
	require.False(t, tx.Scope.OwnUntrustedWrites.Valid)
	require.Equal(t, "user", tx.ObjectiveSource)
	require.NoError(t, q.ThreadSetUntrustedWrites(ctx, tx.Conn(), db.ThreadSetUntrustedWritesParams{ID: "t", UntrustedWrites: pgtype.Text{String: "refuse", Valid: true}}))
	require.NoError(t, tx.Commit(ctx, func(b *pgx.Batch) {
		db.QueueEventInsert(b, db.EventInsertParams{ThreadID: "t", Actor: "user", Via: "admin", Kinds: []string{"untrusted_writes_set"},
			TargetTypes: []string{"thread"}, TargetIds: []int64{0}, Befores: []string{`{"untrusted_writes":null}`}, Afters: []string{`{"untrusted_writes":"refuse"}`},
			Reverts: []int64{0}, Proposals: []string{""}, Answers: []int64{0}, Moves: []string{""}}, nil)
	}))
	scope, err := db.BeginLocked(ctx, pool, db.LockThread, "scope", true)
	require.NoError(t, err)
	require.True(t, scope.Scope.InheritedBy, "t names it among its parents")
	scope.Rollback(ctx)

	// A turn start stores what its request read, and says what the thread had before: on its own,
	// in a batch, and by the statement's own fast part.
	start, err := q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: "t", ReadsUntrusted: true})
	require.NoError(t, err)
	require.False(t, start.Tainted)
	require.Equal(t, "user", start.ObjectiveSource)
	require.Contains(t, string(start.Preferences), `"source": "confirmed"`)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	rows, err := db.TurnStarts(ctx, conn, []db.TurnStartParams{{ThreadID: "t", HasClientTools: true}, {ThreadID: "o2"}})
	require.NoError(t, err)
	require.True(t, rows[0].Tainted, "a thread stays tainted")
	require.False(t, rows[0].ClientTools)
	require.Empty(t, rows[1].ObjectiveSource, "the snapshot stored before, reused, keeps none")
	snaps, err := q.SnapshotListByThread(ctx, pool, db.SnapshotListByThreadParams{ThreadID: "o2", MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, snaps, 1, "the snapshot stored before is the workspace's, without sources")
	rows, err = db.TurnStarts(ctx, conn, []db.TurnStartParams{{ThreadID: "t"}})
	require.NoError(t, err)
	require.True(t, rows[0].Tainted)
	require.True(t, rows[0].ClientTools)

	// The previous version's replica: its prepared turn start, a preference and an event as it
	// adds them (sources and context left to their defaults).
	require.NoError(t, old.QueryRow(ctx, oldStart, "o3").Scan(skip...), "the previous version's prepared turn start")
	require.Equal(t, int32(3), turn)
	_, err = old.Exec(ctx, `INSERT INTO preferences (thread_id, id, title, kind, locked) VALUES ('o3', 1, 'Old', 'soft', false)`)
	require.NoError(t, err)
	_, err = old.Exec(ctx, `INSERT INTO events (thread_id, id, actor, via, kind, target_type, target_id, after) VALUES ('o3', 3, 'agent', 'proxy', 'preference_added', 'preference', 1, '{"title":"Old","subtitle":"","kind":"soft","locked":false}')`)
	require.NoError(t, err)
	prefs, err = q.PreferenceListByThread(ctx, pool, "o3")
	require.NoError(t, err)
	require.Equal(t, "agent", prefs[0].Source)
	ev, err := q.EventGet(ctx, pool, db.EventGetParams{ThreadID: "o3", ID: 3})
	require.NoError(t, err)
	require.Nil(t, ev.Context)
}

// TestUpgradeToClients: 020 adds the clients' tables (docs/spec.md §20) beside a populated
// database; nothing stored changes, and keys are refused unless hashed, names unless §2's.
func TestUpgradeToClients(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo", "015_tool_call_in_one_round_trip",
		"016_usage_per_writer", "017_parents_locks_and_turn_give_backs", "018_no_notify_in_writes", "019_provenance"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id) VALUES ('alice~t1', 2, 1, 1)`,
	)
	require.NoError(t, db.Migrate(ctx, pool))
	q := db.New()
	th, err := q.ThreadGet(ctx, pool, "alice~t1")
	require.NoError(t, err)
	require.Equal(t, int32(2), th.Turns)
	exist, err := q.ClientsExist(ctx, pool)
	require.NoError(t, err)
	require.False(t, exist, "no client until one is made or seeded")
	v, err := q.ClientsVersion(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, v)

	_, err = q.ClientCreate(ctx, pool, db.ClientCreateParams{Name: "alice"})
	require.NoError(t, err)
	hash := make([]byte, 32)
	_, err = q.ClientKeyInsert(ctx, pool, db.ClientKeyInsertParams{Client: "alice", Hash: hash, Prefix: "wsp_abcd"})
	require.NoError(t, err)
	_, err = q.ClientKeyInsert(ctx, pool, db.ClientKeyInsertParams{Client: "alice", Hash: []byte("a key, not a hash"), Prefix: "wsp_"})
	require.Error(t, err, "only a 32-byte hash is kept")
	_, err = q.ClientKeyInsert(ctx, pool, db.ClientKeyInsertParams{Client: "alice", Hash: make([]byte, 32), Prefix: "wsp_"})
	require.Error(t, err, "a hash is unique")
	_, err = q.ClientKeyInsert(ctx, pool, db.ClientKeyInsertParams{Client: "alice", Hash: append(make([]byte, 31), 1), Prefix: "wsp_abcde"})
	require.Error(t, err, "a prefix is 8 characters at most")
	_, err = q.ClientCreate(ctx, pool, db.ClientCreateParams{Name: "al~ice"})
	require.Error(t, err, "§2's client names")
	require.NoError(t, q.ClientsBump(ctx, pool))
	v, err = q.ClientsVersion(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, int64(1), v)
	live, err := q.ClientKeysLive(ctx, pool)
	require.NoError(t, err)
	require.Len(t, live, 1)
}

// TestUpgradeToClientUsage: a database populated under the previous schema upgrades to the
// current one (migration 021, docs/spec.md §20): the clients' usage is written per writer and
// window, a write sent again changes nothing, and each writer reads the others' sums of the
// current windows; a client's threads are counted in its namespace alone.
func TestUpgradeToClientUsage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo", "015_tool_call_in_one_round_trip",
		"016_usage_per_writer", "017_parents_locks_and_turn_give_backs", "018_no_notify_in_writes", "019_provenance", "020_clients"},
		`INSERT INTO threads (id) VALUES ('alice~a'), ('alice~b'), ('alicia~c'), ('bob~a')`,
	)
	require.NoError(t, db.Migrate(ctx, pool))
	q := db.New()
	now := time.Now().UTC()
	minute := pgtype.Timestamptz{Time: now.Truncate(time.Minute), Valid: true}
	day := pgtype.Timestamptz{Time: now.Truncate(24 * time.Hour), Valid: true}
	write := func(writer string, requests, tokens int64) []db.ClientUsageSyncRow {
		rows, err := q.ClientUsageSync(ctx, pool, db.ClientUsageSyncParams{WriterID: writer, Minute: minute, Day: day,
			Clients: []string{"alice", "alice"}, Periods: []string{"minute", "day"}, Starts: []pgtype.Timestamptz{minute, day},
			Requests: []int64{requests, requests}, Tokens: []int64{0, tokens}})
		require.NoError(t, err)
		return rows
	}
	require.Empty(t, write("w1", 2, 10))
	require.Empty(t, write("w1", 2, 10), "sent again")
	got := write("w2", 1, 5)
	require.ElementsMatch(t, []db.ClientUsageSyncRow{{Client: "alice", Period: "minute", Requests: 2}, {Client: "alice", Period: "day", Requests: 2, Tokens: 10}}, got)
	got = write("w3", 0, 0)
	require.ElementsMatch(t, []db.ClientUsageSyncRow{{Client: "alice", Period: "minute", Requests: 3}, {Client: "alice", Period: "day", Requests: 3, Tokens: 15}}, got)
	require.NoError(t, q.ClientUsagePrune(ctx, pool))
	require.Len(t, write("w4", 0, 0), 2, "the current windows are kept")

	n, err := q.ClientThreadCount(ctx, pool, db.ClientThreadCountParams{ThreadID: "alice~b", Prefix: "alice~"})
	require.NoError(t, err)
	require.Equal(t, db.ClientThreadCountRow{Threads: 2, Exists: true}, n, "alicia's thread is not alice's")
	n, err = q.ClientThreadCount(ctx, pool, db.ClientThreadCountParams{ThreadID: "carol~x", Prefix: "carol~"})
	require.NoError(t, err)
	require.Equal(t, db.ClientThreadCountRow{}, n)
}

// TestUpgradeToSharedScopes: a database populated under schema 019 upgrades to migration 022
// (docs/spec.md §20): no workspace is shared, and what every thread inherited it still inherits
// (a client's thread its client's scopes, the admin's its own); a client's thread that names a
// workspace of the admin's inherits it only while it is shared with its client ('*': every
// client), and never another client's thread through it; a client's parent of the admin's not
// shared with it is refused and creates nothing; shared_with_set is an event; and a replica of
// the previous version still starts its turns with its prepared statement.
func TestUpgradeToSharedScopes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo", "015_tool_call_in_one_round_trip",
		"016_usage_per_writer", "017_parents_locks_and_turn_give_backs", "018_no_notify_in_writes", "019_provenance", "020_clients", "021_client_usage"},
		`INSERT INTO threads (id, turns, next_preference_id, next_event_id, parents) VALUES
		 ('repo-x', 0, 2, 1, '{bob~secret}'), ('app', 1, 1, 1, '{repo-x}'),
		 ('alice~me', 0, 2, 1, '{}'), ('alice~t1', 1, 1, 1, '{alice~me}'), ('bob~secret', 0, 2, 1, '{}'), ('bob~t', 1, 1, 1, '{repo-x}')`,
		`INSERT INTO preferences (thread_id, id, title, kind) VALUES ('repo-x', 1, 'Go 1.26', 'hard'), ('alice~me', 1, 'Tabs', 'soft'),
		 ('bob~secret', 1, 'Secret', 'soft')`,
	)
	old, err := pool.Acquire(ctx) // a replica of the previous version: its statement prepared before the upgrade
	require.NoError(t, err)
	defer old.Release()
	const oldStart = `SELECT coalesce(turn, 0)::integer AS turn, inherited FROM turn_start_unless_held($1, NULL::text[], false)`
	var turn int32
	var inherited []byte
	require.NoError(t, old.QueryRow(ctx, oldStart, "alice~t1").Scan(&turn, &inherited))
	require.NoError(t, db.Migrate(ctx, pool))

	q := db.New()
	th, err := q.ThreadGet(ctx, pool, "repo-x")
	require.NoError(t, err)
	require.Empty(t, th.SharedWith, "no workspace is shared")
	scopes := func(thread string) string {
		t.Helper()
		start, err := q.TurnStart(ctx, pool, db.TurnStartParams{ThreadID: thread})
		require.NoError(t, err)
		var got []struct{ Scope string }
		if len(start.Inherited) > 0 { // NULL: no ancestors
			require.NoError(t, json.Unmarshal(start.Inherited, &got))
		}
		names := make([]string, len(got))
		for i, s := range got {
			names[i] = s.Scope
		}
		return strings.Join(names, ",")
	}
	require.Equal(t, "alice~me", scopes("alice~t1"), "a client's thread inherits its client's scopes")
	require.Equal(t, "repo-x,bob~secret", scopes("app"), "the admin's thread inherits any thread")
	require.Empty(t, scopes("bob~t"), "a workspace of the admin's not shared reaches no client's thread")

	setParents := func(thread string, parents ...string) string {
		t.Helper()
		tx, err := db.BeginParentsLocked(ctx, pool, thread, parents)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		refused, err := q.ThreadSetParents(ctx, tx.Conn(), db.ThreadSetParentsParams{ID: thread, Parents: parents, Actor: "client", Via: "proxy"})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx, nil))
		return refused
	}
	require.Equal(t, "not shared: repo-x", setParents("alice~t1", "repo-x", "alice~me"))
	require.Equal(t, "not shared: team", setParents("alice~t1", "team"))
	require.Equal(t, "not shared: bob~secret", setParents("alice~t1", "bob~secret"))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM threads WHERE id = 'team'`).Scan(&n))
	require.Zero(t, n, "a parent refused is not created")

	_, err = pool.Exec(ctx, `UPDATE threads SET shared_with = '{alice}' WHERE id = 'repo-x'`)
	require.NoError(t, err)
	require.Empty(t, setParents("alice~t1", "repo-x", "alice~me"))
	require.Equal(t, "repo-x,alice~me", scopes("alice~t1"), "shared with alice: her thread inherits it, not bob's thread it names")
	require.Empty(t, scopes("bob~t"), "not shared with bob")
	_, err = pool.Exec(ctx, `UPDATE threads SET shared_with = '{*}' WHERE id = 'repo-x'`)
	require.NoError(t, err)
	require.Equal(t, "repo-x,bob~secret", scopes("bob~t"), "shared with every client, bob's own thread beyond it included")
	_, err = pool.Exec(ctx, `UPDATE threads SET shared_with = '{}' WHERE id = 'repo-x'`)
	require.NoError(t, err)
	require.Equal(t, "alice~me", scopes("alice~t1"), "unshared: the next turn inherits it no more")

	_, err = pool.Exec(ctx, `INSERT INTO events (thread_id, id, actor, via, kind, target_type, before, after) VALUES
		('repo-x', 1, 'user', 'admin', 'shared_with_set', 'thread', '{"shared_with":[]}', '{"shared_with":["alice"]}')`)
	require.NoError(t, err, "shared_with_set is an event")

	require.NoError(t, old.QueryRow(ctx, oldStart, "alice~t1").Scan(&turn, &inherited), "the previous version's prepared turn start")
	require.Contains(t, string(inherited), "alice~me")
	require.NotContains(t, string(inherited), "Go 1.26")
}

// TestUpgradeToThreadLabels: threads stored under 019 get no title, agent or first words; the
// listing reads them with their parents, their children's count and their waiting proposals
// (an answered one no longer counts), filters by parent and searches past the id; a first
// turn's label is kept once, a later one changes nothing; a title is set without moving the
// thread in the listing.
func TestUpgradeToThreadLabels(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := populate(t, []string{"001_workspace", "002_thread_usage", "003_responses", "004_events", "005_turn_start",
		"006_batches_and_tombstones", "007_client_responses", "008_cache_writes", "009_proposals", "010_mcp",
		"011_turn_start_unless_held", "012_scopes", "013_compaction", "014_turn_undo", "015_tool_call_in_one_round_trip",
		"016_usage_per_writer", "017_parents_locks_and_turn_give_backs", "018_no_notify_in_writes", "019_provenance", "020_clients", "021_client_usage", "022_shared_scopes"},
		`INSERT INTO threads (id, turns, next_event_id, updated_at) VALUES ('repo-x', 0, 1, now() - interval '1 hour'), ('s1', 2, 4, now()), ('s2', 1, 1, now() - interval '1 minute')`,
		`UPDATE threads SET parents = '{repo-x}' WHERE id IN ('s1', 's2')`,
		`INSERT INTO objectives (thread_id, text, updated_by) VALUES ('s2', 'Fix the login redirect', 'user')`,
		`INSERT INTO events (thread_id, id, actor, via, kind, target_type, target_id, before, after, proposed, answers) VALUES
		 ('s1', 1, 'agent', 'proxy', 'proposed', 'preference', NULL, NULL, NULL, '{"title":"A","subtitle":"","kind":"soft"}', NULL),
		 ('s1', 2, 'agent', 'proxy', 'proposed', 'preference', NULL, NULL, NULL, '{"title":"B","subtitle":"","kind":"soft"}', NULL),
		 ('s1', 3, 'user', 'admin', 'proposal_dismissed', 'preference', NULL, NULL, NULL, NULL, 1)`,
	)
	require.NoError(t, db.Migrate(ctx, pool))
	q := db.New()
	rows, err := q.ThreadList(ctx, pool, db.ThreadListParams{MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, rows, 3)
	byID := map[string]db.ThreadListRow{}
	for _, r := range rows {
		byID[r.ID] = r
		require.False(t, r.Title.Valid || r.Agent.Valid || r.FirstWords.Valid, r.ID)
	}
	require.Equal(t, int64(2), byID["repo-x"].Children, "a scope")
	require.Equal(t, int64(0), byID["s1"].Children)
	require.Equal(t, []string{"repo-x"}, byID["s1"].Parents)
	require.Equal(t, int64(1), byID["s1"].PendingProposals, "the dismissed one no longer waits")
	require.Equal(t, int64(0), byID["s2"].PendingProposals)

	ids := func(p db.ThreadListParams) []string {
		p.MaxRows = 10
		rows, err := q.ThreadList(ctx, pool, p)
		require.NoError(t, err)
		out := []string{}
		for _, r := range rows {
			out = append(out, r.ID)
		}
		return out
	}
	require.Equal(t, []string{"s1", "s2"}, ids(db.ThreadListParams{Parent: "repo-x"}))
	require.Equal(t, []string{"s2"}, ids(db.ThreadListParams{Search: "LOGIN"}), "the objective")
	require.Equal(t, []string{"repo-x"}, ids(db.ThreadListParams{Search: "po-"}), "past the id's start")

	// A first turn's label, kept once; a title, without moving the thread.
	require.NoError(t, q.ThreadLabel(ctx, pool, db.ThreadLabelParams{ID: "s2", Agent: pgtype.Text{String: "claude-cli/2.0.1", Valid: true},
		FirstWords: pgtype.Text{String: "Why does Safari loop?", Valid: true}}))
	require.NoError(t, q.ThreadLabel(ctx, pool, db.ThreadLabelParams{ID: "s2", Agent: pgtype.Text{String: "other/1", Valid: true},
		FirstWords: pgtype.Text{String: "later words", Valid: true}}))
	n, err := q.ThreadSetTitle(ctx, pool, db.ThreadSetTitleParams{ID: "s2", Title: pgtype.Text{String: "Safari login", Valid: true}})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	s2, err := q.ThreadSummary(ctx, pool, "s2")
	require.NoError(t, err)
	require.Equal(t, "claude-cli/2.0.1", s2.Agent.String)
	require.Equal(t, "Why does Safari loop?", s2.FirstWords.String)
	require.Equal(t, "Safari login", s2.Title.String)
	require.Equal(t, byID["s2"].UpdatedAt, s2.UpdatedAt, "a title is no change of the workspace")
	require.Equal(t, []string{"s2"}, ids(db.ThreadListParams{Search: "safari"}))
	var indexed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_indexes WHERE indexname = 'events_proposals_idx')`).Scan(&indexed))
	require.True(t, indexed, "the proposals of a thread are found without reading its events")
}
