package tools

// The planning of the tools' calls: pure functions of the call's arguments and the thread's list
// as it stands, which decide what a call changes and what its result says. The workspace writes
// a plan (call.go: workspace.Plan).

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/workspace"
)

// planner plans the tools' calls within the limits of the store they run against.
type planner struct {
	limits workspace.Limits
	// untrustedWrites is the store's setting for a tainted turn's ungrounded writes.
	untrustedWrites string
}

func listText(list []workspace.Preference) string {
	if len(list) == 0 {
		return "no preferences recorded yet"
	}
	lines := make([]string, len(list))
	for i, p := range list {
		lines[i] = workspace.PreferenceLine(i+1, p)
	}
	return strings.Join(lines, "\n")
}

// targets are what a call's indices name (View.resolve): the preferences to change, as they
// stand (with the index the model named; an update's carry their new values), the locked ones
// among them, those removed or changed since the model was shown them (as shown), and the
// indices out of range; before holds the list as the call found it, by id, and proposed an
// update's new values of every target, open or locked, by id (nil for a removal).
type targets struct {
	open       []workspace.Preference
	locked     []workspace.Preference
	changed    []workspace.Preference
	outOfRange []int
	before     map[int64]workspace.Preference
	proposed   map[int64]workspace.Preference
}

// changes are the events of an update (the open targets carry their new values) or a removal
// (updated false): one per preference changed, one locked_skip per locked one, as they stood
// before the call, with what the call asked of it.
func (t targets) changes(updated bool) []workspace.Change {
	var out []workspace.Change
	for _, p := range t.open {
		orig := t.before[p.ID]
		after := &p
		if !updated {
			after = nil
		}
		if c, ok := workspace.PrefChange(&orig, after); ok {
			out = append(out, c)
		}
	}
	for _, p := range t.locked {
		orig := t.before[p.ID]
		orig.Locked = true // the statement found it locked, whatever the list said
		var proposed *workspace.Preference
		if updated {
			want := t.proposed[p.ID]
			proposed = &want
		}
		out = append(out, workspace.LockedSkipChange(orig, proposed))
	}
	return out
}

// summary renders the result of an update or remove: one part per item done, then the locked
// ones, then those changed since they were shown, then those out of range.
func (t targets) summary(verb string) string {
	var parts []string
	for _, p := range t.open {
		parts = append(parts, verb+" "+ref(p))
	}
	if len(t.open) == 0 && len(t.locked) == 0 && len(t.changed) == 0 {
		parts = append(parts, "no matching preferences found")
	}
	if len(t.locked) > 0 {
		parts = append(parts, "locked, ask the user to unlock first: "+refs(t.locked))
	}
	if len(t.changed) > 0 {
		parts = append(parts, "changed since it was shown; call list_preferences: "+refs(t.changed))
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

// ref names a preference in a summary: #N "title".
func ref(p workspace.Preference) string {
	return "#" + strconv.Itoa(p.Index) + ` "` + workspace.OneLine(p.Title) + `"`
}

// refs names preferences in a summary: #N "title", #M "title".
func refs(list []workspace.Preference) string {
	out := make([]string, len(list))
	for i, p := range list {
		out[i] = ref(p)
	}
	return strings.Join(out, ", ")
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// checkItems refuses a call of more than ItemsMax items (MAX_TOOL_ITEMS) in its member field.
func (s planner) checkItems(field string, n int, verb string) error {
	if n > s.limits.ItemsMax {
		return invalid(field, "at most %d in one call (got %d); nothing was %s", s.limits.ItemsMax, n, verb)
	}
	return nil
}

// planAdd decides what add_preferences records: the new preferences (with provisional ids from
// nextID) and the titles already recorded, or the error the call is refused with.
func (s planner) planAdd(args json.RawMessage, nextID int64, list []workspace.Preference, inherited []workspace.Scope) (fresh []workspace.Preference, dups []string, fromScopes scopeDups, err error) {
	fresh, _, dups, fromScopes, err = s.planAddAt(args, nextID, list, inherited)
	return fresh, dups, fromScopes, err
}

// planAddAt is planAdd, with the position in the call's items of each new preference.
func (s planner) planAddAt(args json.RawMessage, nextID int64, list []workspace.Preference, inherited []workspace.Scope) (fresh []workspace.Preference, at []int, dups []string, fromScopes scopeDups, err error) {
	var a struct {
		Items *[]struct {
			Title    *string `json:"title"`
			Subtitle *string `json:"subtitle"`
			Kind     *string `json:"kind"`
		} `json:"items"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, nil, nil, scopeDups{}, err
	}
	if a.Items == nil {
		return nil, nil, nil, scopeDups{}, invalid("items", "is required")
	}
	if len(*a.Items) == 0 {
		return nil, nil, nil, scopeDups{}, invalid("items", "must hold at least one preference")
	}
	if err := s.checkItems("items", len(*a.Items), "recorded"); err != nil {
		return nil, nil, nil, scopeDups{}, err
	}
	titles := make(workspace.TitleIndex, len(list)+len(*a.Items))
	for _, p := range list {
		titles.Add(p)
	}
	for i, it := range *a.Items {
		field := fmt.Sprintf("items[%d]", i)
		if it.Title == nil {
			return nil, nil, nil, scopeDups{}, invalid(field+".title", "is required")
		}
		title, err := cleaned(s.limits.CheckTitle, s.limits.TitleMax)(field+".title", *it.Title)
		if err != nil {
			return nil, nil, nil, scopeDups{}, err
		}
		p := workspace.Preference{Title: title, Kind: workspace.Soft}
		if it.Subtitle != nil {
			if p.Subtitle, err = cleaned(s.limits.CheckSubtitle, s.limits.SubtitleMax)(field+".subtitle", *it.Subtitle); err != nil {
				return nil, nil, nil, scopeDups{}, err
			}
		}
		if it.Kind != nil {
			if p.Kind, err = workspace.CheckKind(field+".kind", *it.Kind); err != nil {
				return nil, nil, nil, scopeDups{}, err
			}
		}
		if existing, ok := titles.Find(title, -1); ok {
			dups = append(dups, ref(existing))
			continue
		}
		if scope, existing, ok := workspace.FindInherited(inherited, title); ok {
			fromScopes.add(scope.Name(), existing)
			continue
		}
		p.ID = nextID + int64(len(fresh)) // provisional, for the titles within the batch
		p.Index = len(list) + len(fresh) + 1
		fresh, at = append(fresh, p), append(at, i)
		titles.Add(p)
	}
	if max := s.limits.PreferencesMax; len(list)+len(fresh) > max {
		return nil, nil, nil, scopeDups{}, invalid("items", "a thread holds at most %d preferences: %d recorded, %d new; nothing was recorded",
			max, len(list), len(fresh))
	}
	return fresh, at, dups, fromScopes, nil
}

// planUpdate decides what update_preferences changes in list (the list as it stands), its indices
// naming the view: the targets of the call, the open ones carrying their new values, or the
// error the call is refused with (nothing is then updated).
func (s planner) planUpdate(args json.RawMessage, view *View, list []workspace.Preference) (targets, error) {
	edits, indices, err := s.parseEdits(args)
	if err != nil {
		return targets{}, err
	}
	t := view.resolve(list, indices)
	t.proposed = make(map[int64]workspace.Preference, len(t.open)+len(t.locked))
	retitled := false
	for i, p := range t.open {
		e := edits[p.Index]
		p = e.applied(p)
		retitled = retitled || e.title != nil
		t.open[i], t.proposed[p.ID] = p, p
	}
	for _, p := range t.locked { // what the call asked of them (the event keeps it)
		t.proposed[p.ID] = edits[p.Index].applied(p)
	}
	if retitled {
		if err := checkRetitled(list, t.open, edits); err != nil {
			return targets{}, err
		}
		// No title of an ancestor's either (docs/spec.md §19): the item would hide it.
		for _, p := range t.open {
			if edits[p.Index].title == nil {
				continue
			}
			if scope, other, ok := workspace.FindInherited(view.inherited, p.Title); ok {
				return targets{}, invalid("updates", "#%d would have the title of %q (from %s); nothing was updated",
					p.Index, workspace.OneLine(other.Title), scope.Name())
			}
		}
	}
	return t, nil
}

// edit is one index's new values in an update_preferences call; nil leaves a field as it is.
type edit struct{ title, subtitle, kind *string }

// applied is p with the edit's values.
func (e *edit) applied(p workspace.Preference) workspace.Preference {
	if e.title != nil {
		p.Title = *e.title
	}
	if e.subtitle != nil {
		p.Subtitle = *e.subtitle
	}
	if e.kind != nil {
		p.Kind = *e.kind
	}
	return p
}

// parseEdits validates every edit of an update_preferences call and merges the edits of one
// index (later fields win), returning them by index and the indices in the order first named.
func (s planner) parseEdits(args json.RawMessage) (map[int]*edit, []int, error) {
	var a struct {
		Updates *[]struct {
			Index    *index  `json:"index"`
			Title    *string `json:"title"`
			Subtitle *string `json:"subtitle"`
			Kind     *string `json:"kind"`
		} `json:"updates"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, nil, err
	}
	if a.Updates == nil {
		return nil, nil, invalid("updates", "is required")
	}
	if len(*a.Updates) == 0 {
		return nil, nil, invalid("updates", "must hold at least one edit")
	}
	if err := s.checkItems("updates", len(*a.Updates), "updated"); err != nil {
		return nil, nil, err
	}
	edits := make(map[int]*edit)
	var indices []int
	for i, u := range *a.Updates {
		field := fmt.Sprintf("updates[%d]", i)
		if u.Index == nil {
			return nil, nil, invalid(field+".index", "is required")
		}
		n := int(*u.Index)
		e := edits[n]
		if e == nil {
			e = &edit{}
			edits[n] = e
			indices = append(indices, n)
		}
		var err error
		if u.Title != nil {
			e.title, err = checked(cleaned(s.limits.CheckTitle, s.limits.TitleMax), field+".title", *u.Title)
		}
		if err == nil && u.Subtitle != nil {
			e.subtitle, err = checked(cleaned(s.limits.CheckSubtitle, s.limits.SubtitleMax), field+".subtitle", *u.Subtitle)
		}
		if err == nil && u.Kind != nil {
			e.kind, err = checked(workspace.CheckKind, field+".kind", *u.Kind)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	return edits, indices, nil
}

// checked is check's verdict on value as a pointer to the value it keeps.
// cleaned is check for a text an agent writes (docs/spec.md §19): the text cleaned first
// (workspace.Clean: NFKC, no invisible or control characters), and refused when it holds the
// block's own syntax, which could make it pass for another item, a lock or a source. A text of
// more than maxRawBytesPerChar bytes for each of the max characters it may keep is refused before
// any of that: cleaning half a megabyte under a busy machine's race detector outlasted the
// locked transaction's idle timeout (db.IdleTimeout), the call runs under the thread's lock.
func cleaned(check func(field, value string) (string, error), max int) func(field, value string) (string, error) {
	return func(field, value string) (string, error) {
		if len(value) > maxRawBytesPerChar*max {
			return "", invalid(field, "must be at most %d characters (got %d bytes)", max, len(value))
		}
		value = workspace.Clean(value)
		if m := workspace.BlockSyntax(value); m != "" {
			return "", invalid(field, "must not hold %q: the workspace block writes it", m)
		}
		return check(field, value)
	}
}

// maxRawBytesPerChar bounds the bytes a text may spend on each character it keeps once cleaned:
// 4 for the longest UTF-8 character, and room for what cleaning takes out (an emoji's joiners
// and variation selectors, 3 bytes each).
const maxRawBytesPerChar = 16

func checked(check func(field, value string) (string, error), field, value string) (*string, error) {
	v, err := check(field, value)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// checkRetitled refuses edits whose new title another preference of the list, as it would read
// afterwards, already has.
func checkRetitled(list, open []workspace.Preference, edits map[int]*edit) error {
	after := replaced(list, open)
	titles := make(workspace.TitleIndex, len(after))
	for _, p := range after {
		titles.Add(p)
	}
	for _, p := range open {
		if edits[p.Index].title == nil {
			continue
		}
		if other, ok := titles.Find(p.Title, p.ID); ok {
			return invalid("updates", "#%d would have the title of #%d %q; nothing was updated",
				p.Index, other.Index, workspace.OneLine(other.Title))
		}
	}
	return nil
}

// replaced is a copy of list in which the preferences of prefs (matched by id) replace theirs,
// at the list's positions.
func replaced(list, prefs []workspace.Preference) []workspace.Preference {
	out := append([]workspace.Preference(nil), list...)
	for _, p := range prefs {
		if i := workspace.IndexOf(out, p.ID); i >= 0 {
			p.Index = out[i].Index
			out[i] = p
		}
	}
	return out
}

// without is list without the preferences of ids, indexed anew.
func without(list []workspace.Preference, ids []int64) []workspace.Preference {
	gone := make(map[int64]bool, len(ids))
	for _, id := range ids {
		gone[id] = true
	}
	var out []workspace.Preference
	for _, p := range list {
		if !gone[p.ID] {
			p.Index = len(out) + 1
			out = append(out, p)
		}
	}
	return out
}

// scopeDups are the titles of an add_preferences call that an ancestor already holds, by scope
// in the order first met: `already recorded (from alice): "Tabs over spaces"`.
type scopeDups struct {
	scopes []string
	titles map[string][]string
}

func (d *scopeDups) add(scope string, p workspace.Preference) {
	if d.titles == nil {
		d.titles = map[string][]string{}
	}
	if _, ok := d.titles[scope]; !ok {
		d.scopes = append(d.scopes, scope)
	}
	d.titles[scope] = append(d.titles[scope], `"`+workspace.OneLine(p.Title)+`"`)
}

// parts are the summary's parts, one per scope.
func (d scopeDups) parts() []string {
	out := make([]string, len(d.scopes))
	for i, s := range d.scopes {
		out[i] = "already recorded (from " + s + "): " + strings.Join(d.titles[s], ", ")
	}
	return out
}
