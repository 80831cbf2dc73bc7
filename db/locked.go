package db

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ThreadLock names how a LockedTx takes its thread's row.
type ThreadLock int

const (
	// LockThread locks an existing thread (ThreadLock): the agent path.
	LockThread ThreadLock = iota
	// LockThreadTouch locks an existing thread and marks it updated (ThreadLockTouch).
	LockThreadTouch
	// LockThreadUpsert creates the thread when new, else marks it updated (ThreadUpsertTouch); a
	// thread it creates takes its counters past its id's tombstone (ThreadRevive).
	LockThreadUpsert
)

func (l ThreadLock) sql() string {
	switch l {
	case LockThreadTouch:
		return threadLockTouch
	case LockThreadUpsert:
		return threadUpsertTouch
	}
	return threadLock
}

// LockedTx is a transaction holding one thread's row lock, begun in one round trip: BEGIN, the
// transaction's idle timeout, the lock and the read of the thread's preferences go out as one
// pipeline. The statements run one after the other, each with its own snapshot, so the list is
// read after the lock is held and sees every edit committed before it.
type LockedTx struct {
	conn *pgxpool.Conn
	done bool
	// LockedThread is the thread the transaction locked first.
	LockedThread
	// Scope is the thread's place among its scopes (ThreadScopeGet), when asked for.
	Scope ThreadScopeGetRow
}

// IdleTimeout bounds how long a LockedTx may sit idle between its statements before Postgres
// ends it (idle_in_transaction_session_timeout, for the transaction alone). A transaction of
// wsproxy is idle only while the proxy prepares its next statement; one whose client was cut
// off from Postgres without a word (a network partition) would otherwise hold its thread's row
// lock, and stop every turn and edit of the thread on every replica, until Postgres's TCP stack
// gave up on the peer (hours).
const IdleTimeout = 5 * time.Second

var setIdleTimeout = fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", IdleTimeout.Milliseconds())

// BeginLocked begins a LockedTx on a connection of pool. ErrNotFound when the lock found no
// thread (LockThread, LockThreadTouch); the transaction is then already over. When ctx has a
// deadline, the transaction's wait for a lock and each of its statements are bounded by the time
// left (SET LOCAL lock_timeout and statement_timeout), on the server: the thread's lock is never
// held past the operation's bound, also when the client is gone or the connection sets no
// statement_timeout (PgBouncer drops startup parameters).
// With scope, it also reads the thread's place among its scopes (Scope) in the same round trip.
func BeginLocked(ctx context.Context, pool *pgxpool.Pool, lock ThreadLock, threadID string, scope bool) (*LockedTx, error) {
	return beginLocked(ctx, pool, lock, threadID, scope, nil)
}

// BeginParentsLocked begins a LockedTx that changes threadID's parents to parents (ThreadSetParents),
// the thread created when new (LockThreadUpsert): its first statement takes the keys of the
// change (ThreadParentsLock, waiting for them) before the transaction locks any row, as
// migration 017 asks of every parents change.
func BeginParentsLocked(ctx context.Context, pool *pgxpool.Pool, threadID string, parents []string) (*LockedTx, error) {
	return beginLocked(ctx, pool, LockThreadUpsert, threadID, false, func(b *pgx.Batch) {
		b.Queue(threadParentsLock, threadID, parents)
	})
}

// beginLocked is BeginLocked, with the statements first queues (when not nil) before the lock.
func beginLocked(ctx context.Context, pool *pgxpool.Pool, lock ThreadLock, threadID string, scope bool, first func(b *pgx.Batch)) (*LockedTx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	t := &LockedTx{conn: conn}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(setIdleTimeout)
	queueDeadline(ctx, b)
	if first != nil {
		first(b)
	}
	queueLock(b, &t.LockedThread, lock, threadID)
	if scope {
		b.Queue(threadScopeGet, threadID).QueryRow(func(row pgx.Row) error {
			s := &t.Scope
			return row.Scan(&s.Parents, &s.OwnAgentWrites, &s.Ancestors, &s.AgentWrites, &s.Inherited, &s.OwnUntrustedWrites,
				&s.UntrustedWrites, &s.InheritedBy)
		})
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		t.Rollback(ctx)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, ErrNotFound
		}
		return nil, fmt.Errorf("lock thread: %w", err)
	}
	return t, nil
}

// LockedThread is a thread whose row a LockedTx holds, as the lock read it.
type LockedThread struct {
	// NextPreferenceID is the thread's next preference id.
	NextPreferenceID int64
	// CreatedAt is when the thread was created: it tells one life of a thread id (deleted, then
	// created again) from the next.
	CreatedAt time.Time
	// Version is the thread's workspace version (its next_event_id), as the lock found it.
	Version int64
	// Objective is the thread's objective ("" none), and ObjectiveSource its source.
	Objective, ObjectiveSource string
	// Preferences is the thread's list in creation order.
	Preferences []Preference
}

// queueLock queues the lock of threadID's row (as lock says) and the reads of t.
func queueLock(b *pgx.Batch, t *LockedThread, lock ThreadLock, threadID string) {
	b.Queue(lock.sql(), threadID).QueryRow(func(row pgx.Row) error {
		return row.Scan(&t.NextPreferenceID, &t.CreatedAt, &t.Version, &t.Objective, &t.ObjectiveSource)
	})
	if lock == LockThreadUpsert {
		b.Queue(threadRevive, threadID).QueryRow(func(row pgx.Row) error { return row.Scan(&t.NextPreferenceID, &t.Version) })
	}
	b.Queue(preferenceListByThread, threadID).Query(func(rows pgx.Rows) (err error) {
		t.Preferences, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Preference])
		return err
	})
}

// LockAlso locks a second thread's row in the transaction, as BeginLocked locks the first, in
// one round trip. The caller takes the locks in thread id order (two transactions that lock the
// same two threads then never deadlock). ErrNotFound when the lock found no thread; the
// transaction stays open for the caller to roll back.
func (t *LockedTx) LockAlso(ctx context.Context, lock ThreadLock, threadID string) (LockedThread, error) {
	var other LockedThread
	b := &pgx.Batch{}
	queueLock(b, &other, lock, threadID)
	if err := t.conn.SendBatch(ctx, b).Close(); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return LockedThread{}, ErrNotFound
		}
		return LockedThread{}, fmt.Errorf("lock thread: %w", err)
	}
	return other, nil
}

// queueDeadline queues, when ctx has a deadline, the bound of the transaction's waits for a lock
// and of each of its statements by the time left (SET LOCAL lock_timeout and statement_timeout):
// Postgres gives up at the deadline itself, also when the client is gone or the connection sets
// no statement_timeout (PgBouncer drops startup parameters). One statement whose text never
// changes, the time its parameter: a SET with the time in its text was a statement of its own
// for each call, prepared in a round trip of its own and crowding the connection's cache of
// prepared statements.
func queueDeadline(ctx context.Context, b *pgx.Batch) {
	if ms := timeLeft(ctx); ms != "" {
		b.Queue(setDeadline, ms)
	}
}

// timeLeft is the time left before ctx's deadline in milliseconds (at least 1), as lock_timeout
// and statement_timeout take it; "" when ctx has no deadline.
func timeLeft(ctx context.Context) string {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ""
	}
	return strconv.FormatInt(max(time.Until(deadline).Milliseconds(), 1), 10)
}

const setDeadline = `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $1, true)`

// Conn is the transaction's connection, for the queries in between.
func (t *LockedTx) Conn() DBTX { return t.conn }

// Commit commits, sending the queries queued by queue (if any) in the same round trip.
func (t *LockedTx) Commit(ctx context.Context, queue func(b *pgx.Batch)) error {
	b := &pgx.Batch{}
	if queue != nil {
		queue(b)
	}
	b.Queue("COMMIT")
	err := t.conn.SendBatch(ctx, b).Close()
	if err != nil {
		t.Rollback(ctx)
		return fmt.Errorf("commit: %w", err)
	}
	t.release()
	return nil
}

// ErrGuardRefused: ToolCallGuard let a call's pipeline write nothing: the workspace the call was
// planned on is no longer the thread's (migration 015), or another transaction holds a row the
// call would lock.
var ErrGuardRefused = errors.New("the workspace changed since the call was planned, or its row is held")

// SendGuarded sends, in one round trip and one transaction that waits for the disk, ToolCallGuard
// with arg and then the statements queue queues: they run only when the thread's row, locked
// with the rows the call rewrites (arg.Rows, arg.Objective) without waiting for any of them, is
// still the one of arg.CreatedAt at arg.Version. Else nothing is written and the error is
// ErrGuardRefused. The time left before ctx's deadline (timeLeft) bounds the statements after
// the guard, as queueDeadline does; arg.Timeout is set from it.
func SendGuarded(ctx context.Context, pool *pgxpool.Pool, arg ToolCallGuardParams, queue func(b *pgx.Batch)) error {
	if ms := timeLeft(ctx); ms != "" {
		arg.Timeout = ms
	}
	b := &pgx.Batch{}
	b.Queue(toolCallGuard, arg.ThreadID, arg.CreatedAt, arg.Timeout, arg.Version, arg.Rows, arg.Objective)
	queue(b)
	err := pool.SendBatch(ctx, b).Close()
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && (pgErr.Code == "WS409" || pgErr.Code == "55P03") {
		return ErrGuardRefused
	}
	return err
}

// QueuePreferenceInsertBatch queues PreferenceInsertBatch (its rows unread).
func QueuePreferenceInsertBatch(b *pgx.Batch, arg PreferenceInsertBatchParams) {
	b.Queue(preferenceInsertBatch, arg.ThreadID, arg.Ids, arg.Titles, arg.Subtitles, arg.Kinds, arg.Locks, arg.Sources, arg.NextPreferenceID)
}

// QueuePreferenceUpdateUnlocked queues PreferenceUpdateUnlocked; done gets the ids it updated.
func QueuePreferenceUpdateUnlocked(b *pgx.Batch, arg PreferenceUpdateUnlockedParams, done func(ids []int64) error) {
	b.Queue(preferenceUpdateUnlocked, arg.ThreadID, arg.Ids, arg.Titles, arg.Subtitles, arg.Kinds, arg.Sources).Query(collectIDs(done))
}

// QueuePreferenceDeleteUnlocked queues PreferenceDeleteUnlocked; done gets the ids it deleted.
func QueuePreferenceDeleteUnlocked(b *pgx.Batch, arg PreferenceDeleteUnlockedParams, done func(ids []int64) error) {
	b.Queue(preferenceDeleteUnlocked, arg.ThreadID, arg.Ids).Query(collectIDs(done))
}

func collectIDs(done func(ids []int64) error) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		return done(ids)
	}
}

// QueueObjectiveUpsert queues ObjectiveUpsert (its row unread).
func QueueObjectiveUpsert(b *pgx.Batch, arg ObjectiveUpsertParams) {
	b.Queue(objectiveUpsert, arg.ThreadID, arg.Text, arg.UpdatedBy, arg.Source)
}

// QueueToolCallInsert queues ToolCallInsert, for Commit.
func QueueToolCallInsert(b *pgx.Batch, arg ToolCallInsertParams) {
	b.Queue(toolCallInsert, arg.ThreadID, arg.Turn, arg.Round, arg.CallID, arg.Tool, arg.Arguments, arg.ActionAndReasoning, arg.Ok, arg.Result)
}

// Rollback ends the transaction without its writes; it is a no-op after Commit. It runs under
// context.WithoutCancel so a cancelled request still releases the thread's lock at once; a
// connection it cannot roll back is closed rather than returned to the pool.
func (t *LockedTx) Rollback(ctx context.Context) {
	if t.done {
		return
	}
	if _, err := t.conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
		_ = t.conn.Conn().Close(context.WithoutCancel(ctx))
	}
	t.release()
}

func (t *LockedTx) release() {
	t.done = true
	t.conn.Release()
}

// QueueEventInsert queues EventInsert, for Commit; firstID, when not nil, gets the first event id.
func QueueEventInsert(b *pgx.Batch, arg EventInsertParams, firstID *int64) {
	b.Queue(eventInsert, arg.Kinds, arg.ThreadID, arg.Actor, arg.Via, arg.Turn, arg.Round, arg.AfterToolCall, arg.Reason, arg.Context,
		arg.TargetTypes, arg.TargetIds, arg.Befores, arg.Afters, arg.Reverts, arg.Proposals, arg.Answers, arg.Moves).QueryRow(func(row pgx.Row) error {
		var r EventInsertRow
		if err := row.Scan(&r.FirstID, &r.Inserted); err != nil {
			return err
		}
		if firstID != nil {
			*firstID = r.FirstID
		}
		return nil
	})
}
