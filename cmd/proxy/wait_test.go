package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbfault"
	"github.com/wsproxy/wsproxy/db/dbtest"
)

// faultyDatabaseURL is a fresh schema of the test database reached through a fault proxy that
// refuses connections until Restore.
func faultyDatabaseURL(t *testing.T) (string, *dbfault.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbtest.SchemaURL(t))
	require.NoError(t, err)
	p, err := dbfault.New(cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	p.Cut()
	u := &url.URL{Scheme: "postgres", User: url.User(cfg.ConnConfig.User), Host: fmt.Sprintf("127.0.0.1:%d", p.Port()),
		Path: "/" + cfg.ConnConfig.Database, RawQuery: url.Values{"sslmode": {"disable"}, "search_path": {cfg.ConnConfig.RuntimeParams["search_path"]}}.Encode()}
	return u.String(), p
}

// TestDatabaseWait: started before its database answers, wsproxy serves /healthz (200) and
// /readyz (503) while it retries for DATABASE_WAIT; once Postgres answers it migrates and
// serves. A database that never answers within DATABASE_WAIT fails the start, naming it.
func TestDatabaseWait(t *testing.T) {
	t.Parallel()
	t.Run("ComesUp", func(t *testing.T) {
		t.Parallel()
		dsn, fault := faultyDatabaseURL(t)
		m := NewMain()
		m.Config.DatabaseURL, m.Config.ListenAddr, m.Config.UpstreamBaseURL = dsn, freeAddr(t), "demo"
		m.Config.DatabaseWait = 5 * time.Minute
		m.LogOutput = &syncBuffer{}
		ran := make(chan error, 1)
		go func() { ran <- m.Run(context.Background()) }()
		t.Cleanup(func() { _ = m.Close() })
		base := "http://" + m.Config.ListenAddr
		status := func(path string) int {
			resp, err := http.Get(base + path)
			if err != nil {
				return 0
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		require.Eventually(t, func() bool { return status("/healthz") == 200 }, time.Minute, 10*time.Millisecond, "the listener opens first")
		require.Equal(t, http.StatusServiceUnavailable, status("/readyz"))
		require.Equal(t, http.StatusServiceUnavailable, status("/v1/models"))
		select {
		case err := <-ran:
			t.Fatalf("Run returned while Postgres refused connections: %v", err)
		default:
		}
		fault.Restore()
		require.NoError(t, <-ran)
		require.Equal(t, 200, status("/readyz"))
	})
	t.Run("GivesUp", func(t *testing.T) {
		t.Parallel()
		dsn, _ := faultyDatabaseURL(t)
		m := NewMain()
		m.Config.DatabaseURL, m.Config.ListenAddr, m.Config.UpstreamBaseURL = dsn, "127.0.0.1:0", "demo"
		m.Config.DatabaseWait = 500 * time.Millisecond
		m.LogOutput = &syncBuffer{}
		err := m.Run(context.Background())
		require.ErrorContains(t, err, "Postgres did not answer within DATABASE_WAIT (500ms)")
	})
	// An address where nothing listens, with sslmode=prefer (the default): pgconn tries it with
	// TLS and without, and both fail alike; the error says so once, on one line.
	t.Run("GivesUpSayingWhyOnce", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		m := NewMain()
		m.Config.DatabaseURL, m.Config.ListenAddr, m.Config.UpstreamBaseURL = "postgres://nobody@"+addr+"/none", "127.0.0.1:0", "demo"
		m.Config.DatabaseWait = 500 * time.Millisecond
		m.LogOutput = &syncBuffer{}
		err = m.Run(context.Background())
		require.Error(t, err)
		require.Regexp(t, `^DATABASE_URL: Postgres did not answer within DATABASE_WAIT \(500ms\): failed to connect to `+
			"`user=nobody database=none`: "+regexp.QuoteMeta(addr)+` \(127\.0\.0\.1\): dial error: dial tcp `+regexp.QuoteMeta(addr)+`: connect: connection refused$`, err.Error())
		require.Equal(t, 1, strings.Count(err.Error(), "dial error"), "the dial error once: %q", err)
	})
}
