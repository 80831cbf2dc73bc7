package workspace

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wsproxy/wsproxy/db"
)

// The user path: what the admin REST calls. It ignores locks (it is where items are locked and
// unlocked) but keeps the limits, the allowed kinds and the no-duplicates rule, and it takes the
// same thread lock as the agent path.

// Thread is a thread as the admin listing shows it.
type Thread struct {
	ID              string    `json:"id"`
	Client          string    `json:"client,omitempty"` // with client keys: whose thread it is
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
	Turns           int       `json:"turns"`
	Objective       *string   `json:"objective"`
	PreferenceCount int       `json:"preference_count"`
	// Title is the user's name of the thread (SetTitle); Agent the User-Agent of its first
	// turn's request and FirstWords the user's own words in it (Label): what tells sessions
	// apart (docs/spec.md §13). Each null when none is kept.
	Title      *string `json:"title"`
	Agent      *string `json:"agent"`
	FirstWords *string `json:"first_words"`
	// Parents are its parents, nearest first, by the names their client gives them; Children how
	// many threads name it among theirs (a scope has some: docs/spec.md §17); PendingProposals
	// how many proposals wait for the user in it.
	Parents          []string `json:"parents"`
	Children         int      `json:"children"`
	PendingProposals int      `json:"pending_proposals"`
	// Cursor is what a listing takes to go on after this thread (its updated_at and id).
	Cursor string `json:"cursor"`
}

// ThreadFilter narrows a listing of threads: Parent (a stored id, "" none) keeps the threads
// that name it among their parents; Search ("" none) those whose name, title, objective or first
// words hold it, case-insensitively.
type ThreadFilter struct {
	Parent, Search string
}

// Detail is one thread's whole workspace, with the block as it would be injected now and the
// usage of its turns.
type Detail struct {
	ID          string       `json:"id"`
	Client      string       `json:"client,omitempty"`
	Objective   *Objective   `json:"objective"`
	Preferences []Preference `json:"preferences"`
	Block       string       `json:"block"`
	Usage       Usage        `json:"usage"`
	// Parents are the thread's parents, nearest first, by the names their client gives them;
	// Inherited what its ancestors give, as its block shows it (docs/spec.md §17).
	Parents   []string `json:"parents"`
	Inherited []Scope  `json:"inherited"`
	// AgentWrites is the review setting in force, AgentWritesInherited whether it is an
	// ancestor's (or the default) rather than the thread's own.
	AgentWrites          string `json:"agent_writes"`
	AgentWritesInherited bool   `json:"agent_writes_inherited"`
	// UntrustedWrites is the untrusted_writes in force (docs/spec.md §19), UntrustedWritesInherited
	// whether it is an ancestor's or the deployment's rather than the thread's own; InheritedBy
	// whether other threads name this one among their parents.
	UntrustedWrites          string `json:"untrusted_writes"`
	UntrustedWritesInherited bool   `json:"untrusted_writes_inherited"`
	InheritedBy              bool   `json:"inherited_by"`
	// SharedWith are the clients a workspace outside every client's namespace is shared with
	// ("*": every client; docs/spec.md §20), empty for none and for a client's thread.
	SharedWith []string `json:"shared_with"`
	// Title, Agent and FirstWords are what tells the thread apart (Thread's).
	Title      *string `json:"title"`
	Agent      *string `json:"agent"`
	FirstWords *string `json:"first_words"`

	// LastEventID is the thread's latest event id as the rest was read: its version (tools.AsOfChange).
	LastEventID int64 `json:"-"`
}

// Usage is what the upstream reported for a thread's turns: tokens of the prompts, the parts of
// them served from and written to the upstream's prompt cache, and tokens of the answers.
type Usage struct {
	PromptTokens       int64 `json:"prompt_tokens"`
	CachedPromptTokens int64 `json:"cached_prompt_tokens"`
	CompletionTokens   int64 `json:"completion_tokens"`
	// CacheWriteTokens are the prompt tokens the upstream wrote to its prompt cache (the
	// Messages API's cache_creation_input_tokens), part of PromptTokens.
	CacheWriteTokens int64 `json:"cache_write_tokens"`
}

// Add adds o to u.
func (u *Usage) Add(o Usage) {
	u.PromptTokens = AddTokens(u.PromptTokens, o.PromptTokens)
	u.CachedPromptTokens = AddTokens(u.CachedPromptTokens, o.CachedPromptTokens)
	u.CompletionTokens = AddTokens(u.CompletionTokens, o.CompletionTokens)
	u.CacheWriteTokens = AddTokens(u.CacheWriteTokens, o.CacheWriteTokens)
}

// AddTokens is x+y, saturating at the int64 bounds: an upstream's hostile counts never wrap.
func AddTokens(x, y int64) int64 {
	s := x + y
	switch {
	case x > 0 && y > 0 && s < 0:
		return math.MaxInt64
	case x < 0 && y < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// Snapshot is the workspace as it stood at the start of a turn; it applies from that turn until
// the next snapshot (a turn that found the workspace unchanged stores none).
type Snapshot struct {
	Turn        int          `json:"turn"`
	CreatedAt   time.Time    `json:"created_at"`
	Objective   *string      `json:"objective"`
	Preferences []Preference `json:"preferences"` // without times
	// Inherited is what the thread's ancestors gave the turn, as its block showed it.
	Inherited []Scope `json:"inherited"`
}

// ToolCallRecord is one recorded tool call.
type ToolCallRecord struct {
	ID                 int64           `json:"id"`
	Turn               *int            `json:"turn"`    // null for a call of no turn (over MCP)
	Round              *int            `json:"round"`   // null for a call of no turn
	CallID             string          `json:"call_id"` // the id the model gave the call; "" when none was stored
	Tool               string          `json:"tool"`
	Arguments          json.RawMessage `json:"arguments"`
	ActionAndReasoning string          `json:"action_and_reasoning"`
	OK                 bool            `json:"ok"`
	Result             json.RawMessage `json:"result"`
	CreatedAt          time.Time       `json:"created_at"`
}

// PreferenceInput is a new preference from the user.
type PreferenceInput struct {
	Title    string
	Subtitle string
	Kind     string // "" means soft
	Locked   bool
}

// PreferencePatch is a user edit; nil fields keep their value.
type PreferencePatch struct {
	Title    *string
	Subtitle *string
	Kind     *string
	Locked   *bool
	// Confirm: the user confirms the item as it reads (docs/spec.md §19): an agent's or
	// unconfirmed item becomes confirmed, the user's stays the user's.
	Confirm bool
}

// Threads lists the threads whose stored id starts with prefix ("" for all), most recently
// updated first, after the cursor after: a listed thread's Cursor (the page goes on from that
// thread's place when it was listed, whatever happened to it since), or a bare thread id (from
// that thread's place now; nothing when it is gone). "" lists from the top. A cursor whose thread
// does not start with prefix is no cursor of this listing: refused, so that a caller scoped to a
// prefix (a client's namespace) learns nothing of a thread outside it.
func (s *Store) Threads(ctx context.Context, after, prefix string, filter ThreadFilter, limit int) (_ []Thread, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	p := db.ThreadListParams{Prefix: prefix, Parent: filter.Parent, Search: filter.Search, AfterID: after, MaxRows: int32(limit)}
	if micros, id, ok := strings.Cut(after, cursorSep); ok {
		n, err := strconv.ParseInt(micros, 10, 64)
		if err != nil {
			return nil, invalid("after", "is not a thread's cursor")
		}
		p.AfterID, p.AfterUpdatedAt = id, pgtype.Timestamptz{Time: time.UnixMicro(n), Valid: true}
	}
	if after != "" && !strings.HasPrefix(p.AfterID, prefix) {
		return nil, invalid("after", "is not a cursor of this listing")
	}
	rows, err := s.q.ThreadList(ctx, s.pool, p)
	if err != nil {
		return nil, fmt.Errorf("list threads: %w", err)
	}
	out := make([]Thread, len(rows))
	for i, r := range rows {
		out[i] = listed(db.ThreadSummaryRow(r))
	}
	return out, nil
}

// cursorSep joins a listed thread's updated_at and id in its cursor; a thread id never holds it.
const cursorSep = ","

// Summary is the thread as the admin listing shows it. ErrNotFound when it does not exist.
func (w *Workspace) Summary(ctx context.Context) (_ Thread, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	r, err := w.store.q.ThreadSummary(ctx, w.store.pool, w.threadID)
	if err != nil {
		return Thread{}, db.NotFound(err)
	}
	return listed(r), nil
}

func listed(r db.ThreadSummaryRow) Thread {
	id, _ := ParseThreadID(r.ID) // every stored id was checked when the thread was made
	th := Thread{
		ID: r.ID, Client: id.Client, CreatedAt: r.CreatedAt.Time.UTC(), UpdatedAt: r.UpdatedAt.Time.UTC(),
		Turns: int(r.Turns), PreferenceCount: int(r.PreferenceCount),
		Title: textOrNil(r.Title), Agent: textOrNil(r.Agent), FirstWords: textOrNil(r.FirstWords), Objective: textOrNil(r.Objective),
		Parents: make([]string, 0, len(r.Parents)), Children: int(r.Children), PendingProposals: int(r.PendingProposals),
		Cursor: strconv.FormatInt(r.UpdatedAt.Time.UnixMicro(), 10) + cursorSep + r.ID,
	}
	for _, p := range r.Parents {
		pid, _ := ParseThreadID(p)
		th.Parents = append(th.Parents, pid.Name)
	}
	return th
}

func textOrNil(t pgtype.Text) *string {
	if !t.Valid {
		return nil
	}
	return &t.String
}

// MaxTitle bounds a thread's title, and what Label keeps of its agent and first words, in
// characters.
const MaxTitle = 200

// SetTitle sets the user's name of the thread ("" for none). It is no part of the workspace: no
// event, and the thread's place in the listing stays. ErrNotFound when the thread does not exist.
func (w *Workspace) SetTitle(ctx context.Context, title string) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	title = strings.TrimSpace(title)
	if n := utf8.RuneCountInString(title); n > MaxTitle {
		return invalid("title", "must be at most %d characters (it has %d)", MaxTitle, n)
	}
	n, err := w.store.q.ThreadSetTitle(ctx, w.store.pool, db.ThreadSetTitleParams{ID: w.threadID, Title: pgtype.Text{String: title, Valid: title != ""}})
	if err != nil {
		return fmt.Errorf("set title: %w", err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// Label keeps what the thread's first turn says of it, unless kept already: the agent (its
// request's User-Agent) and the user's first words, each on one line, cut to MaxTitle
// characters ("" keeps nothing).
func (w *Workspace) Label(ctx context.Context, agent, firstWords string) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	a, f := labelText(agent), labelText(firstWords)
	if a == "" && f == "" {
		return nil
	}
	if err := w.store.q.ThreadLabel(ctx, w.store.pool, db.ThreadLabelParams{ID: w.threadID,
		Agent: pgtype.Text{String: a, Valid: a != ""}, FirstWords: pgtype.Text{String: f, Valid: f != ""}}); err != nil {
		return fmt.Errorf("label thread: %w", err)
	}
	return nil
}

// labelText is s on one line (runs of white space and control characters as one space), cut to
// MaxTitle characters, with an ellipsis where it was cut.
func labelText(s string) string {
	var b strings.Builder
	n, space := 0, false
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError {
			space = b.Len() > 0
			continue
		}
		if n == MaxTitle {
			b.WriteRune('…')
			break
		}
		if space {
			b.WriteByte(' ')
			n++
			space = false
			if n == MaxTitle {
				b.WriteRune('…')
				break
			}
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}

// Create makes the thread, empty, when it does not exist (a scope is named before it holds
// anything: docs/spec.md §17), and reports whether it made it.
func (w *Workspace) Create(ctx context.Context) (created bool, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if err := w.exists(ctx); err == nil {
		return false, nil
	} else if !errors.Is(err, ErrNotFound) {
		return false, err
	}
	if _, err := w.locked(ctx, db.LockThreadUpsert, func(db.DBTX, int64, []Preference) ([]Change, error) { return nil, nil }); err != nil {
		return false, err
	}
	return true, nil
}

// Get returns the thread's workspace. ErrNotFound when the thread does not exist. Its reads
// share one snapshot (REPEATABLE READ): the workspace as it stood at one moment.
func (w *Workspace) Get(ctx context.Context) (_ Detail, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	var d Detail
	err = db.WithTx(ctx, w.store.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		th, err := w.store.q.ThreadGet(ctx, tx, w.threadID)
		if err != nil {
			return db.NotFound(err)
		}
		d.LastEventID = th.NextEventID - 1
		d.SharedWith = th.SharedWith
		if d.SharedWith == nil || w.id.Client != "" {
			d.SharedWith = []string{}
		}
		d.Title, d.Agent, d.FirstWords = textOrNil(th.Title), textOrNil(th.Agent), textOrNil(th.FirstWords)
		u, err := w.store.q.ThreadUsageGet(ctx, tx, w.threadID)
		if err != nil {
			return fmt.Errorf("get usage: %w", err)
		}
		d.Usage = Usage(u)
		o, err := w.store.q.ObjectiveGet(ctx, tx, w.threadID)
		switch err = db.NotFound(err); err {
		case nil:
			d.Objective = &Objective{Text: o.Text, UpdatedBy: o.UpdatedBy, UpdatedAt: o.UpdatedAt.Time.UTC(), Source: o.Source}
		case db.ErrNotFound:
		default:
			return fmt.Errorf("get objective: %w", err)
		}
		rows, err := w.store.q.PreferenceListByThread(ctx, tx, w.threadID)
		if err != nil {
			return fmt.Errorf("list preferences: %w", err)
		}
		d.Preferences = fromRows(rows)
		scope, err := w.scopeOf(ctx, tx, d.Preferences)
		if err != nil {
			return err
		}
		d.Parents = make([]string, len(scope.Parents))
		for i, p := range scope.Parents {
			d.Parents[i] = p.NameFor(w.id.Client)
		}
		d.Inherited = scope.Inherited
		if d.Inherited == nil {
			d.Inherited = []Scope{}
		}
		d.AgentWrites, d.AgentWritesInherited = scope.AgentWrites, scope.OwnAgentWrites == ""
		d.UntrustedWrites, d.UntrustedWritesInherited = cmp.Or(scope.UntrustedWrites, w.store.untrustedWrites()), scope.OwnUntrustedWrites == ""
		d.InheritedBy = scope.InheritedBy
		return nil
	})
	if err != nil {
		return Detail{}, err
	}
	d.ID, d.Client = w.threadID, w.id.Client
	var objective, source string
	if d.Objective != nil {
		objective, source = d.Objective.Text, d.Objective.Source
	}
	d.Block = RenderWorkspaceBlock(objective, source, d.Preferences, d.Inherited)
	return d, nil
}

// Block is the workspace block a turn of the thread would start with now: the empty
// workspace's when the thread does not exist.
func (w *Workspace) Block(ctx context.Context) (string, error) {
	d, err := w.Get(ctx)
	if errors.Is(err, ErrNotFound) {
		return RenderBlock("", nil, nil), nil
	}
	return d.Block, err
}

// UsageBatch is the usage of the turns that ended within one interval, as one writer (a
// replica's usage writer) sends it: numbered, so that the batch sent again after its answer was
// lost is counted once.
type UsageBatch struct {
	Writer string // the writer's id: random per process
	Number int64  // increasing per writer; a batch that failed is sent again with its number
	Usage  map[ThreadID]Usage
}

// AddUsage adds a batch to its threads' totals, in one round trip that does not wait for the
// disk: a crash may lose the last turns' counts, never anything of the workspace. A thread gets
// a batch once, however often it is sent; a thread that no longer exists is skipped.
func (s *Store) AddUsage(ctx context.Context, b UsageBatch) (err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	params := make([]db.ThreadUsageAddParams, 0, len(b.Usage))
	for id, u := range b.Usage {
		params = append(params, db.ThreadUsageAddParams{ID: id.String(), WriterID: b.Writer, Batch: b.Number,
			PromptTokens: u.PromptTokens, CachedPromptTokens: u.CachedPromptTokens, CompletionTokens: u.CompletionTokens,
			CacheWriteTokens: u.CacheWriteTokens})
	}
	if err := db.AddUsage(ctx, s.pool, params); err != nil {
		return fmt.Errorf("add usage: %w", err)
	}
	return nil
}

// Delete erases the thread and everything of it. ErrNotFound when it does not exist.
func (w *Workspace) Delete(ctx context.Context) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	n, err := w.store.q.ThreadDelete(ctx, w.store.pool, w.threadID)
	if err != nil {
		return fmt.Errorf("delete thread: %w", err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// SetObjective sets the objective as the user, creating the thread when new.
func (w *Workspace) SetObjective(ctx context.Context, text string) (_ Objective, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	text, err = w.store.limits.CheckObjective("text", text)
	if err != nil {
		return Objective{}, err
	}
	var o Objective
	_, err = w.locked(ctx, db.LockThreadUpsert, func(tx db.DBTX, _ int64, _ []Preference) ([]Change, error) {
		r, err := w.store.q.ObjectiveUpsert(ctx, tx, db.ObjectiveUpsertParams{ThreadID: w.threadID, Text: text, UpdatedBy: ByUser,
			Source: SourceUser})
		if err != nil {
			return nil, fmt.Errorf("set objective: %w", err)
		}
		o = Objective{Text: r.Text, UpdatedBy: r.UpdatedBy, UpdatedAt: r.UpdatedAt.Time.UTC(), Source: SourceUser}
		if c, ok := ObjectiveSourcedChange(r.Previous, r.PreviousSource, r.Text, SourceUser); ok {
			return []Change{c}, nil
		}
		return nil, nil
	})
	if err != nil {
		return Objective{}, err
	}
	return o, nil
}

// AddPreference adds a preference as the user, creating the thread when new. A title already
// recorded gives a *DuplicateError; a full list or a broken limit a *ValidationError.
func (w *Workspace) AddPreference(ctx context.Context, in PreferenceInput) (_ Preference, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	p, err := w.store.checkInput(in)
	if err != nil {
		return Preference{}, err
	}
	_, err = w.locked(ctx, db.LockThreadUpsert, func(tx db.DBTX, nextID int64, list []Preference) ([]Change, error) {
		if existing, ok := findTitle(list, p.Title, -1); ok {
			return nil, &DuplicateError{Existing: existing}
		}
		if max := w.store.limits.PreferencesMax; len(list) >= max {
			return nil, invalid("", "a thread holds at most %d preferences", max)
		}
		rows, err := w.insert(ctx, tx, nextID, []Preference{p})
		if err != nil {
			return nil, err
		}
		p = fromRow(len(list)+1, rows[0])
		c, _ := PrefChange(nil, &p)
		return []Change{c}, nil
	})
	if err != nil {
		return Preference{}, err
	}
	return p, nil
}

func (s *Store) checkInput(in PreferenceInput) (Preference, error) {
	var p Preference
	var err error
	if p.Title, err = s.limits.CheckTitle("title", in.Title); err != nil {
		return p, err
	}
	if p.Subtitle, err = s.limits.CheckSubtitle("subtitle", in.Subtitle); err != nil {
		return p, err
	}
	p.Kind = Soft
	if in.Kind != "" {
		if p.Kind, err = CheckKind("kind", in.Kind); err != nil {
			return p, err
		}
	}
	p.Locked = in.Locked
	return p, nil
}

// UpdatePreference edits a preference by its stable id as the user, locked or not; this is
// where items are locked and unlocked. ErrNotFound when the thread or the id does not exist.
func (w *Workspace) UpdatePreference(ctx context.Context, id int64, patch PreferencePatch) (_ Preference, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	var out Preference
	_, err = w.locked(ctx, db.LockThreadTouch, func(tx db.DBTX, _ int64, list []Preference) ([]Change, error) {
		i := IndexOf(list, id)
		if i < 0 {
			return nil, ErrNotFound
		}
		in := PreferenceInput{Title: list[i].Title, Subtitle: list[i].Subtitle, Kind: list[i].Kind, Locked: list[i].Locked}
		if patch.Title != nil {
			in.Title = *patch.Title
		}
		if patch.Subtitle != nil {
			in.Subtitle = *patch.Subtitle
		}
		if patch.Kind != nil {
			if *patch.Kind == "" {
				return nil, invalid("kind", `must be "hard" or "soft"`)
			}
			in.Kind = *patch.Kind
		}
		if patch.Locked != nil {
			in.Locked = *patch.Locked
		}
		p, err := w.checkedFields(in, id, list)
		if err != nil {
			return nil, err
		}
		// Where it came from (docs/spec.md §19): the user's once the user writes a field of it;
		// an agent's or unconfirmed one the user locks is confirmed; unlocking keeps it.
		p.Source = list[i].Source
		switch {
		case p.Title != list[i].Title || p.Subtitle != list[i].Subtitle || p.Kind != list[i].Kind:
			p.Source = SourceUser
		case p.Locked && !list[i].Locked, patch.Confirm:
			p.Source = Confirmed(p.Source)
		}
		row, err := w.store.q.PreferenceUpdate(ctx, tx, db.PreferenceUpdateParams{
			ThreadID: w.threadID, ID: id, Title: p.Title, Subtitle: p.Subtitle, Kind: p.Kind, Locked: p.Locked, Source: p.Source,
		})
		if err != nil {
			return nil, fmt.Errorf("update preference: %w", db.NotFound(err))
		}
		out = fromRow(i+1, row)
		if c, ok := PrefChange(&list[i], &out); ok {
			return []Change{c}, nil
		}
		return nil, nil
	})
	return out, err
}

// DeletePreference deletes a preference by its stable id as the user, locked or not.
func (w *Workspace) DeletePreference(ctx context.Context, id int64) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	_, err = w.locked(ctx, db.LockThreadTouch, func(tx db.DBTX, _ int64, list []Preference) ([]Change, error) {
		i := IndexOf(list, id)
		if i < 0 {
			return nil, ErrNotFound
		}
		if _, err := w.store.q.PreferenceDelete(ctx, tx, db.PreferenceDeleteParams{ThreadID: w.threadID, ID: id}); err != nil {
			return nil, fmt.Errorf("delete preference: %w", err)
		}
		c, _ := PrefChange(&list[i], nil)
		return []Change{c}, nil
	})
	return err
}

// IndexOf is the position of the preference id in list, -1 when it holds none.
func IndexOf(list []Preference, id int64) int {
	for i, p := range list {
		if p.ID == id {
			return i
		}
	}
	return -1
}

// exists returns ErrNotFound when the thread does not exist.
func (w *Workspace) exists(ctx context.Context) error {
	_, err := w.store.q.ThreadGet(ctx, w.store.pool, w.threadID)
	return db.NotFound(err)
}

// Snapshots lists the thread's snapshots, oldest first, after turn after.
func (w *Workspace) Snapshots(ctx context.Context, after, limit int) (_ []Snapshot, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if err := w.exists(ctx); err != nil {
		return nil, err
	}
	rows, err := w.store.q.SnapshotListByThread(ctx, w.store.pool, db.SnapshotListByThreadParams{
		ThreadID: w.threadID, AfterTurn: int32(after), MaxRows: int32(limit),
	})
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	out := make([]Snapshot, len(rows))
	for i, r := range rows {
		if out[i], err = fromSnapshot(r, w.id.Client); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SnapshotForTurn is the snapshot that applies to turn n: the latest stored at or before it.
// ErrNotFound when the thread has none (or no turn n yet).
func (w *Workspace) SnapshotForTurn(ctx context.Context, n int) (_ Snapshot, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	th, err := w.store.q.ThreadGet(ctx, w.store.pool, w.threadID)
	if err != nil {
		return Snapshot{}, db.NotFound(err)
	}
	if n < 1 || n > int(th.Turns) {
		return Snapshot{}, ErrNotFound
	}
	r, err := w.store.q.SnapshotForTurn(ctx, w.store.pool, db.SnapshotForTurnParams{ThreadID: w.threadID, Turn: int32(n)})
	if err != nil {
		return Snapshot{}, db.NotFound(err)
	}
	return fromSnapshot(r, w.id.Client)
}

func fromSnapshot(r db.WorkspaceSnapshot, client string) (Snapshot, error) {
	prefs, err := decodeSnapshotPreferences(r.Preferences)
	if err != nil {
		return Snapshot{}, err
	}
	inherited, err := decodeInherited(r.Inherited, client)
	if err != nil {
		return Snapshot{}, err
	}
	s := Snapshot{Turn: int(r.Turn), CreatedAt: r.CreatedAt.Time.UTC(), Preferences: prefs, Inherited: shownInherited(prefs, inherited)}
	if s.Inherited == nil {
		s.Inherited = []Scope{}
	}
	if r.Objective.Valid {
		s.Objective = &r.Objective.String
	}
	return s, nil
}

// ToolCalls lists the thread's recorded tool calls, oldest first, after id after.
func (w *Workspace) ToolCalls(ctx context.Context, after int64, limit int) (_ []ToolCallRecord, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if err := w.exists(ctx); err != nil {
		return nil, err
	}
	rows, err := w.store.q.ToolCallListByThread(ctx, w.store.pool, db.ToolCallListByThreadParams{
		ThreadID: w.threadID, AfterID: after, MaxRows: int32(limit),
	})
	if err != nil {
		return nil, fmt.Errorf("list tool calls: %w", err)
	}
	out := make([]ToolCallRecord, len(rows))
	for i, r := range rows {
		out[i] = ToolCallRecord{
			ID: r.ID, Turn: intOrNull(r.Turn), Round: intOrNull(r.Round), CallID: r.CallID, Tool: r.Tool, Arguments: r.Arguments,
			ActionAndReasoning: r.ActionAndReasoning, OK: r.Ok, Result: r.Result,
			CreatedAt: r.CreatedAt.Time.UTC(),
		}
	}
	return out, nil
}
