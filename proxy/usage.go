package proxy

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/tools"
)

// usageInterval is how often at most the usage writer writes: the usage of the turns that end
// within one interval goes to Postgres together, one statement per thread, however many turns
// the thread had.
const usageInterval = 100 * time.Millisecond

// maxUsageBackoff bounds the wait between attempts while Postgres refuses the usage.
const maxUsageBackoff = 5 * time.Second

// usageWriter adds the turns' usage to their threads' totals in the background: neither a turn's
// answer nor the client's next request waits for it, and a thread's many turns cost one
// statement per interval. The first turn after a quiet spell is written at once; the turns that
// end while a write is under way or within usageInterval after it wait for the next write. A
// failed write keeps its usage for the next attempt. Its goroutine runs only while there is
// usage to write.
type usageWriter struct {
	store *tools.Store
	log   *slog.Logger

	mu       sync.Mutex
	pending  map[tools.ThreadID]tools.Usage
	running  bool          // a goroutine is writing
	closing  chan struct{} // closed by close: write what is left at once, then stop
	closeOne sync.Once
	wg       sync.WaitGroup
}

func newUsageWriter(store *tools.Store, log *slog.Logger) *usageWriter {
	return &usageWriter{store: store, log: log, pending: map[tools.ThreadID]tools.Usage{}, closing: make(chan struct{})}
}

// add queues a turn's usage.
func (u *usageWriter) add(id tools.ThreadID, usage tools.Usage) {
	if usage == (tools.Usage{}) {
		return
	}
	u.mu.Lock()
	addTo(u.pending, id, usage)
	start := !u.running
	u.running = true
	u.mu.Unlock()
	if start {
		u.wg.Go(u.run)
	}
}

// addTo adds usage to id's sum in m.
func addTo(m map[tools.ThreadID]tools.Usage, id tools.ThreadID, usage tools.Usage) {
	sum := m[id]
	sum.Add(usage)
	m[id] = sum
}

// run writes the pending usage until there is none, at most once per usageInterval (backing off
// while writes fail).
func (u *usageWriter) run() {
	wait := usageInterval
	for {
		u.mu.Lock()
		batch := u.pending
		if len(batch) == 0 {
			u.running = false
			u.mu.Unlock()
			return
		}
		u.pending = map[tools.ThreadID]tools.Usage{}
		u.mu.Unlock()

		closing := u.closed()
		err := u.store.AddUsage(context.Background(), batch)
		switch {
		case err == nil:
			wait = usageInterval
		case closing:
			u.log.LogAttrs(context.Background(), slog.LevelError, "turns' usage lost at shutdown", slog.Int("threads", len(batch)), slog.Any("err", err))
		default:
			wait = min(wait*2, maxUsageBackoff)
			u.log.LogAttrs(context.Background(), slog.LevelWarn, "turns' usage not written yet; retrying", slog.Int("threads", len(batch)),
				slog.Duration("wait", wait), slog.Any("err", err))
			u.mu.Lock()
			for id, usage := range batch {
				addTo(u.pending, id, usage)
			}
			u.mu.Unlock()
		}
		if !closing {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-u.closing:
				timer.Stop()
			}
		}
	}
}

func (u *usageWriter) closed() bool {
	select {
	case <-u.closing:
		return true
	default:
		return false
	}
}

// close writes what is pending at once (one attempt) and waits for the writer to stop. Call it
// once no turn can end any more.
func (u *usageWriter) close() {
	u.closeOne.Do(func() { close(u.closing) })
	u.wg.Wait()
}
