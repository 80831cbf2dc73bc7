package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
	"github.com/stretchr/testify/require"
)

func TestUnavailable(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code} }
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{pg("08006"), true},
		{pg("53300"), true},
		{pg("53100"), true},
		{pg("57P01"), true},
		{pg("57P03"), true},
		{pg("58030"), true},
		{pg("57014"), true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{fmt.Errorf("acquire: %w", puddle.ErrClosedPool), true},
		{fmt.Errorf("query: %w", pgconn.ErrConnClosed), true},
		{context.DeadlineExceeded, true},
		{io.ErrUnexpectedEOF, true},
		{pg("23505"), false}, // unique violation: the statement's fault
		{pg("42P01"), false}, // undefined table: a bug
		{pg("55000"), false}, // on a statement, not a connection
		{pgx.ErrNoRows, false},
		{ErrNotFound, false},
		{context.Canceled, false},
		{errors.New("boom"), false},
		{nil, false},
	} {
		require.Equal(t, tt.want, Unavailable(tt.err), "%v", tt.err)
	}
}
