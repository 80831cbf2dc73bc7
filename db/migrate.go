package db

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migration/*.sql
var migrations embed.FS

// migrationLockID is the advisory lock key that serializes migrations between replicas starting
// at once ("wsproxy" as ASCII bytes).
const migrationLockID = 0x777370726f7879

// Migrate applies the embedded migrations (db/migration/NNN_name.sql) that the database has not
// applied yet, in order, all in one transaction under an advisory lock: two replicas starting at
// once apply each migration exactly once, and a failed migration leaves nothing behind.
func Migrate(ctx context.Context, b TxBeginner) error {
	names, err := fs.Glob(migrations, "migration/*.sql")
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	sort.Strings(names)
	return WithTx(ctx, b, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLockID)); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
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
			sql, err := migrations.ReadFile(name)
			if err != nil {
				return fmt.Errorf("read migration %s: %w", version, err)
			}
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return fmt.Errorf("apply migration %s: %w", version, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, version); err != nil {
				return fmt.Errorf("record migration %s: %w", version, err)
			}
		}
		return nil
	})
}
