package workspace_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// keyedByThread: a statement names the thread it works on — a thread_id column, the threads row
// by its id, or the thread as the first argument of turn_start, turn_start_unless_held,
// thread_revive, thread_compacted or turn_undo (functions Citus delegates by that argument) — so that it can
// be routed to the one shard (Citus) or database holding it.
var keyedByThread = regexp.MustCompile(`thread_id\s*=|WHERE\s+(threads\.|t\.)?id\s*=|INTO threads AS th \(id|thread_id[,)]|FROM (turn_start|turn_start_unless_held|thread_revive|thread_compacted)\(\$1[,):]|SELECT turn_undo\(\$1[,):]`)

// TestTurnStatementsAreRoutableByThread runs a turn — its start, a call of the turn, every tool, its usage, a
// Responses turn's record and continuation — a client's compaction, and an MCP request (its
// thread token's check, a call that may create its thread), and fails when one of their
// statements does not name its thread (docs/scaling.md).
func TestTurnStatementsAreRoutableByThread(t *testing.T) {
	t.Parallel()
	tracer := &dbtest.Statements{}
	pool := dbtest.NewPool(t, &dbtest.Options{Tracer: tracer})
	store := NewStore(pool, Options{})
	ws := store.Workspace(ThreadID{Name: "routed"})
	ctx := context.Background()
	tracer.Reset() // not the migration
	start, err := ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	// A turn's call, planned on its start's workspace: one guarded round trip.
	_, err = tools.Run(ctx, ws, tools.Call{Turn: 1, Round: 1, Name: tools.SetObjective, Arguments: `{"text":"In a turn"}`, View: tools.NewView(start)})
	require.NoError(t, err)
	for _, c := range []tools.Call{
		{Name: tools.AddPreferences, Arguments: `{"items":[{"title":"A"},{"title":"B"}]}`},
		{Name: tools.ListPreferences, Arguments: `{}`},
		{Name: tools.UpdatePreferences, Arguments: `{"updates":[{"index":1,"title":"A2"}]}`},
		{Name: tools.RemovePreferences, Arguments: `{"indices":[2]}`},
		{Name: tools.SetObjective, Arguments: `{"text":"Route it"}`},
		{Name: tools.AddPreferences, Arguments: `not json`},
	} {
		_, err := tools.Run(ctx, ws, tools.Call{Turn: 1, Round: 1, Name: c.Name, Arguments: c.Arguments})
		require.NoError(t, err)
	}
	require.NoError(t, store.AddUsage(ctx, UsageBatch{Writer: "w", Number: 1, Usage: map[ThreadID]Usage{ws.ThreadID(): {PromptTokens: 1}}}))
	// A Responses turn's record, and a later turn continuing from it.
	require.NoError(t, ws.RecordResponseTurn(ctx, 1, "resp_1", "resp_2", []string{"call_1"}, nil, ""))
	_, err = ws.Continuation(ctx, "resp_1")
	require.NoError(t, err)
	require.NoError(t, ws.NoteCompaction(ctx))
	undone := store.Workspace(ThreadID{Name: "undone"})
	start, err = undone.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.NoError(t, undone.UndoTurn(ctx, start))
	require.NoError(t, store.Workspace(ThreadID{Name: "compacted-first"}).NoteCompaction(ctx))
	link, err := ws.IssueLink(ctx, LinkMCP, time.Now().Add(time.Hour))
	require.NoError(t, err)
	_, err = ws.LinkValid(ctx, LinkMCP, link.ID)
	require.NoError(t, err)
	_, err = tools.Run(ctx, ws, tools.Call{Name: tools.AddPreferences, Via: ViaMCP, Arguments: `{"items":[{"title":"Over MCP"}]}`})
	require.NoError(t, err)
	_, err = tools.Run(ctx, store.Workspace(ThreadID{Name: "made-over-mcp"}), tools.Call{Name: tools.ListPreferences, Via: ViaMCP})
	require.NoError(t, err)
	statements := tracer.All()
	require.NotEmpty(t, statements)
	for _, sql := range statements {
		switch strings.ToUpper(strings.Fields(sql)[0]) {
		case "BEGIN", "COMMIT", "ROLLBACK", "SET":
			continue
		}
		if strings.HasPrefix(sql, "SELECT set_config(") && !strings.Contains(sql, " FROM ") {
			continue // a setting of the transaction's (its time bound), as a SET
		}
		require.Regexp(t, keyedByThread, sql, "a turn's statement that does not name its thread")
	}
}
