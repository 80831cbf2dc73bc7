package workspace

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wsproxy/wsproxy/db"
)

// Kinds of links (a thread's tokens, docs/spec.md §13 and §15).
const (
	LinkPanel = "panel" // opens the thread's panel
	LinkMCP   = "mcp"   // reads and keeps the thread's workspace over MCP
)

// Link is a token issued for one thread: the admin REST issues, lists and revokes them; the token
// itself (signed, naming the thread, the id and the expiry) is never stored.
type Link struct {
	ID        int64     `json:"id"`
	Kind      string    `json:"kind"`
	ExpiresAt time.Time `json:"expires_at"`
	CreatedAt time.Time `json:"created_at"`
}

// IssueLink records a new token of kind for the thread, valid until expires. ErrNotFound when
// the thread does not exist.
func (w *Workspace) IssueLink(ctx context.Context, kind string, expires time.Time) (_ Link, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	r, err := w.store.q.LinkInsert(ctx, w.store.pool, db.LinkInsertParams{ThreadID: w.threadID, Kind: kind,
		ExpiresAt: pgtype.Timestamptz{Time: expires, Valid: true}})
	if isForeignKeyViolation(err) {
		return Link{}, ErrNotFound
	}
	if err != nil {
		return Link{}, fmt.Errorf("issue link: %w", err)
	}
	return fromLink(r), nil
}

// Links lists the thread's tokens that have not expired, oldest first, after the id after.
// ErrNotFound when the thread does not exist.
func (w *Workspace) Links(ctx context.Context, after int64, limit int) (_ []Link, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if err := w.exists(ctx); err != nil {
		return nil, err
	}
	rows, err := w.store.q.LinkListByThread(ctx, w.store.pool, db.LinkListByThreadParams{ThreadID: w.threadID, AfterID: after, MaxRows: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := make([]Link, len(rows))
	for i, r := range rows {
		out[i] = fromLink(r)
	}
	return out, nil
}

// RevokeLink revokes the thread's token id: from now on it is refused. ErrNotFound when there is
// no such token (already revoked, or expired and removed).
func (w *Workspace) RevokeLink(ctx context.Context, id int64) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	n, err := w.store.q.LinkDelete(ctx, w.store.pool, db.LinkDeleteParams{ThreadID: w.threadID, ID: id})
	if err != nil {
		return fmt.Errorf("revoke link: %w", err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// LinkValid reports whether the thread's token id of kind is still valid: issued, neither revoked
// nor expired, and its thread not deleted.
func (w *Workspace) LinkValid(ctx context.Context, kind string, id int64) (_ bool, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	ok, err := w.store.q.LinkValid(ctx, w.store.pool, db.LinkValidParams{ThreadID: w.threadID, ID: id, Kind: kind})
	if err != nil {
		return false, fmt.Errorf("check link: %w", err)
	}
	return ok, nil
}

func fromLink(r db.Link) Link {
	return Link{ID: r.ID, Kind: r.Kind, ExpiresAt: r.ExpiresAt.Time.UTC(), CreatedAt: r.CreatedAt.Time.UTC()}
}
