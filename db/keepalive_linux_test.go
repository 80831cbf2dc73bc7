package db_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
)

// TestPoolConnectionsProbeASilentPeer: the pool's connections to Postgres (over TCP, here to
// the fault proxy) send TCP keepalives after seconds of silence, not pgx's default minutes, so
// that a connection to a peer that went away is found dead before a request waits on it; and
// they carry the operation timeout as their statement_timeout.
func TestPoolConnectionsProbeASilentPeer(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewFaultPool(t, func(c *pgxpool.Config) { db.ConfigurePool(c, 7*time.Second) })
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	raw, err := conn.Conn().PgConn().Conn().(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var on, idle, interval, count int
	require.NoError(t, raw.Control(func(fd uintptr) {
		on, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
		idle, _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
		interval, _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL)
		count, _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT)
	}))
	require.Equal(t, []int{1, 15, 5, 3}, []int{on, idle, interval, count}, "SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT")
	var timeout string
	require.NoError(t, conn.QueryRow(context.Background(), "SHOW statement_timeout").Scan(&timeout))
	require.Equal(t, "7s", timeout)
}
