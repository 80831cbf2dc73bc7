package workspace_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbfault"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/tools"
	. "github.com/wsproxy/wsproxy/workspace"
)

// partitionTracer partitions its fault proxy as the first statement whose SQL contains match
// goes out: the replica is cut off mid tool call, its transaction open on the server.
type partitionTracer struct {
	fault *dbfault.Proxy
	match string
	done  atomic.Bool
}

func (p *partitionTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, p.match) && p.done.CompareAndSwap(false, true) {
		p.fault.Partition()
	}
	return ctx
}
func (p *partitionTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A batch whose statements include match partitions as it goes out.
func (p *partitionTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if strings.Contains(q.SQL, p.match) && p.done.CompareAndSwap(false, true) {
			p.fault.Partition()
		}
	}
	return ctx
}
func (p *partitionTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (p *partitionTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestAPartitionedReplicaFreesItsThread: a replica cut off from Postgres in the middle of a tool
// call (its transaction open, the thread's row locked, and Postgres never told: the partition
// comes as the call's statement and commit go out, after its lock and read) does not wedge
// the thread: Postgres ends the idle transaction within seconds, and another replica's turn of
// the thread goes on.
func TestAPartitionedReplicaFreesItsThread(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tracer := &partitionTracer{match: "DELETE FROM preferences"}
	pool, fault := dbtest.NewFaultPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	tracer.fault = fault
	t.Cleanup(fault.Cut) // before the pool closes: its connections lost bytes
	cutOff := setupOn(t, pool, Options{Timeout: 5 * time.Second})
	cutOff.ok(t, tools.AddPreferences, add(item{Title: "A"}))
	other := NewStore(dbtest.Bypass(t, pool), Options{Timeout: 30 * time.Second}).Workspace(cutOff.ws.ThreadID())

	_, err := tools.Run(ctx, cutOff.ws, tools.Call{Turn: 1, Round: 1, Name: tools.RemovePreferences, Arguments: `{"indices":[1]}`})
	require.Error(t, err, "the cut-off replica's call fails")
	require.True(t, tracer.done.Load())
	_, err = other.StartTurn(ctx, TurnOptions{})
	require.NoError(t, err, "another replica's turn of the thread")
	d, err := other.Get(ctx)
	require.NoError(t, err)
	require.Len(t, d.Preferences, 1, "the cut-off call wrote nothing")
}
