package db_test

import (
	"context"
	"log/slog"
	"net/url"
	"os"
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
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)) // why it could not listen, beside the failure
	go db.Listen(ctx, u.String(), "wsproxy_listen_test", func(payload string) { got <- payload },
		func() { listening <- struct{}{} }, log)
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("not listening after 10 s (the listener's warnings are on stderr)")
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
