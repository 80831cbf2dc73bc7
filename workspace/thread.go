package workspace

import (
	"errors"
	"regexp"
	"strings"
)

// ThreadID names a thread: the id its client gave it and, with client keys, the client it
// belongs to. It is the one place that knows what a thread id may hold and how a client's
// threads are kept apart in the store (client~thread: thread ids cannot contain '~', so client
// namespaces never overlap).
type ThreadID struct {
	Client string // "" for a thread without a client
	Name   string // the id the client gave
}

// Errors of the parsers: the id or the client name breaks its pattern.
var (
	ErrInvalidThreadID = errors.New("a thread id is 1-128 characters of A-Z a-z 0-9 . _ : @ -, other than . and ..")
	ErrInvalidClient   = errors.New("a client name is 1-64 characters of A-Z a-z 0-9 . _ -")
)

const namespaceSep = "~"

var (
	threadNamePattern = regexp.MustCompile(`^[A-Za-z0-9._:@-]{1,128}$`)
	clientNamePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// NewThreadID checks a thread id as a client names it (a header or a path), for the client
// ("" for none). "." and ".." are refused: in a URL's path (the panel's, the admin REST's) they
// are dot segments, which browsers and routers resolve away.
func NewThreadID(client, name string) (ThreadID, error) {
	if !threadNamePattern.MatchString(name) || name == "." || name == ".." {
		return ThreadID{}, ErrInvalidThreadID
	}
	if client != "" && !ValidClientName(client) {
		return ThreadID{}, ErrInvalidClient
	}
	return ThreadID{Client: client, Name: name}, nil
}

// ParseThreadID reads the stored form of a thread id (what the admin REST names): the id, or
// client~id for a client's thread.
func ParseThreadID(stored string) (ThreadID, error) {
	client, name, ok := strings.Cut(stored, namespaceSep)
	if !ok {
		client, name = "", stored
	} else if client == "" {
		return ThreadID{}, ErrInvalidClient
	}
	return NewThreadID(client, name)
}

// ValidClientName reports whether name may name a client.
func ValidClientName(name string) bool { return clientNamePattern.MatchString(name) }

// SharedPrefix marks, where a client names a thread (a parent, a path), a workspace outside every
// client's namespace that the admin shared with it: ~repo-x (docs/spec.md §20).
const SharedPrefix = namespaceSep

// NewParentID checks a parent as client ("" for none) names it (X-Workspace-Parents,
// THREAD_PARENTS, the panel): ~name is a workspace outside every client's namespace (a shared
// scope, docs/spec.md §20; for a thread without a client, the same as name), any other name the
// client's own thread.
func NewParentID(client, name string) (ThreadID, error) {
	if rest, ok := strings.CutPrefix(name, SharedPrefix); ok {
		return NewThreadID("", rest)
	}
	return NewThreadID(client, name)
}

// NameFor is how client ("" for none: the admin) names the thread: its own thread by the id it
// gave it, a thread outside every client's namespace (a shared scope) as ~id, and, for the admin,
// any thread by its stored form.
func (t ThreadID) NameFor(client string) string {
	switch {
	case t.Client == client:
		return t.Name
	case t.Client == "":
		return SharedPrefix + t.Name
	}
	return t.String()
}

// String is the stored form: the id, or client~id.
func (t ThreadID) String() string {
	if t.Client == "" {
		return t.Name
	}
	return t.Client + namespaceSep + t.Name
}
