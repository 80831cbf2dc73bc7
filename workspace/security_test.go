package workspace_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// TestLoneSurrogates: a lone surrogate escape (which Postgres refuses in jsonb) anywhere in a
// call's arguments never fails the call: its strings get U+FFFD for it, in the workspace and in
// the call's record, and a call the tool refuses is still recorded.
func TestLoneSurrogates(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.Equal(t, "recorded 1 preference",
		f.ok(t, tools.AddPreferences, `{"items":[{"title":"Tea \ud800 time","subtitle":"\udfff"}],"action_and_reasoning":"\uD83D","x":{"\udc00":["\ud800"]}}`))
	require.Equal(t, "Tea \uFFFD time", f.list(t)[0].Title)
	require.Contains(t, f.fails(t, tools.SetObjective, `{"text":"","note":"\ud800"}`), "text: must not be empty")
	require.Equal(t, "objective set: \uFFFD", f.ok(t, tools.SetObjective, `{"text":"\ud800"}`))
	calls, err := f.ws.ToolCalls(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, calls, 3)
	require.Equal(t, "\uFFFD", calls[0].ActionAndReasoning)
	require.False(t, strings.Contains(string(calls[0].Arguments), `\ud800`), "%s", calls[0].Arguments)
	require.Contains(t, string(calls[0].Arguments), "Tea \uFFFD time")
}

// TestToolCallBounds: a call over the items bound (MAX_TOOL_ITEMS) or the arguments bound
// (MAX_TOOL_ARGUMENT_BYTES) gets an error envelope and writes nothing but its record, which keeps
// a bounded prefix of the arguments of any refused call; calls within them run as before.
func TestToolCallBounds(t *testing.T) {
	t.Parallel()
	f := setupOn(t, dbtest.NewPool(t, nil), Options{Limits: Limits{ItemsMax: 10, ArgumentBytesMax: 4096}})
	items := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`{"title":"P%d"}`, i)
		}
		return `{"items":[` + strings.Join(parts, ",") + `]}`
	}
	require.Equal(t, "recorded 10 preferences", f.ok(t, tools.AddPreferences, items(10)))
	require.Contains(t, f.fails(t, tools.AddPreferences, items(11)), "items: at most 10 in one call (got 11)")
	require.Contains(t, f.fails(t, tools.UpdatePreferences, `{"updates":[`+strings.Repeat(`{"index":1,"kind":"hard"},`, 10)+`{"index":2}]}`),
		"updates: at most 10 in one call (got 11)")
	require.Contains(t, f.fails(t, tools.RemovePreferences, `{"indices":[1,2,3,4,5,6,7,8,9,10,11]}`), "indices: at most 10 in one call (got 11)")
	long := `{"text":"` + strings.Repeat("x", 5000) + `"}`
	require.Contains(t, f.fails(t, tools.SetObjective, long), "arguments: at most 4096 bytes (got 5011)")
	require.Len(t, f.list(t), 10, "nothing of the refused calls was written")
	d, err := f.ws.Get(context.Background())
	require.NoError(t, err)
	require.Nil(t, d.Objective)

	calls, err := f.ws.ToolCalls(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, calls, 5)
	last := calls[4]
	var stored string
	require.NoError(t, json.Unmarshal(last.Arguments, &stored), "a refused call's long arguments are kept as a string of their first bytes")
	require.True(t, strings.HasPrefix(long, strings.TrimSuffix(stored, "…")))
	require.LessOrEqual(t, len(stored), MaxRefusedArguments+len("…"))
}

// TestToolTransactionTimeouts: a tool's transaction bounds, on the server, its wait for a lock
// and each statement by its operation's time bound (lock_timeout, statement_timeout), so that it
// cannot hold the thread's lock past it even where the connection sets no statement_timeout
// (PgBouncer drops startup parameters).
func TestToolTransactionTimeouts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tx, err := db.BeginLocked(ctx, f.pool, db.LockThread, f.ws.ThreadID().String(), false)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	for _, setting := range []string{"lock_timeout", "statement_timeout"} {
		var ms int64
		require.NoError(t, tx.Conn().QueryRow(ctx, "SELECT setting::bigint FROM pg_settings WHERE name = $1", setting).Scan(&ms))
		require.InDelta(t, time.Minute.Milliseconds(), ms, float64(10*time.Second.Milliseconds()), setting)
	}
}

// TestPruneResponses: HISTORY_RETENTION prunes the Responses turns and the clients' response
// records older than the cutoff, as it prunes the rest of the history.
func TestPruneResponses(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ws := f.store.Workspace(ThreadID{Client: "alice", Name: "t1"})
	_, err := ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.NoError(t, ws.RecordResponseTurn(ctx, 1, "resp_old", "resp_old_last", nil, []string{"resp_old", "msg_old"}, ""))
	_, err = f.pool.Exec(ctx, `UPDATE response_turns SET created_at = created_at - interval '2 days'; UPDATE client_responses SET created_at = created_at - interval '2 days'`)
	require.NoError(t, err)
	require.NoError(t, ws.RecordResponseTurn(ctx, 2, "resp_new", "resp_new", nil, []string{"resp_new"}, ""))
	_, err = f.store.PruneHistory(ctx, time.Now().Add(-24*time.Hour))
	require.NoError(t, err)
	_, err = ws.Continuation(ctx, "resp_old")
	require.ErrorIs(t, err, ErrNotFound, "the old turn is pruned")
	_, err = ws.Continuation(ctx, "resp_new")
	require.NoError(t, err)
	unknown, err := f.store.UnknownResponses(ctx, "alice", []string{"resp_old", "msg_old", "resp_new"})
	require.NoError(t, err)
	require.Equal(t, []string{"resp_old", "msg_old"}, unknown)
}

// TestDotThreadIDs: "." and ".." are no thread ids (a browser resolves them as path segments,
// so the panel could not open them): refused as a client names a thread and in the stored form.
func TestDotThreadIDs(t *testing.T) {
	t.Parallel()
	for _, name := range []string{".", ".."} {
		_, err := NewThreadID("", name)
		require.ErrorIs(t, err, ErrInvalidThreadID, name)
		_, err = NewThreadID("alice", name)
		require.ErrorIs(t, err, ErrInvalidThreadID, name)
		_, err = ParseThreadID("alice~" + name)
		require.ErrorIs(t, err, ErrInvalidThreadID, name)
	}
	for _, name := range []string{"...", ".a", "a.", "a..b"} {
		_, err := NewThreadID("", name)
		require.NoError(t, err, name)
	}
}
