package db

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migration/*.sql
var migrations embed.FS

// migrationLockID is the advisory lock key that serializes migrations between replicas starting
// at once ("wsproxy" as ASCII bytes).
const migrationLockID = 0x777370726f7879

// migrationLockTimeout is the longest a migration waits for a lock on a table it changes.
const migrationLockTimeout = 5 * time.Second

// Migrate applies the embedded migrations (db/migration/NNN_name.sql) that the database has not
// applied yet, in order, all in one transaction under an advisory lock: two replicas starting at
// once apply each migration exactly once, and a failed migration leaves nothing behind. No
// statement_timeout bounds them (a backfill of a large table takes as long as it takes, and a
// replica starting meanwhile waits for it); a lock on a table that another session holds fails a
// migration after migrationLockTimeout, rather than queueing every statement on that table
// behind it for as long as that session lasts.
func Migrate(ctx context.Context, b TxBeginner) error {
	return migrate(ctx, b, migrations, migrationLockTimeout)
}

// migrate applies the migrations of fsys (migration/NNN_name.sql) as Migrate says, waiting at
// most lockTimeout for a table's lock.
func migrate(ctx context.Context, b TxBeginner, fsys fs.FS, lockTimeout time.Duration) error {
	names, err := fs.Glob(fsys, "migration/*.sql")
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	sort.Strings(names)
	return WithTx(ctx, b, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = 0`); err != nil {
			return fmt.Errorf("set statement_timeout: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLockID)); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(lockTimeout.Milliseconds(), 10)); err != nil {
			return fmt.Errorf("set lock_timeout: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version text PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations`)
		if err != nil {
			return fmt.Errorf("read schema_migrations: %w", err)
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read schema_migrations: %w", err)
		}
		done := make(map[string]bool, len(applied))
		for _, v := range applied {
			done[v] = true
		}
		for _, name := range names {
			version := strings.TrimSuffix(strings.TrimPrefix(name, "migration/"), ".sql")
			if done[version] {
				continue
			}
			sql, err := fs.ReadFile(fsys, name)
			if err != nil {
				return fmt.Errorf("read migration %s: %w", version, err)
			}
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
					return fmt.Errorf("apply migration %s: a table it changes stayed locked by another session for %s (lock_timeout): "+
						"nothing was applied; the next start tries again: %w", version, lockTimeout, err)
				}
				return fmt.Errorf("apply migration %s: %w", version, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, version); err != nil {
				return fmt.Errorf("record migration %s: %w", version, err)
			}
		}
		return nil
	})
}
