// Package dbtest gives tests a real, migrated Postgres: a fresh schema per call, dropped when the
// test ends. The database comes from TEST_DATABASE_URL or DATABASE_URL (`make test` provides
// one); a test that needs it fails, never skips, when there is none.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbfault"
)

// Options tune NewPool. The zero value is a pool of default size without a tracer.
type Options struct {
	// Tracer, when set, sees every query of the pool (for counting round trips).
	Tracer pgx.QueryTracer
	// MaxConns caps the pool; zero keeps pgxpool's default.
	MaxConns int32
}

// URL returns the test database's URL, failing the test when none is configured.
func URL(t testing.TB) string {
	t.Helper()
	for _, k := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(k); u != "" {
			return u
		}
	}
	t.Fatal("no test database: set TEST_DATABASE_URL or DATABASE_URL, or run `make test`, which starts one")
	return ""
}

var (
	adminOnce sync.Once
	admin     *pgxpool.Pool
	adminErr  error
)

func adminPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := URL(t) // outside the Once: a test without a database fails here, every time
	adminOnce.Do(func() {
		admin, adminErr = pgxpool.New(context.Background(), u)
	})
	if adminErr != nil {
		t.Fatalf("connect to test database: %v", adminErr)
	}
	return admin
}

// Schema creates an empty schema for one test, dropped in t.Cleanup, and returns its name and a
// pool config whose connections use it. With TEST_PGBOUNCER_URL set (`pg.sh bouncer`), it
// creates a database instead, reached through that PgBouncer in transaction mode, which passes
// on no session settings (such as a search_path).
func Schema(t testing.TB) (string, *pgxpool.Config) {
	t.Helper()
	ctx := context.Background()
	a := adminPool(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "test_" + hex.EncodeToString(b[:])
	if bouncer := os.Getenv("TEST_PGBOUNCER_URL"); bouncer != "" {
		if _, err := a.Exec(ctx, "CREATE DATABASE "+schema); err != nil {
			t.Fatalf("create database: %v", err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := a.Exec(ctx, "DROP DATABASE "+schema+" WITH (FORCE)"); err != nil {
				t.Errorf("drop database: %v", err)
			}
		})
		cfg, err := pgxpool.ParseConfig(bouncer)
		if err != nil {
			t.Fatalf("parse TEST_PGBOUNCER_URL: %v", err)
		}
		cfg.ConnConfig.Database = schema
		return schema, cfg
	}
	if _, err := a.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A session of the test's that is still ending (a killed process's backend, which has
		// not yet noticed) may hold locks on the schema's objects as the drop takes them: the
		// deadlock aborts the drop, which goes again once that session has ended.
		_, err := a.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		for pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "40P01" && ctx.Err() == nil; {
			time.Sleep(100 * time.Millisecond)
			_, err = a.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		}
		if err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("parse test database URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return schema, cfg
}

// SchemaURL creates an empty schema like Schema and returns a database URL whose connections
// use it, for code that takes a URL (the program's DATABASE_URL).
func SchemaURL(t testing.TB) string {
	t.Helper()
	schema, _ := Schema(t)
	if bouncer := os.Getenv("TEST_PGBOUNCER_URL"); bouncer != "" {
		u, err := url.Parse(bouncer)
		if err != nil {
			t.Fatalf("parse TEST_PGBOUNCER_URL: %v", err)
		}
		u.Path = "/" + schema
		return u.String()
	}
	u, err := url.Parse(URL(t))
	if err != nil {
		t.Fatalf("parse test database URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// NewPool returns a pool on a fresh, migrated schema of the test database. The pool is closed
// and the schema dropped when the test ends.
func NewPool(t testing.TB, opts *Options) *pgxpool.Pool {
	t.Helper()
	_, cfg := Schema(t)
	if opts != nil {
		if opts.MaxConns > 0 {
			cfg.MaxConns = opts.MaxConns
		}
		cfg.ConnConfig.Tracer = opts.Tracer
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := db.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return pool
}

// NewFaultPool returns a pool on a fresh, migrated schema whose connections go through a
// dbfault.Proxy. Both are closed when the test ends.
func NewFaultPool(t testing.TB, configure func(*pgxpool.Config)) (*pgxpool.Pool, *dbfault.Proxy) {
	t.Helper()
	_, cfg := Schema(t)
	p, err := dbfault.New(cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)

	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(p.Port())
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.TLSConfig = nil
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect through the fault proxy: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := db.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return pool, p
}

// Bypass returns a pool on the schema (or database) of pool, one of NewFaultPool, that reaches
// Postgres directly: what a test reads while the fault proxy loses bytes. It is closed when the
// test ends.
func Bypass(t testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	origin := URL(t)
	if bouncer := os.Getenv("TEST_PGBOUNCER_URL"); bouncer != "" {
		origin = bouncer
	}
	direct, err := pgxpool.ParseConfig(origin)
	if err != nil {
		t.Fatalf("parse test database URL: %v", err)
	}
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = direct.ConnConfig.Host, direct.ConnConfig.Port
	cfg.ConnConfig.Fallbacks, cfg.ConnConfig.TLSConfig = direct.ConnConfig.Fallbacks, direct.ConnConfig.TLSConfig
	cfg.ConnConfig.Tracer = nil
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}
