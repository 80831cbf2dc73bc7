// Package auth is who may call wsproxy: its clients' keys, the admin and metrics tokens, the
// address a request comes from (through trusted proxies), and the throttle of failed
// authentication that every surface shares.
package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/workspace"
)

// ClientKeys are the API keys of wsproxy's own clients (CLIENT_KEYS). When set, every /v1
// request needs one; each client's threads live in a namespace of their own, so no client can
// read or change another's workspace.
type ClientKeys struct {
	// byHash maps the SHA-256 of a key to its client: a lookup that reveals nothing of the keys
	// through its timing, and no key kept in memory in the clear.
	byHash map[[32]byte]string
	byName map[string][][32]byte // each client's keys' hashes, sorted
	short  int                   // the entry number of the first key shorter than MinSecretLength (0: none)
}

// ParseClientKeys reads `name=key` pairs separated by commas or new lines (blank lines and lines
// starting with # are skipped). Names are 1-64 characters of A-Z a-z 0-9 . _ -; a name may have
// several keys (to rotate them), a key one name.
func ParseClientKeys(spec string) (*ClientKeys, error) {
	k := &ClientKeys{byHash: map[[32]byte]string{}, byName: map[string][][32]byte{}}
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
		if _, dup := k.byHash[h]; dup {
			return nil, fmt.Errorf("entry %d (%s): the key is given twice", n, name)
		}
		k.byHash[h], k.byName[name] = name, append(k.byName[name], h)
		if k.short == 0 && utf8.RuneCountInString(key) < MinSecretLength {
			k.short = n
		}
	}
	if len(k.byHash) == 0 {
		return nil, fmt.Errorf("no name=key entry")
	}
	for _, hashes := range k.byName {
		slices.SortFunc(hashes, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) })
	}
	return k, nil
}

// ShortKey is the entry number of the first key shorter than MinSecretLength, 0 when none
// (cmd/proxy refuses such a key at start).
func (k *ClientKeys) ShortKey() int { return k.short }

// Names are the clients' names, sorted, each once.
func (k *ClientKeys) Names() []string { return slices.Sorted(maps.Keys(k.byName)) }

// Len is the number of keys, of all clients.
func (k *ClientKeys) Len() int { return len(k.byHash) }

// Lookup returns the client whose key key is.
func (k *ClientKeys) Lookup(key string) (string, bool) {
	name, ok := k.byHash[hashOf(key)]
	return name, ok
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
