package dbtest

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Statements is a pool's tracer (Options.Tracer) that keeps the text of every statement the pool
// runs, those of pipelines included.
type Statements struct {
	mu  sync.Mutex
	sql []string
}

func (s *Statements) add(sql string) {
	s.mu.Lock()
	s.sql = append(s.sql, sql)
	s.mu.Unlock()
}

// All returns the statements run since the pool opened or the last Reset.
func (s *Statements) All() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sql...)
}

// Count is how many of them contain substr.
func (s *Statements) Count(substr string) int {
	n := 0
	for _, sql := range s.All() {
		if strings.Contains(sql, substr) {
			n++
		}
	}
	return n
}

// Reset forgets the statements run so far (a migration's, say).
func (s *Statements) Reset() {
	s.mu.Lock()
	s.sql = nil
	s.mu.Unlock()
}

func (s *Statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.add(d.SQL)
	return ctx
}
func (s *Statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *Statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *Statements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.add(d.SQL)
}
func (s *Statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
