package db_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
)

// A DATABASE_URL that sizes the pool (pool_max_conns, docs/configuration.md) is also the
// listener's URL by default: Listen takes the connection's settings from it and leaves the
// pool's to the pool, which Postgres would refuse as an unknown parameter.
func TestListenWithThePoolsParameters(t *testing.T) {
	t.Parallel()
	_, cfg := dbtest.Schema(t)
	u, err := url.Parse(dbtest.ListenURL(t, cfg))
	require.NoError(t, err)
	q := u.Query()
	q.Set("pool_max_conns", "16")
	q.Set("pool_min_conns", "1")
	u.RawQuery = q.Encode()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got, listening := make(chan string, 1), make(chan struct{}, 1)
	var logged lockedBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	go db.Listen(ctx, u.String(), "wsproxy_listen_test", func(payload string) { got <- payload },
		func() { listening <- struct{}{} }, log)
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("not listening after 10 s; logged: %s", logged.String())
	}
	pool := dbtest.NewPool(t, nil)
	_, err = pool.Exec(ctx, "SELECT pg_notify('wsproxy_listen_test', 'hello')")
	require.NoError(t, err)
	select {
	case p := <-got:
		require.Equal(t, "hello", p)
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10 s")
	}
}

// lockedBuffer is a log's output, written by Listen's goroutine and read by the test's.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
