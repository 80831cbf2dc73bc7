package admin

import "sync"

// eventHub tells a replica's open event streams (docs/spec.md §13) that their thread has new events:
// Postgres notifies every replica of each commit (tools.ListenEvents), and the hub wakes the
// streams of that thread, which then read what is new. A wake-up carries no data, so a stream
// that misses one (its buffer holds one) still reads everything at the next.
type eventHub struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]bool // by thread (stored form)
}

func newEventHub() *eventHub { return &eventHub{subs: map[string]map[chan struct{}]bool{}} }

// subscribe returns the wake-ups of thread's streams, and the function that ends the subscription.
func (h *eventHub) subscribe(thread string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[thread] == nil {
		h.subs[thread] = map[chan struct{}]bool{}
	}
	h.subs[thread][ch] = true
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[thread], ch)
		if len(h.subs[thread]) == 0 {
			delete(h.subs, thread)
		}
		h.mu.Unlock()
	}
}

// changed wakes the streams of thread: it has new events.
func (h *eventHub) changed(thread string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[thread] {
		wake(ch)
	}
}

// resync wakes every stream: notifications may have been lost.
func (h *eventHub) resync() {
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
