// Package limits holds each client to its limits (docs/spec.md §20): requests per minute and
// tokens per day counted across replicas, and what a refusal tells the client. A request's
// admission reads and changes memory alone: each replica counts its own clients' requests and
// tokens, writes its totals of the current windows to Postgres every interval, and reads the
// other replicas' totals in the same round trip. Windows are UTC calendar windows (a minute, a
// day), not sliding ones.
//
// How far over a limit a burst can go: a replica knows the others' counts as they stood at its
// last sync, which they wrote at their last sync, so its view of them is at most two intervals
// old. Within those two intervals each of the other N−1 replicas admits on what it knows, so a
// limit can be passed by what the other replicas admit in two intervals, and never by more than
// (N−1) times the limit. On one replica requests_per_minute is exact. tokens_per_day is checked
// before a request and counted when its answer ends, so each request admitted under the limit may
// take the count over it by its own tokens.
package limits

import (
	"context"
	"crypto/rand"
	"log/slog"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/workspace"
)

// Limits are one client's limits; a zero field is no limit.
type Limits struct {
	RequestsPerMinute int64
	TokensPerDay      int64
	MaxThreads        int64
}

// Source is a client's limits as they stand now (the clients table's, cached by its owner): it is
// called on every request of a client, so it must not reach the database.
type Source func(client string) Limits

// Names of the limits, as refusals and the metric name them.
const (
	RequestsPerMinute = "requests_per_minute"
	TokensPerDay      = "tokens_per_day"
	MaxThreads        = "max_threads"
)

// DefaultInterval is how often a Counter writes its counts and reads the other replicas'.
const DefaultInterval = time.Second

// Usage is what a client used in the current windows, on every replica as this one knows it.
type Usage struct {
	RequestsThisMinute int64 `json:"requests_this_minute"`
	RequestsToday      int64 `json:"requests_today"`
	TokensToday        int64 `json:"tokens_today"`
}

// Refusal is a request refused by a limit: which one, and how long until its window frees.
type Refusal struct {
	Limit      string
	RetryAfter time.Duration
}

// Store is where the counts of every replica meet: workspace.Store.
type Store interface {
	SyncClientUsage(ctx context.Context, writer string, minute, day time.Time, own []workspace.ClientWindow) ([]workspace.ClientWindow, error)
	PruneClientUsage(ctx context.Context) error
}

// counts are a client's counts in the current windows.
type counts struct {
	minuteRequests, dayRequests, dayTokens int64
}

// Counter counts the clients' requests and tokens and decides their admission. Run syncs it with
// the other replicas; without Run it counts on this replica alone.
type Counter struct {
	store    Store
	writer   string
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time

	mu          sync.Mutex
	minute, day time.Time          // the current windows' starts
	own         map[string]*counts // this replica's counts in the current windows
	others      map[string]counts  // the other replicas' sums, as of the last sync
	dirty       map[string]bool    // clients whose own counts changed since the last sync
	// past are this replica's totals of windows that ended since the last sync: written by the
	// next one.
	past []workspace.ClientWindow
	// pruned is when the last prune ran.
	pruned time.Time
}

// NewCounter returns a counter that syncs through store (nil: never) every interval (zero:
// DefaultInterval).
func NewCounter(store Store, interval time.Duration, log *slog.Logger) *Counter {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Counter{store: store, writer: rand.Text(), interval: interval, log: log, now: time.Now,
		own: map[string]*counts{}, others: map[string]counts{}, dirty: map[string]bool{}}
}

// roll moves the windows on to now's, keeping the totals of the windows that ended for the next
// sync. Under mu.
func (c *Counter) roll(now time.Time) {
	now = now.UTC()
	minute, day := now.Truncate(time.Minute), now.Truncate(24*time.Hour)
	if minute.Equal(c.minute) {
		return
	}
	newDay := !day.Equal(c.day)
	for client, n := range c.own {
		if !c.minute.IsZero() && n.minuteRequests > 0 {
			c.past = append(c.past, workspace.ClientWindow{Client: client, Period: workspace.PeriodMinute, Start: c.minute, Requests: n.minuteRequests})
		}
		n.minuteRequests = 0
		if newDay {
			if !c.day.IsZero() && c.dirty[client] {
				c.past = append(c.past, workspace.ClientWindow{Client: client, Period: workspace.PeriodDay, Start: c.day, Requests: n.dayRequests, Tokens: n.dayTokens})
			}
			delete(c.own, client)
			delete(c.dirty, client)
		}
	}
	for client, n := range c.others {
		n.minuteRequests = 0
		if newDay {
			n = counts{}
		}
		c.others[client] = n
	}
	c.minute, c.day = minute, day
}

// Admit counts a request of client and reports nil, or refuses it (counting nothing) when one of
// lim's windows is full: requests_per_minute's, or tokens_per_day's once the day's tokens
// reached it.
func (c *Counter) Admit(client string, lim Limits) *Refusal {
	c.mu.Lock()
	now := c.now()
	defer c.mu.Unlock()
	c.roll(now)
	n := c.ownOf(client)
	o := c.others[client]
	if lim.RequestsPerMinute > 0 && n.minuteRequests+o.minuteRequests >= lim.RequestsPerMinute {
		return &Refusal{Limit: RequestsPerMinute, RetryAfter: c.minute.Add(time.Minute).Sub(now)}
	}
	if lim.TokensPerDay > 0 && n.dayTokens+o.dayTokens >= lim.TokensPerDay {
		return &Refusal{Limit: TokensPerDay, RetryAfter: c.day.Add(24 * time.Hour).Sub(now)}
	}
	n.minuteRequests++
	n.dayRequests++
	c.dirty[client] = true
	return nil
}

// AddTokens counts tokens (prompt plus completion) client used.
func (c *Counter) AddTokens(client string, tokens int64) {
	if tokens <= 0 {
		return
	}
	c.mu.Lock()
	now := c.now()
	defer c.mu.Unlock()
	c.roll(now)
	n := c.ownOf(client)
	n.dayTokens = workspace.AddTokens(n.dayTokens, tokens)
	c.dirty[client] = true
}

// ownOf is this replica's counts of client, made when missing (under mu).
func (c *Counter) ownOf(client string) *counts {
	n := c.own[client]
	if n == nil {
		n = &counts{}
		c.own[client] = n
	}
	return n
}

// Usage is what client used in the current windows, on every replica as this one last read them.
func (c *Counter) Usage(client string) Usage {
	c.mu.Lock()
	now := c.now()
	defer c.mu.Unlock()
	c.roll(now)
	var n counts
	if own := c.own[client]; own != nil {
		n = *own
	}
	o := c.others[client]
	return Usage{RequestsThisMinute: n.minuteRequests + o.minuteRequests, RequestsToday: n.dayRequests + o.dayRequests,
		TokensToday: workspace.AddTokens(n.dayTokens, o.dayTokens)}
}

// Run syncs the counter every interval until ctx ends, then once more (what was counted last is
// written).
func (c *Counter) Run(ctx context.Context) {
	if c.store == nil {
		return
	}
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := c.Sync(final); err != nil {
				c.log.LogAttrs(ctx, slog.LevelWarn, "clients' last usage not written at shutdown", slog.Any("err", err))
			}
			cancel()
			return
		case <-t.C:
			if err := c.Sync(ctx); err != nil && ctx.Err() == nil {
				c.log.LogAttrs(ctx, slog.LevelWarn, "clients' usage not synced; counting on this replica's view", slog.Any("err", err))
			}
		}
	}
}

// Sync writes this replica's counts that changed and reads the other replicas' sums of the
// current windows, in one round trip. A failed write is sent again by the next Sync (the counts
// are absolute).
func (c *Counter) Sync(ctx context.Context) error {
	if c.store == nil {
		return nil
	}
	c.mu.Lock()
	now := c.now()
	c.roll(now)
	minute, day := c.minute, c.day
	rows := c.past
	dirty := c.dirty
	for client := range dirty {
		n := c.own[client]
		rows = append(rows, workspace.ClientWindow{Client: client, Period: workspace.PeriodMinute, Start: minute, Requests: n.minuteRequests},
			workspace.ClientWindow{Client: client, Period: workspace.PeriodDay, Start: day, Requests: n.dayRequests, Tokens: n.dayTokens})
	}
	c.past, c.dirty = nil, map[string]bool{}
	prune := now.Sub(c.pruned) > time.Hour
	c.mu.Unlock()

	others, err := c.store.SyncClientUsage(ctx, c.writer, minute, day, rows)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		// Sent again next time: the windows that ended, and the clients that changed.
		for _, w := range rows {
			if w.Start.Equal(minute) || w.Start.Equal(day) {
				c.dirty[w.Client] = true
			} else {
				c.past = append(c.past, w)
			}
		}
		return err
	}
	if !c.minute.Equal(minute) { // the windows moved on while the sync ran: its sums are of the past
		return nil
	}
	fresh := make(map[string]counts, len(others))
	for _, w := range others {
		n := fresh[w.Client]
		if w.Period == workspace.PeriodMinute {
			n.minuteRequests = w.Requests
		} else {
			n.dayRequests, n.dayTokens = w.Requests, w.Tokens
		}
		fresh[w.Client] = n
	}
	c.others = fresh
	if prune {
		c.pruned = now
		c.mu.Unlock()
		err := c.store.PruneClientUsage(ctx)
		c.mu.Lock()
		return err
	}
	return nil
}

// SetClock replaces the counter's clock (tests: a request must not meet a window's end).
func (c *Counter) SetClock(now func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}
