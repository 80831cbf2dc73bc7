// Package auth is who may call wsproxy: its clients' keys, the admin and metrics tokens, the
// address a request comes from (through trusted proxies), and the throttle of failed
// authentication that every surface shares.
package auth

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/workspace"
)

// ClientKeys are the API keys of wsproxy's own clients (docs/spec.md §20): once any client
// exists, every /v1 request needs one; each client's threads live in a namespace of their own, so
// no client can read or change another's workspace. The keys are data (workspace.Store's clients,
// seeded by CLIENT_KEYS): each replica holds the live ones in memory, by hash, and Follow reloads
// them when they change, so no request reads the database to authenticate.
type ClientKeys struct {
	set   atomic.Pointer[keySet]
	seeds []workspace.SeedKey // CLIENT_KEYS's entries (ParseClientKeys)
	short int                 // the entry number of the first key shorter than MinSecretLength (0: none)

	load    sync.Mutex // one Load at a time: a later load read later data
	src     ClientSource
	version int64 // the clients' version the set was read at (under load)
}

// keySet is the keys at one time.
type keySet struct {
	on bool // some client was ever made: keys are required
	// byHash maps the SHA-256 of a key to its client: a lookup that reveals nothing of the keys
	// through its timing, and no key kept in memory in the clear.
	byHash map[[32]byte]*clientEntry
	byName map[string]*clientEntry
}

// clientEntry is one client's live keys' hashes, sorted, and whether a request used it since the
// last Used.
type clientEntry struct {
	name   string
	hashes [][32]byte
	limits workspace.ClientLimits
	used   atomic.Bool
}

func newKeySet(on bool, keys []workspace.LiveKey) *keySet {
	s := &keySet{on: on, byHash: make(map[[32]byte]*clientEntry, len(keys)), byName: map[string]*clientEntry{}}
	for _, k := range keys {
		e := s.byName[k.Client]
		if e == nil {
			e = &clientEntry{name: k.Client, limits: k.Limits}
			s.byName[k.Client] = e
		}
		e.hashes = append(e.hashes, k.Hash)
		s.byHash[k.Hash] = e
	}
	for _, e := range s.byName {
		slices.SortFunc(e.hashes, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) })
	}
	return s
}

// NewClientKeys returns keys with no client yet: Follow (or Replace) fills them.
func NewClientKeys() *ClientKeys {
	k := &ClientKeys{}
	k.set.Store(newKeySet(false, nil))
	return k
}

// ParseClientKeys reads `name=key` pairs separated by commas or new lines (blank lines and lines
// starting with # are skipped). Names are 1-64 characters of A-Z a-z 0-9 . _ -; a name may have
// several keys (to rotate them), a key one name. The keys returned hold these entries, which are
// also the seeds of the clients' table (Seeds).
func ParseClientKeys(spec string) (*ClientKeys, error) {
	k := &ClientKeys{}
	seen := map[[32]byte]bool{}
	var live []workspace.LiveKey
	sc := bufio.NewScanner(strings.NewReader(strings.ReplaceAll(spec, ",", "\n")))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, key, ok := strings.Cut(line, "=")
		name, key = strings.TrimSpace(name), strings.TrimSpace(key)
		if !ok || key == "" {
			return nil, fmt.Errorf("entry %d: want name=key", n) // never echo what might be a key
		}
		if !workspace.ValidClientName(name) {
			return nil, fmt.Errorf("entry %d: the client name must be 1-64 characters of A-Z a-z 0-9 . _ -", n)
		}
		h := hashOf(key)
		if seen[h] {
			return nil, fmt.Errorf("entry %d (%s): the key is given twice", n, name)
		}
		seen[h] = true
		live = append(live, workspace.LiveKey{Hash: h, Client: name})
		k.seeds = append(k.seeds, workspace.SeedKey{Client: name, NewClientKey: workspace.NewClientKey{Hash: h, Prefix: KeyPrefix(key)}})
		if k.short == 0 && utf8.RuneCountInString(key) < MinSecretLength {
			k.short = n
		}
	}
	if len(live) == 0 {
		return nil, fmt.Errorf("no name=key entry")
	}
	k.set.Store(newKeySet(true, live))
	return k, nil
}

// ShortKey is the entry number of the first key shorter than MinSecretLength, 0 when none
// (cmd/proxy refuses such a key at start).
func (k *ClientKeys) ShortKey() int { return k.short }

// Seeds are the entries ParseClientKeys read: CLIENT_KEYS's, for workspace.Store.SeedClients.
func (k *ClientKeys) Seeds() []workspace.SeedKey {
	k.load.Lock()
	defer k.load.Unlock()
	return k.seeds
}

// SetSeeds makes from's entries (a CLIENT_KEYS read again) the seeds of k.
func (k *ClientKeys) SetSeeds(from *ClientKeys) {
	k.load.Lock()
	defer k.load.Unlock()
	k.seeds = from.seeds
}

// On reports whether client keys are required: some client was ever made (false for nil).
func (k *ClientKeys) On() bool { return k != nil && k.set.Load().on }

// Names are the clients' names, sorted, each once.
func (k *ClientKeys) Names() []string { return slices.Sorted(maps.Keys(k.set.Load().byName)) }

// Len is the number of live keys, of all clients.
func (k *ClientKeys) Len() int { return len(k.set.Load().byHash) }

// Lookup returns the client whose key key is, and notes the client used.
func (k *ClientKeys) Lookup(key string) (string, bool) {
	e, ok := k.set.Load().byHash[hashOf(key)]
	if !ok {
		return "", false
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	return e.name, true
}

// Limits are the client's limits as the keys were last loaded (none for no client): asked on
// every request of a client, answered from memory.
func (k *ClientKeys) Limits(client string) workspace.ClientLimits {
	if e := k.set.Load().byName[client]; e != nil {
		return e.limits
	}
	return workspace.ClientLimits{}
}

// hashes are the client's live keys' hashes, sorted (none for no client).
func (k *ClientKeys) hashes(client string) [][32]byte {
	if e := k.set.Load().byName[client]; e != nil {
		return e.hashes
	}
	return nil
}

// Replace makes keys the live keys; on says whether keys are required.
func (k *ClientKeys) Replace(on bool, keys []workspace.LiveKey) {
	next := newKeySet(on, keys)
	if prev := k.set.Swap(next); prev != nil {
		for name, e := range prev.byName { // what was used stays to be noted
			if n := next.byName[name]; n != nil && e.used.Load() {
				n.used.Store(true)
			}
		}
	}
}

// Used are the clients used since the last call, sorted.
func (k *ClientKeys) Used() []string {
	var out []string
	for name, e := range k.set.Load().byName {
		if e.used.Load() && e.used.CompareAndSwap(true, false) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// ClientSource is where the clients are kept: workspace.Store.
type ClientSource interface {
	ClientsVersion(ctx context.Context) (int64, error)
	LiveClientKeys(ctx context.Context) (exist bool, keys []workspace.LiveKey, err error)
	TouchClients(ctx context.Context, names []string, at time.Time) error
}

// Load reads the live keys from src, which later Reloads read from too, and holds them.
func (k *ClientKeys) Load(ctx context.Context, src ClientSource) error {
	k.load.Lock()
	defer k.load.Unlock()
	k.src = src
	return k.loadLocked(ctx, -1)
}

// Reload reads the keys again from the source Load was given (none: nothing to do): the admin
// REST calls it after a change, so this replica's next request sees it.
func (k *ClientKeys) Reload(ctx context.Context) error {
	if k == nil {
		return nil
	}
	k.load.Lock()
	defer k.load.Unlock()
	if k.src == nil {
		return nil
	}
	return k.loadLocked(ctx, -1)
}

// loadLocked reads the keys unless the clients' version is still seen (-1: read anyway). The
// version is read first: a change committed after it moves it again, and the next poll reloads.
func (k *ClientKeys) loadLocked(ctx context.Context, seen int64) error {
	v, err := k.src.ClientsVersion(ctx)
	if err != nil {
		return err
	}
	if v == seen {
		return nil
	}
	on, keys, err := k.src.LiveClientKeys(ctx)
	if err != nil {
		return err
	}
	k.Replace(on || len(k.seeds) > 0, keys)
	k.version = v
	return nil
}

// TouchEvery is how often a replica notes its clients' last use (Follow).
const TouchEvery = 5 * time.Second

// Follow reads the clients' version every interval and reloads the keys when it moved, and notes
// the clients used every TouchEvery, until ctx ends. Load must have been called. A failed read
// is logged once until one succeeds; the keys held meanwhile stay (requests are served).
func (k *ClientKeys) Follow(ctx context.Context, interval time.Duration, log *slog.Logger) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	failing, touched := false, time.Now()
	for {
		select {
		case <-ctx.Done():
			k.touch(context.WithoutCancel(ctx), log)
			return
		case <-ticker.C:
		}
		k.load.Lock()
		err := k.loadLocked(ctx, k.version)
		k.load.Unlock()
		if err != nil {
			if !failing && ctx.Err() == nil && log != nil {
				log.LogAttrs(ctx, slog.LevelWarn, "the client keys cannot be reloaded; the keys held stay in use; retrying", slog.Any("err", err))
			}
			failing = true
			continue
		}
		if failing && log != nil {
			log.LogAttrs(ctx, slog.LevelInfo, "the client keys are reloaded again")
		}
		failing = false
		if time.Since(touched) >= TouchEvery {
			touched = time.Now()
			k.touch(ctx, log)
		}
	}
}

// touch notes the clients used since the last time.
func (k *ClientKeys) touch(ctx context.Context, log *slog.Logger) {
	used := k.Used()
	if len(used) == 0 || k.src == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := k.src.TouchClients(ctx, used, time.Now()); err != nil && log != nil {
		log.LogAttrs(ctx, slog.LevelWarn, "the clients' last use not noted", slog.Int("clients", len(used)), slog.Any("err", err))
	}
}

// KeyPrefix is what is kept of a key to recognise it by (docs/spec.md §20): its first 8
// characters for a key of 40 or more, else its first 4 (a short CLIENT_KEYS key gives less of
// itself away).
func KeyPrefix(key string) string {
	n := 4
	if len(key) >= 40 {
		n = 8
	}
	return key[:min(n, len(key))]
}

// KeyPrefixText begins every key NewKey makes: a key is recognisable as wsproxy's (by secret
// scanners too).
const KeyPrefixText = "wsp_"

// NewKey is a new client key — KeyPrefixText and 32 random bytes, base64url — and what the
// store keeps of it.
func NewKey() (string, workspace.NewClientKey) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	key := KeyPrefixText + base64.RawURLEncoding.EncodeToString(b)
	return key, workspace.NewClientKey{Hash: hashOf(key), Prefix: KeyPrefix(key)}
}

func hashOf(key string) [32]byte { return sha256.Sum256([]byte(key)) }

// BearerToken is the token of a request's `Authorization: Bearer <token>`; the scheme is
// matched without regard to case (RFC 9110 §11.1).
func BearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}
