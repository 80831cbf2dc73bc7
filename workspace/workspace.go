// Package workspace is the domain: the store of every thread's workspace in Postgres, a thread's
// workspace (its objective and preferences, thread ids, scopes, events and history, reverts and
// proposals, links, turn starts, Responses records, usage), the block injected into the prompt,
// the user-path operations the admin REST calls, and the write of a tool call that package tools
// plans (toolcall.go). It knows Postgres (through db) and nothing of HTTP or of the tools.
package workspace

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wsproxy/wsproxy/db"
)

// ErrNotFound: the thread or preference does not exist.
var ErrNotFound = db.ErrNotFound

// Preference kinds.
const (
	Hard = "hard"
	Soft = "soft"
)

// Who last set an objective; who made a change (an event's actor).
const (
	ByAgent = "agent"
	ByUser  = "user"
)

// The paths a change comes by (an event's via, docs/spec.md §13 and §15).
const (
	ViaProxy = "proxy" // a tool call of a proxied turn
	ViaMCP   = "mcp"   // a tool call over MCP
	ViaAdmin = "admin" // a user's change, through the admin REST (the panel calls it too)
)

// Preference is one item of a thread's list. Index is its 1-based position in creation order.
// Snapshots keep no times: there they are zero, and left out of the JSON. Source is where it
// came from (SourceUser, SourceConfirmed, SourceAgent, SourceUnconfirmed; docs/spec.md §19); ""
// in a snapshot stored before sources were kept, and then left out of the JSON.
type Preference struct {
	ID        int64     `json:"id"`
	Index     int       `json:"index"`
	Title     string    `json:"title"`
	Subtitle  string    `json:"subtitle"`
	Kind      string    `json:"kind"`
	Locked    bool      `json:"locked"`
	Source    string    `json:"source,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// Unconfirmed reports whether the item came from content the user did not write and the user has
// not confirmed it: the block shows it under its own heading (docs/spec.md §19).
func (p Preference) Unconfirmed() bool { return p.Source == SourceUnconfirmed }

// Objective is the thread's one objective, and where it came from (Preference.Source).
type Objective struct {
	Text      string    `json:"text"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
	Source    string    `json:"source"`
}

// Limits bound what a thread's workspace holds, and what one tool call may ask. Lengths count
// characters (runes).
type Limits struct {
	TitleMax       int
	SubtitleMax    int
	ObjectiveMax   int
	PreferencesMax int
	// ItemsMax bounds the items, edits or indices of one call (MAX_TOOL_ITEMS).
	ItemsMax int
	// ArgumentBytesMax bounds a call's arguments, in bytes (MAX_TOOL_ARGUMENT_BYTES).
	ArgumentBytesMax int
}

// DefaultLimits are the limits of docs/spec.md §5, and bounds of a call far above what a model
// asks of these tools: 1,000 items and 1 MiB of arguments.
func DefaultLimits() Limits {
	return Limits{TitleMax: 200, SubtitleMax: 500, ObjectiveMax: 1000, PreferencesMax: 100, ItemsMax: 1000, ArgumentBytesMax: 1 << 20}
}

// ValidationError is input that breaks a rule (a limit, an allowed kind, a required field).
type ValidationError struct {
	Field   string // the offending field, e.g. "items[1].title"
	Message string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// DuplicateError: a title equal to one already recorded (case-insensitive, spaces trimmed and
// collapsed).
type DuplicateError struct {
	Existing Preference
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("already recorded: #%d %q", e.Existing.Index, e.Existing.Title)
}

// Store holds every thread's workspace in Postgres.
type Store struct {
	pool    *pgxpool.Pool
	q       *db.Queries
	limits  Limits
	timeout time.Duration
	starter *turnStarter
	// untrusted is Options.UntrustedWrites.
	untrusted string
	// onProposals is Options.OnProposals.
	onProposals func([]ProposalNotice)
	// inherited keeps the turn starts' inherited lists decoded (docs/spec.md §17).
	inherited inheritedCache
}

// Limits are the limits the store's calls are held to.
func (w *Workspace) Limits() Limits { return w.store.limits }

// Options configure a Store.
type Options struct {
	// Limits; zero fields take their DefaultLimits value.
	Limits Limits
	// Timeout bounds each workspace operation: the wait for a pooled connection (all busy: the
	// operation waits, then fails) and its statements. Zero means DefaultTimeout.
	Timeout time.Duration
	// UntrustedWrites is what becomes of an agent's write that a tainted turn made and the user's
	// words do not ground (docs/spec.md §19): UntrustedPropose ("" too), UntrustedApply or
	// UntrustedRefuse.
	UntrustedWrites string
	// OnProposals, when set, is told of the proposals an agent's write made, once it committed
	// (PROPOSALS_WEBHOOK). It must not block: it runs in the call's goroutine.
	OnProposals func([]ProposalNotice)
}

// What becomes of an untrusted, ungrounded write (docs/spec.md §19, UNTRUSTED_WRITES).
const (
	UntrustedPropose = "propose"
	UntrustedApply   = "apply"
	UntrustedRefuse  = "refuse"
)

// UntrustedWrites is the store's untrusted_writes, the deployment's default (UNTRUSTED_WRITES):
// UntrustedPropose unless set. A workspace's own, or its nearest ancestor's, comes first
// (ScopeInfo.UntrustedWrites).
func (w *Workspace) UntrustedWrites() string { return w.store.untrustedWrites() }

func (s *Store) untrustedWrites() string { return cmp.Or(s.untrusted, UntrustedPropose) }

// DefaultTimeout is a workspace operation's default time bound.
const DefaultTimeout = 10 * time.Second

// NewStore returns a store on pool.
func NewStore(pool *pgxpool.Pool, opts Options) *Store {
	limits, d := opts.Limits, DefaultLimits()
	if limits.TitleMax <= 0 {
		limits.TitleMax = d.TitleMax
	}
	if limits.SubtitleMax <= 0 {
		limits.SubtitleMax = d.SubtitleMax
	}
	if limits.ObjectiveMax <= 0 {
		limits.ObjectiveMax = d.ObjectiveMax
	}
	if limits.PreferencesMax <= 0 {
		limits.PreferencesMax = d.PreferencesMax
	}
	if limits.ItemsMax <= 0 {
		limits.ItemsMax = d.ItemsMax
	}
	if limits.ArgumentBytesMax <= 0 {
		limits.ArgumentBytesMax = d.ArgumentBytesMax
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	return &Store{pool: pool, q: db.New(), limits: limits, timeout: opts.Timeout, untrusted: opts.UntrustedWrites, onProposals: opts.OnProposals,
		starter: &turnStarter{pool: pool, timeout: opts.Timeout}}
}

// ErrUnavailable marks the failures of an operation that are Postgres's, not the operation's:
// Postgres unreachable, refusing or dropping connections, starting or shutting down, or not
// answering within the operation's time bound. The operation may succeed later.
var ErrUnavailable = errors.New("the workspace store (Postgres) is unavailable")

// op begins one workspace operation: ctx bounded by the store's timeout, and done, which the
// operation defers with its error to release the bound and mark a failure of Postgres itself
// with ErrUnavailable.
func (s *Store) op(ctx context.Context) (context.Context, func(*error)) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, func(err *error) {
		cancel()
		if *err != nil && !errors.Is(*err, ErrUnavailable) && db.Unavailable(*err) {
			*err = fmt.Errorf("%w: %w", ErrUnavailable, *err)
		}
	}
}

// Ping reports whether Postgres answers.
func (s *Store) Ping(ctx context.Context) (err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	return s.pool.Ping(ctx)
}

// Workspace returns the workspace of one thread. It does not touch the database; the thread is
// created by its first turn (or the first user edit).
func (s *Store) Workspace(id ThreadID) *Workspace {
	return &Workspace{store: s, id: id, threadID: id.String()}
}

// Workspace is one thread's workspace. Every write locks the thread's row first, so agent and
// user edits of one thread are serialized and indices resolve against one consistent list.
type Workspace struct {
	store    *Store
	id       ThreadID
	threadID string // id's stored form, the key of every row
}

// ThreadID is the thread the workspace belongs to.
func (w *Workspace) ThreadID() ThreadID { return w.id }

// TurnStart is the start of one chat turn: its number and the workspace as it stood, which is
// what the turn's snapshot recorded.
type TurnStart struct {
	Number    int
	Objective string // "" when none yet
	// ObjectiveSource is the objective's source ("" when none, or in a snapshot stored before
	// sources were kept).
	ObjectiveSource string
	Preferences     []Preference
	// Inherited is what the thread's ancestors give, nearest first, as the block shows it
	// (docs/spec.md §17).
	Inherited []Scope
	// AgentWrites is the review setting in force for the turn's calls (AgentWritesDirect or
	// AgentWritesPropose).
	AgentWrites string
	// Created is when the thread was created: the thread the turn's calls may run against (a
	// thread deleted and created again under its id is another).
	Created time.Time
	// Version is the workspace's version as the turn began (the thread's next_event_id), and
	// NextPreferenceID the thread's next preference id then: the workspace the turn's first call
	// is planned on (View).
	Version, NextPreferenceID int64
	// Tainted: an earlier turn of the thread read content the user did not write; ClientTools: an
	// earlier turn carried the client's own tools (docs/spec.md §19). As the thread had them
	// before this turn.
	Tainted, ClientTools bool
}

// Block renders the turn's workspace block.
func (t TurnStart) Block() string {
	return RenderWorkspaceBlock(t.Objective, t.ObjectiveSource, t.Preferences, t.Inherited)
}

// ShowsUnconfirmed reports whether the turn's block shows an unconfirmed item (the thread's own or
// an inherited one) or objective: what the model reads there came from content the user did not
// write, and taints the turn (docs/spec.md §19).
func (t TurnStart) ShowsUnconfirmed() bool {
	if t.ObjectiveSource == SourceUnconfirmed {
		return true
	}
	for _, p := range t.Preferences {
		if p.Unconfirmed() {
			return true
		}
	}
	for _, s := range t.Inherited {
		for _, p := range s.Preferences {
			if p.Unconfirmed() {
				return true
			}
		}
	}
	return false
}

// TurnOptions are what a turn's request says of its thread.
type TurnOptions struct {
	// Parents, when not nil, are the thread's parents as the request names them
	// (X-Workspace-Parents, or THREAD_PARENTS with ParentsIfNew): stored before the turn begins
	// when they differ from the stored ones, by the client.
	Parents []ThreadID
	// ParentsIfNew stores Parents only on the thread's first turn.
	ParentsIfNew bool
	// ReadsUntrusted: the request holds content the user did not write (docs/spec.md §19), which
	// taints the thread for good; ClientTools: it carries the client's own tools. Stored when
	// they change what the thread has.
	ReadsUntrusted, ClientTools bool
}

// StartTurn begins a turn in one statement (TurnStart), in one round trip with the turns of
// other threads that start at the same time (turnStarter): it creates the thread on its first
// turn (and stores the parents the request names), takes the next turn number, and snapshots the
// workspace, its ancestors' included, under it when it changed since the last snapshot, reading
// the workspace's tables only then. It commits without waiting for the disk: a crash may lose a
// turn start, and with it only a turn number, a snapshot of a workspace that the last stored one
// already holds and a change of parents the client's next request makes again; any later durable
// commit of the thread (a tool call, an edit) flushes the WAL past it, so nothing durable can
// refer to a lost turn. A *ParentsError for parents that cannot be stored (no turn begins);
// ErrNotFound for parents of another client.
func (w *Workspace) StartTurn(ctx context.Context, opts TurnOptions) (_ TurnStart, err error) {
	// A caller whose own bound is shorter than an operation's (WORKSPACE_BUDGET) must be able to
	// leave at it, while the batch its start goes in runs on for the others.
	deadline, bounded := ctx.Deadline()
	bounded = bounded && time.Until(deadline) < w.store.timeout
	ctx, done := w.store.op(ctx)
	defer done(&err)
	args := db.TurnStartParams{ThreadID: w.threadID, ParentsIfNew: opts.ParentsIfNew, ReadsUntrusted: opts.ReadsUntrusted,
		HasClientTools: opts.ClientTools}
	if opts.Parents != nil {
		if args.Parents, err = w.storedParents(opts.Parents); err != nil {
			return TurnStart{}, err
		}
	}
	row, err := w.store.starter.start(ctx, args, bounded)
	if err != nil {
		return TurnStart{}, fmt.Errorf("start turn: %w", err)
	}
	if row.Refused != "" {
		return TurnStart{}, parentsRefused(row.Refused)
	}
	prefs, err := decodeSnapshotPreferences(row.Preferences)
	if err != nil {
		return TurnStart{}, err
	}
	inherited, err := w.store.inherited.shown(row.Inherited, row.Preferences, prefs, w.id.Client)
	if err != nil {
		return TurnStart{}, err
	}
	return TurnStart{Number: int(row.Turn), Objective: row.Objective.String, ObjectiveSource: row.ObjectiveSource, Preferences: prefs,
		Inherited: inherited, AgentWrites: row.AgentWrites, Created: row.CreatedAt.Time, Version: row.Version,
		NextPreferenceID: row.NextPreferenceID, Tainted: row.Tainted, ClientTools: row.ClientTools}, nil
}

// decodeSnapshotPreferences decodes the preferences a snapshot stored (id, title, subtitle,
// kind, locked, in list order).
func decodeSnapshotPreferences(b []byte) ([]Preference, error) {
	if string(b) == "[]" { // an empty list (no allocation, as json.Unmarshal's would make)
		return []Preference{}, nil
	}
	var prefs []Preference
	if err := json.Unmarshal(b, &prefs); err != nil {
		return nil, fmt.Errorf("decode snapshot preferences: %w", err)
	}
	for i := range prefs {
		prefs[i].Index = i + 1
	}
	return prefs, nil
}

// locked runs fn, a user's edit, in a transaction that holds the thread's row lock (taken as
// lock says), with the thread's next preference id and its current list, and commits when fn
// returns nil, appending the events of the changes fn reports in the same round trip. It returns
// the first event's id (0 for none).
func (w *Workspace) locked(ctx context.Context, lock db.ThreadLock, fn func(q db.DBTX, nextID int64, list []Preference) ([]Change, error)) (int64, error) {
	tx, err := db.BeginLocked(ctx, w.store.pool, lock, w.threadID, false)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	changes, err := fn(tx.Conn(), tx.NextPreferenceID, fromRows(tx.Preferences))
	if err != nil {
		return 0, err
	}
	var first int64
	err = tx.Commit(ctx, func(b *pgx.Batch) {
		if len(changes) > 0 {
			db.QueueEventInsert(b, w.eventParams(ByUser, ViaAdmin, changes), &first)
		}
	})
	return first, err
}

func fromRows(rows []db.Preference) []Preference {
	list := make([]Preference, len(rows))
	for i, r := range rows {
		list[i] = fromRow(i+1, r)
	}
	return list
}

func fromRow(index int, r db.Preference) Preference {
	return Preference{
		ID: r.ID, Index: index, Title: r.Title, Subtitle: r.Subtitle, Kind: r.Kind, Locked: r.Locked, Source: r.Source,
		CreatedAt: r.CreatedAt.Time.UTC(), UpdatedAt: r.UpdatedAt.Time.UTC(),
	}
}

func isForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}

// normalizeTitle is the key titles are compared by: case-insensitive, spaces trimmed and collapsed.
func normalizeTitle(s string) string {
	return strings.ToLower(strings.Join(strings.Fields(s), " "))
}

// TitleIndex finds preferences by title (normalizeTitle), in time independent of the list's length.
type TitleIndex map[string][]Preference

// Add adds p to the index.
func (ix TitleIndex) Add(p Preference) {
	k := normalizeTitle(p.Title)
	ix[k] = append(ix[k], p)
}

// Find returns the first preference added whose title equals title, skipping the one with id skip.
func (ix TitleIndex) Find(title string, skip int64) (Preference, bool) {
	for _, p := range ix[normalizeTitle(title)] {
		if p.ID != skip {
			return p, true
		}
	}
	return Preference{}, false
}

// findTitle returns the preference in list whose title equals title, skipping the one with id skip.
func findTitle(list []Preference, title string, skip int64) (Preference, bool) {
	key := normalizeTitle(title)
	for _, p := range list {
		if p.ID != skip && normalizeTitle(p.Title) == key {
			return p, true
		}
	}
	return Preference{}, false
}

// checkText validates one text value: trimmed, within [min, max] characters, valid UTF-8 and
// free of NUL (which Postgres text cannot hold).
func checkText(field, s string, min, max int) (string, error) {
	s = strings.TrimSpace(s)
	if !utf8.ValidString(s) {
		return "", invalid(field, "must be valid UTF-8")
	}
	if strings.ContainsRune(s, 0) {
		return "", invalid(field, "must not contain NUL characters")
	}
	n := utf8.RuneCountInString(s)
	if n < min {
		if min == 1 {
			return "", invalid(field, "must not be empty")
		}
		return "", invalid(field, "must be at least %d characters", min)
	}
	if n > max {
		return "", invalid(field, "must be at most %d characters (got %d)", max, n)
	}
	return s, nil
}

// CheckKind validates a kind: "hard" or "soft", in any case, spaces trimmed.
func CheckKind(field, kind string) (string, error) {
	switch k := strings.ToLower(strings.TrimSpace(kind)); k {
	case Hard, Soft:
		return k, nil
	}
	return "", invalid(field, `must be "hard" or "soft"`)
}

// CheckTitle validates a preference's title (checkText) against the limits.
func (l Limits) CheckTitle(field, v string) (string, error) {
	return checkText(field, v, 1, l.TitleMax)
}

// CheckSubtitle validates a preference's subtitle (checkText) against the limits.
func (l Limits) CheckSubtitle(field, v string) (string, error) {
	return checkText(field, v, 0, l.SubtitleMax)
}

// CheckObjective validates an objective (checkText) against the limits.
func (l Limits) CheckObjective(field, v string) (string, error) {
	return checkText(field, v, 1, l.ObjectiveMax)
}

// insert adds preferences to the thread with ids from nextID on, inside tx: the user path's (a
// preference without a source is the user's).
func (w *Workspace) insert(ctx context.Context, tx db.DBTX, nextID int64, items []Preference) ([]db.Preference, error) {
	p := db.PreferenceInsertBatchParams{ThreadID: w.threadID, NextPreferenceID: nextID + int64(len(items))}
	for i, it := range items {
		p.Ids = append(p.Ids, nextID+int64(i))
		p.Titles = append(p.Titles, it.Title)
		p.Subtitles = append(p.Subtitles, it.Subtitle)
		p.Kinds = append(p.Kinds, it.Kind)
		p.Locks = append(p.Locks, it.Locked)
		p.Sources = append(p.Sources, cmp.Or(it.Source, SourceUser))
	}
	rows, err := w.store.q.PreferenceInsertBatch(ctx, tx, p)
	if err != nil {
		return nil, fmt.Errorf("insert preferences: %w", err)
	}
	return rows, nil
}

// UndoTurn gives back the turn start began, which never reached its model (its first upstream
// round failed): its number, when no later turn took one, its snapshot, and, for a first turn,
// the thread and the empty parents its start created, when nothing was written to them since
// (docs/spec.md §2). It names the thread the turn began on (start.Created): a thread deleted and
// created again under its id meanwhile is another, and loses nothing.
func (w *Workspace) UndoTurn(ctx context.Context, start TurnStart) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if err := w.store.q.TurnUndo(ctx, w.store.pool, w.undoParams(int32(start.Number), start.Created)); err != nil {
		return fmt.Errorf("undo turn: %w", err)
	}
	return nil
}

// undoParams are TurnUndo's parameters for turn n of the thread created at created.
func (w *Workspace) undoParams(n int32, created time.Time) db.TurnUndoParams {
	return db.TurnUndoParams{ThreadID: w.threadID, Turn: n, CreatedAt: pgtype.Timestamptz{Time: created, Valid: true}}
}
