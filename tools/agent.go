package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/wsproxy/wsproxy/db"
)

// Call is one tool call the model made in a turn.
type Call struct {
	Turn      int
	Round     int
	Name      string
	Arguments string // as the model sent them
}

// Result is what a call gives back to the model.
type Result struct {
	OK bool
	// Content is the tool message's content: the envelope {"ok":true,"result":…} or
	// {"ok":false,"error":…}.
	Content string
	// LockedSkips counts the locked preferences the call named and left alone.
	LockedSkips int
}

// Envelope is the JSON a tool message carries.
type Envelope struct {
	OK     bool   `json:"ok"`
	Result string `json:"result,omitempty"`
	Error  string `json:"error,omitempty"`
}

func (e Envelope) encode() string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(e) // a struct of strings always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

// errThreadGone: the thread was deleted (through the admin REST) while its turn ran.
var errThreadGone = errors.New("this thread's workspace was deleted; nothing was recorded")

// Run runs one tool call against the thread and records it with its reasoning. A call the tool
// refuses (arguments that are not JSON, break the schema or a limit; an unknown tool) gives an
// error envelope and writes nothing but its record; the returned error is only for failures of
// the store itself (Postgres unavailable, the context cancelled).
func (w *Workspace) Run(ctx context.Context, c Call) (_ Result, err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	args, reasoning, err := parseArguments(c.Arguments)
	if err != nil {
		return w.refuse(ctx, w.store.pool, c, reasoning, err, nil)
	}
	// One round trip to begin, lock the thread and read its list; one for the tool's statement
	// (none for list_preferences); one to record the call and commit.
	tx, err := db.BeginLocked(ctx, w.store.pool, db.LockThread, w.threadID)
	if errors.Is(err, db.ErrNotFound) {
		return Result{Content: Envelope{Error: errThreadGone.Error()}.encode()}, nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	defer tx.Rollback(ctx)
	out, err := w.dispatch(ctx, tx.Conn(), c.Name, args, tx.NextPreferenceID, fromRows(tx.Preferences))
	if err != nil {
		// A refused call has written nothing: every check runs before the tool's statement.
		return w.refuse(ctx, tx.Conn(), c, reasoning, err, tx)
	}
	env := Envelope{OK: true, Result: out.text}
	if err := tx.Commit(ctx, func(b *pgx.Batch) { db.QueueToolCallInsert(b, w.record(c, reasoning, env)) }); err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	return Result{OK: true, Content: env.encode(), LockedSkips: out.lockedSkips}, nil
}

// refuse answers a call the tool refused with an error envelope and records it (committing tx
// when the call ran in one). An error that is not a refusal (the store failed) is returned.
func (w *Workspace) refuse(ctx context.Context, q db.DBTX, c Call, reasoning string, err error, tx *db.LockedTx) (Result, error) {
	var ve *ValidationError
	var de *DuplicateError
	if !errors.As(err, &ve) && !errors.As(err, &de) && !errors.Is(err, errUnknownTool) {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	env := Envelope{Error: err.Error()}
	arg := w.record(c, reasoning, env)
	if tx != nil {
		err = tx.Commit(ctx, func(b *pgx.Batch) { db.QueueToolCallInsert(b, arg) })
	} else {
		err = w.store.q.ToolCallInsert(ctx, q, arg)
	}
	if isForeignKeyViolation(err) {
		return Result{Content: Envelope{Error: errThreadGone.Error()}.encode()}, nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", c.Name, err)
	}
	return Result{Content: env.encode()}, nil
}

type toolOutput struct {
	text        string
	lockedSkips int
}

var errUnknownTool = errors.New("unknown tool")

func (w *Workspace) dispatch(ctx context.Context, tx db.DBTX, name string, args json.RawMessage, nextID int64, list []Preference) (toolOutput, error) {
	switch name {
	case AddPreferences:
		return w.addPreferences(ctx, tx, args, nextID, list)
	case ListPreferences:
		return toolOutput{text: listText(list)}, nil
	case UpdatePreferences:
		return w.updatePreferences(ctx, tx, args, list)
	case RemovePreferences:
		return w.removePreferences(ctx, tx, args, list)
	case SetObjective:
		return w.setObjective(ctx, tx, args)
	}
	return toolOutput{}, fmt.Errorf("%w %q: the tools are %s", errUnknownTool, name, strings.Join(Names, ", "))
}

// record is the record of a call and the envelope it returned.
func (w *Workspace) record(c Call, reasoning string, env Envelope) db.ToolCallInsertParams {
	return db.ToolCallInsertParams{
		ThreadID:           w.threadID,
		Turn:               int32(c.Turn),
		Round:              int32(c.Round),
		Tool:               c.Name,
		Arguments:          argumentsJSON(c.Arguments),
		ActionAndReasoning: storableText(reasoning),
		Ok:                 env.OK,
		Result:             []byte(env.encode()),
	}
}

// parseArguments decodes a call's arguments: a JSON object (an empty string counts as {}), with
// the action_and_reasoning the model gave, if any.
func parseArguments(raw string) (json.RawMessage, string, error) {
	if strings.TrimSpace(raw) == "" {
		return json.RawMessage("{}"), "", nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &fields); err != nil || fields == nil {
		return nil, "", invalid("", "arguments are not a JSON object")
	}
	var reasoning string
	if r, ok := fields["action_and_reasoning"]; ok {
		_ = json.Unmarshal(r, &reasoning) // a call without it (or with a non-string) still runs
	}
	return json.RawMessage(raw), reasoning, nil
}

// decodeArgs decodes args into v, naming the schema break when they do not fit.
func decodeArgs(args json.RawMessage, v any) error {
	if err := json.Unmarshal(args, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return invalid(te.Field, "must be %s, not a JSON %s", jsonType(te.Type.Kind().String()), te.Value)
		}
		var ve *ValidationError
		if errors.As(err, &ve) {
			return ve
		}
		return invalid("", "arguments do not match the schema: %v", err)
	}
	return nil
}

func jsonType(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	case "int", "int64":
		return "an integer"
	}
	return "a " + goKind
}

// index is a 1-based position: a JSON integer ≥ 1 (2.0 counts as 2).
type index int

func (i *index) UnmarshalJSON(b []byte) error {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f != float64(int64(f)) || f < 1 || f > 1e9 {
		return invalid("", "an index must be an integer ≥ 1, not %s", truncate(string(b), 40))
	}
	*i = index(f)
	return nil
}

func (w *Workspace) addPreferences(ctx context.Context, tx db.DBTX, args json.RawMessage, nextID int64, list []Preference) (toolOutput, error) {
	var a struct {
		Items *[]struct {
			Title    *string `json:"title"`
			Subtitle *string `json:"subtitle"`
			Kind     *string `json:"kind"`
		} `json:"items"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return toolOutput{}, err
	}
	if a.Items == nil {
		return toolOutput{}, invalid("items", "is required")
	}
	if len(*a.Items) == 0 {
		return toolOutput{}, invalid("items", "must hold at least one preference")
	}
	var (
		fresh []Preference
		dups  []string
		all   = list
	)
	for i, it := range *a.Items {
		field := fmt.Sprintf("items[%d]", i)
		if it.Title == nil {
			return toolOutput{}, invalid(field+".title", "is required")
		}
		title, err := w.store.checkTitle(field+".title", *it.Title)
		if err != nil {
			return toolOutput{}, err
		}
		p := Preference{Title: title, Kind: Soft}
		if it.Subtitle != nil {
			if p.Subtitle, err = w.store.checkSubtitle(field+".subtitle", *it.Subtitle); err != nil {
				return toolOutput{}, err
			}
		}
		if it.Kind != nil {
			if p.Kind, err = checkKind(field+".kind", *it.Kind); err != nil {
				return toolOutput{}, err
			}
		}
		if existing, ok := findTitle(all, title, -1); ok {
			dups = append(dups, ref(existing))
			continue
		}
		p.ID = nextID + int64(len(fresh)) // provisional, for findTitle within the batch
		p.Index = len(all) + 1
		fresh = append(fresh, p)
		all = append(all[:len(all):len(all)], p)
	}
	if max := w.store.limits.PreferencesMax; len(all) > max {
		return toolOutput{}, invalid("items", "a thread holds at most %d preferences: %d recorded, %d new; nothing was recorded",
			max, len(list), len(fresh))
	}
	if len(fresh) > 0 {
		if _, err := w.insert(ctx, tx, nextID, fresh); err != nil {
			return toolOutput{}, err
		}
	}
	text := "recorded " + plural(len(fresh), "preference")
	if len(dups) > 0 {
		text += "; already recorded: " + strings.Join(dups, ", ")
	}
	return toolOutput{text: text}, nil
}

func listText(list []Preference) string {
	if len(list) == 0 {
		return "no preferences recorded yet"
	}
	lines := make([]string, len(list))
	for i, p := range list {
		lines[i] = PreferenceLine(i+1, p)
	}
	return strings.Join(lines, "\n")
}

// targets sorts a call's indices into the preferences they name (in the order given, each once),
// the locked ones among them and those out of range.
type targets struct {
	open       []Preference
	locked     []Preference
	outOfRange []int
}

func resolve(list []Preference, indices []int) targets {
	var t targets
	seen := make(map[int]bool, len(indices))
	for _, i := range indices {
		if seen[i] {
			continue
		}
		seen[i] = true
		switch {
		case i > len(list):
			t.outOfRange = append(t.outOfRange, i)
		case list[i-1].Locked:
			t.locked = append(t.locked, list[i-1])
		default:
			t.open = append(t.open, list[i-1])
		}
	}
	return t
}

// applied moves the open targets the statement did not touch (the SQL found them locked) to the
// locked ones: the statement, not the check before it, has the last word.
func (t *targets) applied(ids []int64) {
	done := make(map[int64]bool, len(ids))
	for _, id := range ids {
		done[id] = true
	}
	open := t.open[:0]
	for _, p := range t.open {
		if done[p.ID] {
			open = append(open, p)
		} else {
			p.Locked = true
			t.locked = append(t.locked, p)
		}
	}
	t.open = open
}

// summary renders the result of an update or remove: one part per item done, then the locked
// ones, then those out of range.
func (t targets) summary(verb string) string {
	var parts []string
	for _, p := range t.open {
		parts = append(parts, verb+" "+ref(p))
	}
	if len(t.open) == 0 && len(t.locked) == 0 {
		parts = append(parts, "no matching preferences found")
	}
	if len(t.locked) > 0 {
		refs := make([]string, len(t.locked))
		for i, p := range t.locked {
			refs[i] = ref(p)
		}
		parts = append(parts, "locked, ask the user to unlock first: "+strings.Join(refs, ", "))
	}
	if len(t.outOfRange) > 0 {
		refs := make([]string, len(t.outOfRange))
		for i, n := range t.outOfRange {
			refs[i] = "#" + strconv.Itoa(n)
		}
		parts = append(parts, "out of range: "+strings.Join(refs, ", "))
	}
	return strings.Join(parts, "; ")
}

func (w *Workspace) updatePreferences(ctx context.Context, tx db.DBTX, args json.RawMessage, list []Preference) (toolOutput, error) {
	var a struct {
		Updates *[]struct {
			Index    *index  `json:"index"`
			Title    *string `json:"title"`
			Subtitle *string `json:"subtitle"`
			Kind     *string `json:"kind"`
		} `json:"updates"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return toolOutput{}, err
	}
	if a.Updates == nil {
		return toolOutput{}, invalid("updates", "is required")
	}
	if len(*a.Updates) == 0 {
		return toolOutput{}, invalid("updates", "must hold at least one edit")
	}
	// Validate every edit, then merge edits of one index (later fields win).
	type edit struct{ title, subtitle, kind *string }
	edits := make(map[int]*edit)
	var indices []int
	for i, u := range *a.Updates {
		field := fmt.Sprintf("updates[%d]", i)
		if u.Index == nil {
			return toolOutput{}, invalid(field+".index", "is required")
		}
		n := int(*u.Index)
		e := edits[n]
		if e == nil {
			e = &edit{}
			edits[n] = e
			indices = append(indices, n)
		}
		if u.Title != nil {
			v, err := w.store.checkTitle(field+".title", *u.Title)
			if err != nil {
				return toolOutput{}, err
			}
			e.title = &v
		}
		if u.Subtitle != nil {
			v, err := w.store.checkSubtitle(field+".subtitle", *u.Subtitle)
			if err != nil {
				return toolOutput{}, err
			}
			e.subtitle = &v
		}
		if u.Kind != nil {
			v, err := checkKind(field+".kind", *u.Kind)
			if err != nil {
				return toolOutput{}, err
			}
			e.kind = &v
		}
	}
	t := resolve(list, indices)
	// The list as it would read afterwards, to refuse an edit that duplicates a title.
	after := append([]Preference(nil), list...)
	for i, p := range t.open {
		e := edits[p.Index]
		if e.title != nil {
			p.Title = *e.title
		}
		if e.subtitle != nil {
			p.Subtitle = *e.subtitle
		}
		if e.kind != nil {
			p.Kind = *e.kind
		}
		t.open[i] = p
		after[p.Index-1] = p
	}
	for _, p := range t.open {
		if edits[p.Index].title == nil {
			continue
		}
		if other, ok := findTitle(after, p.Title, p.ID); ok {
			return toolOutput{}, invalid("updates", "#%d would have the title of #%d %q; nothing was updated",
				p.Index, other.Index, oneLine(other.Title))
		}
	}
	if len(t.open) > 0 {
		p := db.PreferenceUpdateUnlockedParams{ThreadID: w.threadID}
		for _, u := range t.open {
			p.Ids = append(p.Ids, u.ID)
			p.Titles = append(p.Titles, u.Title)
			p.Subtitles = append(p.Subtitles, u.Subtitle)
			p.Kinds = append(p.Kinds, u.Kind)
		}
		ids, err := w.store.q.PreferenceUpdateUnlocked(ctx, tx, p)
		if err != nil {
			return toolOutput{}, fmt.Errorf("update preferences: %w", err)
		}
		t.applied(ids)
	}
	return toolOutput{text: t.summary("updated"), lockedSkips: len(t.locked)}, nil
}

func (w *Workspace) removePreferences(ctx context.Context, tx db.DBTX, args json.RawMessage, list []Preference) (toolOutput, error) {
	var a struct {
		Indices *[]index `json:"indices"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return toolOutput{}, err
	}
	if a.Indices == nil {
		return toolOutput{}, invalid("indices", "is required")
	}
	if len(*a.Indices) == 0 {
		return toolOutput{}, invalid("indices", "must hold at least one index")
	}
	indices := make([]int, len(*a.Indices))
	for i, n := range *a.Indices {
		indices[i] = int(n)
	}
	t := resolve(list, indices)
	if len(t.open) > 0 {
		ids := make([]int64, len(t.open))
		for i, p := range t.open {
			ids[i] = p.ID
		}
		deleted, err := w.store.q.PreferenceDeleteUnlocked(ctx, tx, db.PreferenceDeleteUnlockedParams{ThreadID: w.threadID, Ids: ids})
		if err != nil {
			return toolOutput{}, fmt.Errorf("remove preferences: %w", err)
		}
		t.applied(deleted)
	}
	return toolOutput{text: t.summary("removed"), lockedSkips: len(t.locked)}, nil
}

func (w *Workspace) setObjective(ctx context.Context, tx db.DBTX, args json.RawMessage) (toolOutput, error) {
	var a struct {
		Text *string `json:"text"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return toolOutput{}, err
	}
	if a.Text == nil {
		return toolOutput{}, invalid("text", "is required")
	}
	text, err := w.store.checkObjective("text", *a.Text)
	if err != nil {
		return toolOutput{}, err
	}
	if _, err := w.store.q.ObjectiveUpsert(ctx, tx, db.ObjectiveUpsertParams{ThreadID: w.threadID, Text: text, UpdatedBy: ByAgent}); err != nil {
		return toolOutput{}, fmt.Errorf("set objective: %w", err)
	}
	return toolOutput{text: "objective set: " + text}, nil
}

// ref names a preference in a summary: #N "title".
func ref(p Preference) string {
	return "#" + strconv.Itoa(p.Index) + ` "` + oneLine(p.Title) + `"`
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// argumentsJSON is how a call's arguments are stored (jsonb): the JSON value the model sent, or
// a JSON string of the raw text when it was not JSON. jsonb cannot hold NUL characters or invalid
// UTF-8, so those become U+FFFD.
func argumentsJSON(raw string) []byte {
	if json.Valid([]byte(raw)) {
		if utf8.ValidString(raw) && !strings.Contains(raw, `\u0000`) {
			return []byte(raw)
		}
		var v any
		if err := json.Unmarshal([]byte(raw), &v); err == nil {
			if b, err := json.Marshal(scrub(v)); err == nil {
				return b
			}
		}
	}
	b, _ := json.Marshal(storableText(raw))
	return b
}

// scrub replaces NUL characters in every string of a decoded JSON value.
func scrub(v any) any {
	switch x := v.(type) {
	case string:
		return storableText(x)
	case []any:
		for i := range x {
			x[i] = scrub(x[i])
		}
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[storableText(k)] = scrub(e)
		}
		return m
	}
	return v
}

// storableText makes s storable in a Postgres text or jsonb value: valid UTF-8, no NUL.
func storableText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
