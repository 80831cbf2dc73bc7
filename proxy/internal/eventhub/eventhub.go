// Package eventhub wakes what a replica holds open on a thread — the admin REST's event streams
// (docs/spec.md §13) and MCP's resource subscriptions (§15) — when the thread, or one of its
// ancestors (§17, WatchAlso), changes on any replica. The hub follows the threads its
// subscribers watch: every interval it reads where they stand (workspace.Store.Versions, one
// indexed read, none while nothing is watched) and wakes the subscribers of each that moved, who
// then read what is new. No write waits for it: a writing transaction notifies no one, so none
// takes the lock PostgreSQL's NOTIFY takes for the whole database. A wake-up carries no data, so
// a subscriber that misses one (its buffer holds one) still reads everything at the next.
package eventhub

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/workspace"
)

// Versions reads where threads (stored form) stand: workspace.Store.Versions.
type Versions func(ctx context.Context, threads []string) (map[string]workspace.Version, error)

// DefaultInterval is how often a hub reads where its watched threads stand: a change reaches
// every replica's streams within about that (EVENTS_POLL_INTERVAL).
const DefaultInterval = 250 * time.Millisecond

// Hub wakes the subscribers of a thread when it changes. Close stops its following.
type Hub struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]bool // by thread (stored form)
	// seen is where each watched thread stood at the last read (absent: not read yet; a zero
	// Version: the thread did not exist).
	seen      map[string]workspace.Version
	stop      context.CancelFunc
	following sync.WaitGroup
	closeOnce sync.Once
}

// New returns a hub that follows its watched threads with versions every interval (zero:
// DefaultInterval) until Close. A nil versions follows nothing: its subscribers are never woken,
// and read at their own heartbeat.
func New(versions Versions, interval time.Duration, log *slog.Logger) *Hub {
	ctx, stop := context.WithCancel(context.Background())
	h := &Hub{subs: map[string]map[chan struct{}]bool{}, seen: map[string]workspace.Version{}, stop: stop}
	if interval <= 0 {
		interval = DefaultInterval
	}
	if versions != nil {
		h.following.Go(func() { h.follow(ctx, versions, interval, log) })
	}
	return h
}

// Close stops following, once, and waits for it to end.
func (h *Hub) Close() {
	h.closeOnce.Do(func() {
		h.stop()
		h.following.Wait()
	})
}

// follow reads where the watched threads stand every interval, and wakes the subscribers of
// those that moved, and of those read for the first time (a change committed between a
// subscriber's first read and the hub's first sight of its thread would otherwise wake no one).
// A failed read is logged once until one succeeds; the next read finds what it missed.
func (h *Hub) follow(ctx context.Context, versions Versions, interval time.Duration, log *slog.Logger) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		h.mu.Lock()
		threads := slices.Collect(maps.Keys(h.subs))
		h.mu.Unlock()
		if len(threads) == 0 {
			continue
		}
		now, err := versions(ctx, threads)
		if err != nil {
			if !failing && ctx.Err() == nil && log != nil {
				log.LogAttrs(ctx, slog.LevelWarn, "the event streams cannot read where their threads stand; retrying", slog.Any("err", err))
			}
			failing = true
			continue
		}
		failing = false
		h.moved(threads, now)
	}
}

// moved wakes the subscribers of each of threads whose version is not the one seen before, and
// forgets the threads no one watches any more.
func (h *Hub) moved(threads []string, now map[string]workspace.Version) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range threads {
		v := now[t]
		if was, ok := h.seen[t]; !ok || was.NextEvent != v.NextEvent || !was.Created.Equal(v.Created) {
			h.seen[t] = v
			for ch := range h.subs[t] {
				wake(ch)
			}
		}
	}
	for t := range h.seen {
		if h.subs[t] == nil {
			delete(h.seen, t)
		}
	}
}

// add has thread's changes wake ch.
func (h *Hub) add(thread string, ch chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[thread] == nil {
		h.subs[thread] = map[chan struct{}]bool{}
	}
	h.subs[thread][ch] = true
}

// remove ends what add began.
func (h *Hub) remove(thread string, ch chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs[thread], ch)
	if len(h.subs[thread]) == 0 {
		delete(h.subs, thread)
	}
}

// Heartbeat is how often a watch reads unwoken (Watch): a hub that follows nothing, or cannot
// read, delays what it reads by one heartbeat at most.
const Heartbeat = 15 * time.Second

// Watch calls fn at once, then at each wake-up of thread (stored form) and, unwoken, every
// interval (tick true), until ctx ends (nil) or fn fails (its error).
func (h *Hub) Watch(ctx context.Context, thread string, every time.Duration, fn func(tick bool) error) error {
	return h.WatchAlso(ctx, thread, every, func(tick bool) ([]string, error) { return nil, fn(tick) })
}

// WatchAlso is Watch, woken also by the changes of the threads (stored form) fn returned at its
// last call: the thread's ancestors, whose changes are changes of what it inherits (docs/spec.md
// §17), read by fn each time, so that a change of the thread's parents, or of theirs, moves the
// watch. When fn names a thread it did not, fn is called again at once: a change committed
// between its read and the hub's watching the thread woke nothing.
func (h *Hub) WatchAlso(ctx context.Context, thread string, every time.Duration, fn func(tick bool) (also []string, err error)) error {
	ch := make(chan struct{}, 1)
	watched := map[string]bool{thread: true}
	h.add(thread, ch)
	defer func() {
		for t := range watched {
			h.remove(t, ch)
		}
	}()
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for tick := false; ctx.Err() == nil; {
		also, err := fn(tick)
		if err != nil {
			return err
		}
		if h.watchOnly(ch, watched, thread, also) {
			tick = false
			continue
		}
		select {
		case <-ctx.Done():
		case <-ch:
			tick = false
		case <-ticker.C:
			tick = true
		}
	}
	return nil
}

// watchOnly has ch woken by the changes of thread and also, no longer by the other threads in
// watched (which it updates), and reports whether a thread was added.
func (h *Hub) watchOnly(ch chan struct{}, watched map[string]bool, thread string, also []string) (added bool) {
	want := map[string]bool{thread: true}
	for _, t := range also {
		want[t] = true
	}
	for t := range watched {
		if !want[t] {
			h.remove(t, ch)
			delete(watched, t)
		}
	}
	for t := range want {
		if !watched[t] {
			h.add(t, ch)
			watched[t] = true
			added = true
		}
	}
	return added
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // a wake-up is already pending
	}
}
