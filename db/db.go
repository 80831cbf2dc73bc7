// Package db is wsproxy's Postgres layer: the sqlc-generated queries (sqlc_*.go, generated from
// queries/*.sql, never edited), the embedded migrations and the few helpers every caller shares.
package db

//go:generate go tool sqlc generate -f ../sqlc.yaml

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotFound is returned in place of pgx.ErrNoRows, so callers need not import pgx to branch on it.
var ErrNotFound = errors.New("not found")

// NotFound turns pgx.ErrNoRows into ErrNotFound and returns any other error unchanged. It is the
// one place that mapping happens.
func NotFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// TxBeginner is what WithTx needs: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// WithTx runs fn in a transaction and commits when fn returns nil. The rollback after a failure
// runs under context.WithoutCancel, so a cancelled request still releases its locks at once
// instead of leaving the connection's cleanup to the pool.
func WithTx(ctx context.Context, b TxBeginner, fn func(tx pgx.Tx) error) error {
	tx, err := b.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// Unavailable reports whether err means Postgres could not be reached or did not answer (as
// opposed to a statement it refused): the cases the proxy answers with 503.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08: connection exception; 57P01-57P03: admin shutdown, crash shutdown, cannot
		// connect now; 53300: too many connections; 57014: statement timeout.
		switch {
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08",
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03",
			pgErr.Code == "53300", pgErr.Code == "57014":
			return true
		}
		return false
	}
	return !errors.Is(err, ErrNotFound) && !errors.Is(err, context.Canceled)
}
