package workspace_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// durableCluster starts a PostgreSQL cluster of its own for a test, with the server's default
// durability (fsync and synchronous_commit on) and a WAL writer that waits 10 s between flushes,
// so that an asynchronous commit stays unflushed for long enough to be lost in a crash.
type durableCluster struct {
	t     *testing.T
	dir   string
	elsew string // where pg.sh kept the cluster when the postgres user cannot enter dir
}

func newDurableCluster(t *testing.T) *durableCluster {
	c := &durableCluster{t: t, dir: t.TempDir()}
	t.Cleanup(func() {
		_ = exec.Command("../scripts/pg.sh", "stop", c.dir, "immediate").Run()
		if c.elsew != "" {
			_ = os.RemoveAll(c.elsew)
		}
	})
	return c
}

// start starts the cluster (creating it the first time) and returns a pool on it.
func (c *durableCluster) start() *pgxpool.Pool {
	cmd := exec.Command("../scripts/pg.sh", "start", c.dir)
	cmd.Env = append(os.Environ(), "PG_OPTS=-c fsync=on -c synchronous_commit=on -c wal_writer_delay=10s -c wal_writer_flush_after=0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(c.t, err, "pg.sh start: %s", stderr.String())
	if m := regexp.MustCompile(`cluster in (/var/lib/wsproxy/[^/\s]+)/pg`).FindStringSubmatch(stderr.String()); m != nil {
		c.elsew = m[1]
	}
	pool, err := pgxpool.New(context.Background(), strings.TrimSpace(string(out)))
	require.NoError(c.t, err)
	c.t.Cleanup(pool.Close)
	return pool
}

// crash stops the cluster the way a power cut would stop it: no shutdown checkpoint, WAL that
// was not flushed is gone.
func (c *durableCluster) crash(pool *pgxpool.Pool) {
	pool.Close()
	require.NoError(c.t, exec.Command("../scripts/pg.sh", "stop", c.dir, "immediate").Run())
}

// TestTurnStartLostInACrash proves the turn start's asynchronous commit safe: a crash may lose
// the last turn starts (a turn number and a snapshot of an unchanged workspace), the next turn
// then takes the same number again, and no key of a snapshot or a tool call breaks; a durable
// commit after a turn start (a tool call) makes the turn start durable too.
func TestTurnStartLostInACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newDurableCluster(t)
	pool := c.start()
	require.NoError(t, db.Migrate(ctx, pool))
	ws := NewStore(pool, Options{}).Workspace(ThreadID{Name: "crash"})
	turn, err := ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, turn.Number)
	_, err = tools.Run(ctx, ws, tools.Call{Turn: 1, Round: 1, Name: tools.AddPreferences, Arguments: `{"items":[{"title":"Kept"}]}`})
	require.NoError(t, err) // durable: turn 1 is durable with it

	turn, err = ws.StartTurn(ctx, TurnOptions{}) // turn 2: asynchronous, and nothing durable after it
	require.NoError(t, err)
	require.Equal(t, 2, turn.Number)
	c.crash(pool)

	pool = c.start()
	store := NewStore(pool, Options{})
	ws = store.Workspace(ThreadID{Name: "crash"})
	threads, err := store.Threads(ctx, "", "", ThreadFilter{}, 10)
	require.NoError(t, err)
	require.Equal(t, 1, threads[0].Turns, "turn 2's start was lost in the crash")
	turn, err = ws.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, 2, turn.Number, "the lost number is taken again")
	require.Equal(t, "Kept", turn.Preferences[0].Title)
	res, err := tools.Run(ctx, ws, tools.Call{Turn: 2, Round: 1, Name: tools.AddPreferences, Arguments: `{"items":[{"title":"After"}]}`})
	require.NoError(t, err)
	require.True(t, res.OK)

	turn, err = ws.StartTurn(ctx, TurnOptions{}) // turn 3, then a durable tool call: turn 3 is durable too
	require.NoError(t, err)
	require.Equal(t, 3, turn.Number)
	_, err = tools.Run(ctx, ws, tools.Call{Turn: 3, Round: 1, Name: tools.ListPreferences, Arguments: `{}`})
	require.NoError(t, err)
	c.crash(pool)

	pool = c.start()
	store = NewStore(pool, Options{})
	ws = store.Workspace(ThreadID{Name: "crash"})
	threads, err = store.Threads(ctx, "", "", ThreadFilter{}, 10)
	require.NoError(t, err)
	require.Equal(t, 3, threads[0].Turns, "a durable commit after a turn start keeps it")
	snaps, err := ws.Snapshots(ctx, 0, 10)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3}, []int{snaps[0].Turn, snaps[1].Turn, snaps[2].Turn}, "one snapshot a workspace, keys whole")
	calls, err := ws.ToolCalls(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, calls, 3)
	require.Equal(t, []int{1, 2, 3}, []int{*calls[0].Turn, *calls[1].Turn, *calls[2].Turn})
}
