package workspace

import (
	"context"
	"errors"
	"fmt"

	"github.com/wsproxy/wsproxy/db"
)

// Export and import of a workspace (docs/spec.md §8): what the user wrote or accepted, so that
// a project's scope is seeded from a file, backed up, or moved between deployments.

// ExportFormat names the document's format; import refuses any other.
const ExportFormat = "wsproxy.workspace/1"

// Exported is a thread's workspace as export writes it and import reads it: its objective and
// preferences with their sources (§19) and locks, in list order, its parents by their names in
// the client's namespace (nearest first), and its own settings (nil: inherited). Ids, times,
// usage and turns are not part of it: an import makes new ones.
type Exported struct {
	Format          string               `json:"format"`
	Thread          string               `json:"thread,omitempty"`
	Objective       *ExportedObjective   `json:"objective"`
	Preferences     []ExportedPreference `json:"preferences"`
	Parents         []string             `json:"parents"`
	AgentWrites     *string              `json:"agent_writes"`
	UntrustedWrites *string              `json:"untrusted_writes"`
}

// ExportedObjective is the objective in an export.
type ExportedObjective struct {
	Text   string `json:"text"`
	Source string `json:"source"`
}

// ExportedPreference is one preference in an export. An import reads a missing subtitle as "",
// kind as soft, locked as false, source as the user's.
type ExportedPreference struct {
	Title    string `json:"title"`
	Subtitle string `json:"subtitle"`
	Kind     string `json:"kind"`
	Locked   bool   `json:"locked"`
	Source   string `json:"source"`
}

// Export is the document of d, a thread's workspace as Get read it.
func Export(d Detail) Exported {
	e := Exported{Format: ExportFormat, Preferences: []ExportedPreference{}, Parents: d.Parents}
	if id, err := ParseThreadID(d.ID); err == nil {
		e.Thread = id.Name
	}
	if e.Parents == nil {
		e.Parents = []string{}
	}
	if d.Objective != nil {
		e.Objective = &ExportedObjective{Text: d.Objective.Text, Source: d.Objective.Source}
	}
	for _, p := range d.Preferences {
		e.Preferences = append(e.Preferences, ExportedPreference{Title: p.Title, Subtitle: p.Subtitle, Kind: p.Kind,
			Locked: p.Locked, Source: p.Source})
	}
	if !d.AgentWritesInherited {
		e.AgentWrites = &d.AgentWrites
	}
	if !d.UntrustedWritesInherited {
		e.UntrustedWrites = &d.UntrustedWrites
	}
	return e
}

// ErrNotEmpty is an import into a thread that holds an objective or a preference, without
// replace.
var ErrNotEmpty = errors.New("the thread already holds an objective or preferences")

// checkSource reads an exported source: "" is the user's.
func checkSource(field, s string) (string, error) {
	switch s {
	case "":
		return SourceUser, nil
	case SourceUser, SourceConfirmed, SourceAgent, SourceUnconfirmed:
		return s, nil
	}
	return "", invalid(field, `must be "user", "confirmed", "agent" or "unconfirmed"`)
}

// Import writes the document into the thread, creating it when new, as user changes (events
// of actor user, so the history says what the import did and each change can be reverted).
// parents are the document's parents, resolved in the thread's namespace by the caller. A thread
// that holds an objective or a preference is ErrNotEmpty unless replace: then its objective and
// preferences are replaced. Its parents and settings become the document's either way. The
// document is checked whole before anything is written (a *ValidationError, a *DuplicateError);
// the objective and the list are written in one transaction, the parents (which may be refused
// as a cycle: a *ParentsError) before them and the settings after.
func (w *Workspace) Import(ctx context.Context, doc Exported, parents []ThreadID, replace bool) (err error) {
	ctx, done := w.store.op(ctx)
	defer done(&err)
	if doc.Format != ExportFormat {
		return invalid("format", "must be %q", ExportFormat)
	}
	var objective, objectiveSource string
	if doc.Objective != nil {
		if objective, err = w.store.limits.CheckObjective("objective.text", doc.Objective.Text); err != nil {
			return err
		}
		if objectiveSource, err = checkSource("objective.source", doc.Objective.Source); err != nil {
			return err
		}
	}
	if max := w.store.limits.PreferencesMax; len(doc.Preferences) > max {
		return invalid("preferences", "a thread holds at most %d preferences (got %d)", max, len(doc.Preferences))
	}
	items := make([]Preference, 0, len(doc.Preferences))
	for i, in := range doc.Preferences {
		field := fmt.Sprintf("preferences[%d]", i)
		p, err := w.store.checkInput(PreferenceInput{Title: in.Title, Subtitle: in.Subtitle, Kind: in.Kind, Locked: in.Locked})
		if err != nil {
			var ve *ValidationError
			if errors.As(err, &ve) {
				ve.Field = field + "." + ve.Field
			}
			return err
		}
		if p.Source, err = checkSource(field+".source", in.Source); err != nil {
			return err
		}
		if existing, ok := findTitle(items, p.Title, -1); ok {
			return &DuplicateError{Existing: existing}
		}
		p.Index = i + 1
		items = append(items, p)
	}
	for _, mode := range []struct{ field, v string }{{"agent_writes", deref(doc.AgentWrites)}, {"untrusted_writes", deref(doc.UntrustedWrites)}} {
		switch {
		case mode.field == "agent_writes" && (mode.v == "" || mode.v == AgentWritesDirect || mode.v == AgentWritesPropose):
		case mode.field == "untrusted_writes" && (mode.v == "" || mode.v == UntrustedPropose || mode.v == UntrustedApply || mode.v == UntrustedRefuse):
		default:
			return invalid(mode.field, "%q is not a value of %s", mode.v, mode.field)
		}
	}
	stored, err := w.storedParents(parents)
	if err != nil {
		return err
	}
	if !replace {
		switch d, err := w.Get(ctx); {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return err
		case d.Objective != nil || len(d.Preferences) > 0:
			return ErrNotEmpty
		}
	}
	// The parents first: a list refused (a cycle) leaves the workspace as it was.
	for attempt := 1; ; attempt++ {
		err = w.setParents(ctx, stored)
		if attempt == maxParentsAttempts || !db.Retryable(err) {
			break
		}
	}
	if err != nil {
		return err
	}
	_, err = w.locked(ctx, db.LockThreadUpsert, func(tx db.DBTX, nextID int64, list []Preference) ([]Change, error) {
		o, err := w.store.q.ObjectiveGet(ctx, tx, w.threadID)
		hasObjective := err == nil
		if err = db.NotFound(err); err != nil && err != ErrNotFound {
			return nil, fmt.Errorf("get objective: %w", err)
		}
		if !replace && (hasObjective || len(list) > 0) {
			return nil, ErrNotEmpty
		}
		var changes []Change
		for i := range list {
			if _, err := w.store.q.PreferenceDelete(ctx, tx, db.PreferenceDeleteParams{ThreadID: w.threadID, ID: list[i].ID}); err != nil {
				return nil, fmt.Errorf("delete preference: %w", err)
			}
			c, _ := PrefChange(&list[i], nil)
			changes = append(changes, c)
		}
		switch {
		case doc.Objective != nil:
			r, err := w.store.q.ObjectiveUpsert(ctx, tx, db.ObjectiveUpsertParams{ThreadID: w.threadID, Text: objective, UpdatedBy: ByUser,
				Source: objectiveSource})
			if err != nil {
				return nil, fmt.Errorf("set objective: %w", err)
			}
			if c, ok := ObjectiveSourcedChange(r.Previous, r.PreviousSource, r.Text, objectiveSource); ok {
				changes = append(changes, c)
			}
		case hasObjective:
			if _, err := w.store.q.ObjectiveDelete(ctx, tx, w.threadID); err != nil {
				return nil, fmt.Errorf("delete objective: %w", err)
			}
			c, _ := ObjectiveSourcedChange(o.Text, o.Source, "", "")
			changes = append(changes, c)
		}
		if len(items) > 0 {
			rows, err := w.insert(ctx, tx, nextID, items)
			if err != nil {
				return nil, err
			}
			for i, r := range rows {
				p := fromRow(i+1, r)
				c, _ := PrefChange(nil, &p)
				changes = append(changes, c)
			}
		}
		return changes, nil
	})
	if err != nil {
		return err
	}
	if err := w.SetAgentWrites(ctx, deref(doc.AgentWrites)); err != nil {
		return err
	}
	return w.SetUntrustedWrites(ctx, deref(doc.UntrustedWrites))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
