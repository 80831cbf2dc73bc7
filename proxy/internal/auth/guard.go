package auth

import (
	"crypto/subtle"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
)

// Guard authenticates the requests of one wsproxy: the admin and metrics tokens, the clients'
// keys, and the address a request comes from; it throttles failed authentication per address
// on every surface.
type Guard struct {
	AdminToken   string      // "" refuses every admin call
	MetricsToken string      // "" leaves /metrics open
	ClientKeys   *ClientKeys // nil: no client keys
	Peers        Peers
	failures     throttle
	signer       struct {
		once sync.Once
		s    Signer
	}
}

// Signer is the signer of the panel's sessions and links and of MCP's thread tokens, derived
// from the admin token (one for every surface).
func (g *Guard) Signer() Signer {
	g.signer.once.Do(func() { g.signer.s = NewSigner(g.AdminToken) })
	return g.signer.s
}

// IsAdmin reports whether token is the admin token (compared in constant time).
func (g *Guard) IsAdmin(token string) bool { return g.AdminToken != "" && equal(token, g.AdminToken) }

// IsMetrics reports whether token is the metrics token.
func (g *Guard) IsMetrics(token string) bool {
	return g.MetricsToken != "" && equal(token, g.MetricsToken)
}

// Client is the client whose key key is; false without client keys.
func (g *Guard) Client(key string) (string, bool) {
	if !g.ClientKeys.On() {
		return "", false
	}
	return g.ClientKeys.Lookup(key)
}

// A client's panel sessions, and the links and MCP tokens of its threads, are bound to the keys
// they were made under (docs/spec.md §13): what they sign names a fingerprint — of the key that
// signed in (KeyFingerprint), or, for what the admin made for a client's thread, of all that
// client's keys (ClientFingerprint) — and they hold while it still stands (Holds). Removing a
// client, or rotating its key, thus ends them for good; a client added back with a new key revives
// nothing. A fingerprint is a MAC with the signer's key: a token's holder learns nothing of a key.

// KeyFingerprint is the fingerprint of one client key.
func (g *Guard) KeyFingerprint(key string) string {
	return g.Signer().fingerprint("key", hashOf(key))
}

// ClientFingerprint is the fingerprint of every key the client has now ("" for no client).
func (g *Guard) ClientFingerprint(client string) string {
	if client == "" || g.ClientKeys == nil {
		return ""
	}
	return g.Signer().fingerprint("keys", g.ClientKeys.hashes(client)...)
}

// Holds reports whether what is bound to fp for the client still holds: fp is the fingerprint of
// one of the client's keys, or of all of them. A thread of no client ("") is bound to no key.
func (g *Guard) Holds(client, fp string) bool {
	if client == "" {
		return true
	}
	if g.ClientKeys == nil || fp == "" {
		return false
	}
	hashes := g.ClientKeys.hashes(client) // one set: a reload meanwhile changes nothing here
	if len(hashes) == 0 {
		return false
	}
	for _, h := range hashes {
		if fp == g.Signer().fingerprint("key", h) {
			return true
		}
	}
	return fp == g.Signer().fingerprint("keys", hashes...)
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// Attempt is one authentication of r by verify: nil when verify holds, whatever the address
// did before (docs/spec.md §10: valid credentials are always served); else failed, counted
// against r's address, or — past MaxFailures failures from it within FailureWindow — 429
// too_many_failures.
func (g *Guard) Attempt(r *http.Request, verify func() bool, failed error) error {
	if verify() {
		return nil
	}
	addr := g.Peers.ClientAddr(r) // an IPv6 address as its /64
	if err := g.failures.check(addr); err != nil {
		return err
	}
	g.failures.fail(addr)
	return failed
}

// throttle slows down guessing: past MaxFailures failed authentications from one address
// within FailureWindow (a wrong admin token, client key, sign-in token or metrics token), every
// further failure from it is a 429 until the window ends. The right credential is never held
// back (one address may be a host, a NAT or a proxy many clients share); guessing is made
// hopeless by the keys' length instead (MinSecretLength).
type throttle struct {
	mu       sync.Mutex
	failures map[string]*failures // by client address
	swept    time.Time            // the last sweep of the ended windows
}

type failures struct {
	n     int
	until time.Time
}

// Past MaxFailures failed authentications from one address within FailureWindow, its further
// failures are a 429 until the window ends.
const (
	MaxFailures   = 5
	FailureWindow = time.Minute
)

// MinSecretLength is the least length, in characters, of a client key, the admin token and the
// metrics token: refused at start when shorter (docs/spec.md §10).
const MinSecretLength = 20

// check is the error a failure from an address that must wait gets (429 with Retry-After), or
// nil.
func (t *throttle) check(addr string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.failures[addr]
	if f == nil || time.Now().After(f.until) || f.n < MaxFailures {
		return nil
	}
	return &apierr.Error{Status: http.StatusTooManyRequests, Type: "invalid_request_error", Code: "too_many_failures",
		Message: "too many failed authentications from this address; wait a minute",
		Header:  http.Header{"Retry-After": {strconv.Itoa(int(time.Until(f.until)/time.Second) + 1)}}}
}

func (t *throttle) fail(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.failures == nil {
		t.failures = map[string]*failures{}
	}
	f := t.failures[addr]
	if f == nil && len(t.failures) >= maxTracked {
		t.makeRoom(now)
	}
	if f == nil || now.After(f.until) {
		f = &failures{until: now.Add(FailureWindow)}
		t.failures[addr] = f
	}
	f.n++
}

// makeRoom drops the addresses whose window ended, at most once a second, and when every one
// of them is still in its window, one of them at random: the map stays within maxTracked and a
// failure costs no more than a sweep a second, however many addresses fail.
func (t *throttle) makeRoom(now time.Time) {
	if now.Sub(t.swept) >= time.Second {
		t.swept = now
		for a, f := range t.failures {
			if now.After(f.until) {
				delete(t.failures, a)
			}
		}
	}
	for a := range t.failures {
		if len(t.failures) < maxTracked {
			break
		}
		delete(t.failures, a)
	}
}

// maxTracked bounds the addresses the throttle tracks.
const maxTracked = 10000
