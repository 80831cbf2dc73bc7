// Package eventhub wakes what a replica holds open on a thread — the admin REST's event streams
// (docs/spec.md §13) and MCP's resource subscriptions (§15) — when the thread, or one of its
// ancestors (§17, WatchAlso), changes on any replica: Postgres notifies every replica of each
// commit of events (workspace.ListenEvents), and the hub wakes the subscribers of that thread, who
// then read what is new. A wake-up carries no data,
// so a subscriber that misses one (its buffer holds one) still reads everything at the next.
package eventhub

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/workspace"
)

// Hub wakes the subscribers of a thread when it changes. Close stops its listening.
type Hub struct {
	mu        sync.Mutex
	subs      map[string]map[chan struct{}]bool // by thread (stored form)
	stop      context.CancelFunc
	listening sync.WaitGroup
	closeOnce sync.Once
}

// New returns a hub that listens to Postgres's notifications over listenURL (a direct
// connection: DATABASE_LISTEN_URL) until Close. An empty listenURL listens to nothing: its
// subscribers are never woken, and read at their own heartbeat.
func New(listenURL string, log *slog.Logger) *Hub {
	ctx, stop := context.WithCancel(context.Background())
	h := &Hub{subs: map[string]map[chan struct{}]bool{}, stop: stop}
	if listenURL != "" {
		h.listening.Go(func() { workspace.ListenEvents(ctx, listenURL, h.changed, h.resync, log) })
	}
	return h
}

// Close stops listening, once, and waits for the listening to end.
func (h *Hub) Close() {
	h.closeOnce.Do(func() {
		h.stop()
		h.listening.Wait()
	})
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

// Heartbeat is how often a watch reads unwoken (Watch): a lost notification (or none, without
// LISTEN) delays what it reads by one heartbeat at most.
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

// changed wakes the subscribers of thread: it has new events.
func (h *Hub) changed(thread string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[thread] {
		wake(ch)
	}
}

// resync wakes every subscriber: notifications may have been lost.
func (h *Hub) resync() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, chans := range h.subs {
		for ch := range chans {
			wake(ch)
		}
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // a wake-up is already pending
	}
}
