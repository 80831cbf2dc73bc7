package workspace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wsproxy/wsproxy/db"
)

// Clients are data (docs/spec.md §20): the store keeps the clients and their keys' hashes; the
// keys themselves are never given to it. Every change moves the clients' version in its own
// transaction, which each replica reads to reload the keys it holds in memory.

// ErrClientExists is a new client's name taken by a live client.
var ErrClientExists = errors.New("a client of that name exists")

// ClientLimits are a client's limits (docs/spec.md §20), each nil when none.
type ClientLimits struct {
	RequestsPerMinute *int32 `json:"requests_per_minute"`
	TokensPerDay      *int64 `json:"tokens_per_day"`
	MaxThreads        *int32 `json:"max_threads"`
}

// LimitsPatch changes the limits whose Set* is true, each to its value (nil: none).
type LimitsPatch struct {
	SetRequestsPerMinute, SetTokensPerDay, SetMaxThreads bool
	Limits                                               ClientLimits
}

// Client is a live client: its name, limits and live keys (their prefixes, never a key).
type Client struct {
	Name       string       `json:"name"`
	CreatedAt  time.Time    `json:"created_at"`
	LastUsedAt *time.Time   `json:"last_used_at"`
	Limits     ClientLimits `json:"limits"`
	Keys       []ClientKey  `json:"keys"`
}

// ClientKey is one live key of a client, as it is recognised: its id and at most its first 8
// characters.
type ClientKey struct {
	ID        int64     `json:"id"`
	Prefix    string    `json:"prefix"`
	Seeded    bool      `json:"seeded"` // from CLIENT_KEYS
	CreatedAt time.Time `json:"created_at"`
}

// KeyHash is the SHA-256 of a key: what the store keeps of it.
type KeyHash = [32]byte

// NewClientKey is a key to store: its hash and prefix.
type NewClientKey struct {
	Hash   KeyHash
	Prefix string
}

// LiveKey is a key that authenticates, its client and the client's limits.
type LiveKey struct {
	Hash   KeyHash
	Client string
	Limits ClientLimits
}

// ClientsVersion is where the clients stand: it moves with every change of them.
func (s *Store) ClientsVersion(ctx context.Context) (_ int64, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	v, err := s.q.ClientsVersion(ctx, s.pool)
	if err != nil {
		return 0, fmt.Errorf("read the clients' version: %w", err)
	}
	return v, nil
}

// LiveClientKeys are the keys that authenticate now, and whether any client was ever made
// (exist: from then on every /v1 request needs a key).
func (s *Store) LiveClientKeys(ctx context.Context) (exist bool, keys []LiveKey, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		if exist, err = s.q.ClientsExist(ctx, tx); err != nil {
			return err
		}
		rows, err := s.q.ClientKeysLive(ctx, tx)
		if err != nil {
			return err
		}
		keys = make([]LiveKey, 0, len(rows))
		for _, r := range rows {
			if len(r.Hash) == len(KeyHash{}) {
				keys = append(keys, LiveKey{Hash: KeyHash(r.Hash), Client: r.Client,
					Limits: limitsOf(r.RequestsPerMinute, r.TokensPerDay, r.MaxThreads)})
			}
		}
		return nil
	})
	if err != nil {
		return false, nil, fmt.Errorf("read the clients' keys: %w", err)
	}
	return exist, keys, nil
}

// changeClients runs fn in a transaction that moves the clients' version.
func (s *Store) changeClients(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.q.ClientsLock(ctx, tx); err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			return err
		}
		return s.q.ClientsBump(ctx, tx)
	})
}

// CreateClient creates the client name with its limits and its first key. ErrClientExists when a
// live client has the name; a deleted client's name is made anew (its threads are its
// namespace's still, docs/spec.md §20).
func (s *Store) CreateClient(ctx context.Context, name string, limits ClientLimits, key NewClientKey) (_ Client, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	if !ValidClientName(name) {
		return Client{}, ErrInvalidClient
	}
	var c Client
	err = s.changeClients(ctx, func(tx pgx.Tx) error {
		row, err := s.q.ClientCreate(ctx, tx, db.ClientCreateParams{Name: name, RequestsPerMinute: int4(limits.RequestsPerMinute),
			TokensPerDay: int8(limits.TokensPerDay), MaxThreads: int4(limits.MaxThreads)})
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrClientExists
		}
		if err != nil {
			return err
		}
		k, err := s.q.ClientKeyInsert(ctx, tx, db.ClientKeyInsertParams{Client: name, Hash: key.Hash[:], Prefix: key.Prefix})
		if err != nil {
			return err
		}
		c = fromClient(row)
		c.Keys = []ClientKey{{ID: k.ID, Prefix: k.Prefix, Seeded: k.Seeded, CreatedAt: k.CreatedAt.Time}}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrClientExists) {
			return Client{}, err
		}
		return Client{}, fmt.Errorf("create client: %w", err)
	}
	return c, nil
}

// AddClientKey adds a key to the client: both its keys work until one is revoked. ErrNotFound
// when there is no live client of that name.
func (s *Store) AddClientKey(ctx context.Context, name string, key NewClientKey) (_ ClientKey, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	var k db.ClientKeyInsertRow
	err = s.changeClients(ctx, func(tx pgx.Tx) error {
		k, err = s.q.ClientKeyInsert(ctx, tx, db.ClientKeyInsertParams{Client: name, Hash: key.Hash[:], Prefix: key.Prefix})
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return ClientKey{}, err
		}
		return ClientKey{}, fmt.Errorf("add client key: %w", err)
	}
	return ClientKey{ID: k.ID, Prefix: k.Prefix, Seeded: k.Seeded, CreatedAt: k.CreatedAt.Time}, nil
}

// RevokeClientKey revokes the client's key id. ErrNotFound when the client has no such live key.
func (s *Store) RevokeClientKey(ctx context.Context, name string, id int64) (err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	err = s.changeClients(ctx, func(tx pgx.Tx) error {
		n, err := s.q.ClientKeyRevoke(ctx, tx, db.ClientKeyRevokeParams{Client: name, ID: id})
		if err == nil && n == 0 {
			err = ErrNotFound
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("revoke client key: %w", err)
	}
	return err
}

// DeleteClient deletes the client and revokes its keys; its threads stay. ErrNotFound when there
// is no live client of that name.
func (s *Store) DeleteClient(ctx context.Context, name string) (err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	err = s.changeClients(ctx, func(tx pgx.Tx) error {
		n, err := s.q.ClientDelete(ctx, tx, name)
		if err == nil && n == 0 {
			err = ErrNotFound
		}
		if err != nil {
			return err
		}
		return s.q.ClientKeysRevokeAll(ctx, tx, name)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("delete client: %w", err)
	}
	return err
}

// SetClientLimits changes the client's limits. ErrNotFound when there is no live client of that
// name.
func (s *Store) SetClientLimits(ctx context.Context, name string, p LimitsPatch) (_ Client, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	var row db.Client
	err = s.changeClients(ctx, func(tx pgx.Tx) error {
		row, err = s.q.ClientSetLimits(ctx, tx, db.ClientSetLimitsParams{Name: name,
			SetRequestsPerMinute: p.SetRequestsPerMinute, RequestsPerMinute: int4(p.Limits.RequestsPerMinute),
			SetTokensPerDay: p.SetTokensPerDay, TokensPerDay: int8(p.Limits.TokensPerDay),
			SetMaxThreads: p.SetMaxThreads, MaxThreads: int4(p.Limits.MaxThreads)})
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Client{}, err
		}
		return Client{}, fmt.Errorf("set client limits: %w", err)
	}
	return s.withKeys(ctx, fromClient(row))
}

// Client is the live client name with its keys. ErrNotFound when there is none.
func (s *Store) Client(ctx context.Context, name string) (_ Client, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	row, err := s.q.ClientGet(ctx, s.pool, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Client{}, ErrNotFound
	}
	if err != nil {
		return Client{}, fmt.Errorf("read client: %w", err)
	}
	return s.withKeys(ctx, fromClient(row))
}

// Clients are the live clients, by name, with their keys.
func (s *Store) Clients(ctx context.Context) (_ []Client, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	rows, err := s.q.ClientList(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("list clients: %w", err)
	}
	out, names, at := make([]Client, len(rows)), make([]string, len(rows)), make(map[string]int, len(rows))
	for i, r := range rows {
		out[i], names[i], at[r.Name] = fromClient(r), r.Name, i
	}
	keys, err := s.q.ClientKeyList(ctx, s.pool, names)
	if err != nil {
		return nil, fmt.Errorf("list client keys: %w", err)
	}
	for _, k := range keys {
		if i, ok := at[k.Client]; ok {
			out[i].Keys = append(out[i].Keys, ClientKey{ID: k.ID, Prefix: k.Prefix, Seeded: k.Seeded, CreatedAt: k.CreatedAt.Time})
		}
	}
	return out, nil
}

func (s *Store) withKeys(ctx context.Context, c Client) (Client, error) {
	keys, err := s.q.ClientKeyList(ctx, s.pool, []string{c.Name})
	if err != nil {
		return Client{}, fmt.Errorf("list client keys: %w", err)
	}
	c.Keys = make([]ClientKey, len(keys))
	for i, k := range keys {
		c.Keys[i] = ClientKey{ID: k.ID, Prefix: k.Prefix, Seeded: k.Seeded, CreatedAt: k.CreatedAt.Time}
	}
	return c, nil
}

// TouchClients notes that the clients names were used at at (a replica's batch).
func (s *Store) TouchClients(ctx context.Context, names []string, at time.Time) (err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	if err := s.q.ClientsTouch(ctx, s.pool, db.ClientsTouchParams{Names: names, At: pgtype.Timestamptz{Time: at, Valid: true}}); err != nil {
		return fmt.Errorf("note the clients used: %w", err)
	}
	return nil
}

// SeedKey is one CLIENT_KEYS entry: its client and its key's hash and prefix.
type SeedKey struct {
	Client string
	NewClientKey
}

// Seeded is what a seed changed, by client name (never a key).
type Seeded struct {
	Added   []string // clients given a key (and created, or undeleted, when needed)
	Revoked []string // clients whose key left CLIENT_KEYS and is revoked
	Kept    []string // clients whose entry names a key revoked over the admin REST: it stays revoked
}

// SeedClients makes the table hold CLIENT_KEYS (docs/spec.md §20): each entry's client and key
// are created when missing; a key that came from an earlier seed and is no longer among seeds is
// revoked. A key revoked before is never revived.
func (s *Store) SeedClients(ctx context.Context, seeds []SeedKey) (_ Seeded, err error) {
	ctx, done := s.op(ctx)
	defer done(&err)
	var out Seeded
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out = Seeded{}
		// Every replica may start at once: their seeds run one after the other, each reading
		// what the one before wrote (each statement of READ COMMITTED reads anew).
		if err := s.q.ClientsLock(ctx, tx); err != nil {
			return err
		}
		keep := make([][]byte, len(seeds))
		for i, sk := range seeds {
			keep[i] = sk.Hash[:]
			k, err := s.q.ClientKeyByHash(ctx, tx, sk.Hash[:])
			if err == nil {
				if k.RevokedAt.Valid {
					out.Kept = append(out.Kept, k.Client)
				}
				continue
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			if _, err := s.q.ClientEnsure(ctx, tx, sk.Client); err != nil {
				return err
			}
			if _, err := s.q.ClientKeyInsert(ctx, tx, db.ClientKeyInsertParams{Client: sk.Client, Hash: sk.Hash[:], Prefix: sk.Prefix, Seeded: true}); err != nil {
				return err
			}
			out.Added = append(out.Added, sk.Client)
		}
		revoked, err := s.q.ClientKeysRevokeUnseeded(ctx, tx, keep)
		if err != nil {
			return err
		}
		out.Revoked = revoked
		if len(out.Added)+len(out.Revoked) == 0 {
			return nil
		}
		return s.q.ClientsBump(ctx, tx)
	})
	if err != nil {
		return Seeded{}, fmt.Errorf("seed clients from CLIENT_KEYS: %w", err)
	}
	for _, l := range []*[]string{&out.Added, &out.Revoked, &out.Kept} {
		slices.Sort(*l)
		*l = slices.Compact(*l)
	}
	return out, nil
}

func fromClient(r db.Client) Client {
	c := Client{Name: r.Name, CreatedAt: r.CreatedAt.Time, Keys: []ClientKey{}}
	if r.LastUsedAt.Valid {
		t := r.LastUsedAt.Time
		c.LastUsedAt = &t
	}
	c.Limits = limitsOf(r.RequestsPerMinute, r.TokensPerDay, r.MaxThreads)
	return c
}

// limitsOf are the limits of a client's row, each nil when none.
func limitsOf(requestsPerMinute pgtype.Int4, tokensPerDay pgtype.Int8, maxThreads pgtype.Int4) ClientLimits {
	var l ClientLimits
	if requestsPerMinute.Valid {
		l.RequestsPerMinute = &requestsPerMinute.Int32
	}
	if tokensPerDay.Valid {
		l.TokensPerDay = &tokensPerDay.Int64
	}
	if maxThreads.Valid {
		l.MaxThreads = &maxThreads.Int32
	}
	return l
}

func int4(v *int32) pgtype.Int4 {
	if v == nil {
		return pgtype.Int4{}
	}
	return pgtype.Int4{Int32: *v, Valid: true}
}

func int8(v *int64) pgtype.Int8 {
	if v == nil {
		return pgtype.Int8{}
	}
	return pgtype.Int8{Int64: *v, Valid: true}
}
