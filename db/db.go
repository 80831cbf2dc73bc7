// Package db is wsproxy's Postgres layer: the sqlc-generated queries (sqlc_*.go, generated from
// queries/*.sql, never edited), the embedded migrations and the few helpers every caller shares.
package db

//go:generate go tool sqlc generate -f ../sqlc.yaml

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
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

// TxBeginner is what WithTx needs: a *pgxpool.Pool or a *pgx.Conn.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// WithTx runs fn in a transaction begun with opts and commits when fn returns nil. The
// transaction is rolled back when fn fails or panics (the panic goes on), under
// context.WithoutCancel, so a cancelled request still releases its locks at once instead of
// leaving the connection's cleanup to the pool.
func WithTx(ctx context.Context, b TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) (err error) {
	tx, err := b.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	committed = true // a failed commit ends the transaction too
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// Unavailable reports whether err means Postgres is unavailable: it could not be reached, it
// refused or dropped the connection, it is starting, shutting down or out of resources, it did
// not answer in time (a deadline, or the statement_timeout that DATABASE_TIMEOUT sets), the pool
// is closed, or it rolled the transaction back for a race with another (Retryable) that trying
// again did not settle. Those are the failures a client may retry later (503); any other error
// (a statement Postgres refused, a bug) is not.
func Unavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case Retryable(err), // a race with another transaction, rolled back
			strings.HasPrefix(code, "08"),  // connection exception
			strings.HasPrefix(code, "53"),  // insufficient resources: too many connections, out of memory, disk full
			strings.HasPrefix(code, "57P"), // admin or crash shutdown, cannot connect now, database dropped
			strings.HasPrefix(code, "58"),  // system error (I/O)
			code == "57014",                // query canceled: statement_timeout
			code == "55P03":                // lock not available: lock_timeout
			return true
		}
		var ce *pgconn.ConnectError
		return errors.As(err, &ce) // a connection refused with an SQLSTATE, such as 55000
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) ||
		errors.As(err, &ne) ||
		errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, puddle.ErrClosedPool) ||
		errors.Is(err, context.DeadlineExceeded) ||
		pgconn.Timeout(err) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.EOF)
}

// Retryable reports whether err is Postgres's rollback of a transaction for a race with another
// (SQLSTATE 40001, serialization_failure, which migration 017 raises for a parents change that
// met another; 40P01, deadlock_detected): nothing of it was written, and the same transaction
// tried again may succeed.
func Retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
