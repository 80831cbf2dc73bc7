package proxy

import (
	"context"
	"crypto/rand"
	"log/slog"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/workspace"
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
// end while a write is under way or within usageInterval after it wait for the next write. Its
// batches are numbered (under an id of its own), and a failed write is sent again as it was —
// the same number, the same usage — until it succeeds, so that a batch whose answer was lost
// after it committed counts once (workspace.Store.AddUsage); what came meanwhile goes in the next.
// Its goroutine runs only while there is usage to write.
type usageWriter struct {
	store *workspace.Store
	log   *slog.Logger
	id    string // the writer's id in its batches

	mu       sync.Mutex
	pending  map[workspace.ThreadID]workspace.Usage
	number   int64         // the last batch's number
	running  bool          // a goroutine is writing
	closing  chan struct{} // closed by close: write what is left at once, then stop
	closeOne sync.Once
	wg       sync.WaitGroup

	// pendingSince is when the oldest usage of pending was queued, batchSince that of the batch
	// being written (zero while there is none): what lag reports. Under mu.
	pendingSince, batchSince time.Time
}

func newUsageWriter(store *workspace.Store, log *slog.Logger) *usageWriter {
	return &usageWriter{store: store, log: log, id: rand.Text(), pending: map[workspace.ThreadID]workspace.Usage{}, closing: make(chan struct{})}
}

// add queues a turn's usage. Once close was called it counts nothing (the caller's turns have
// ended before it).
func (u *usageWriter) add(id workspace.ThreadID, usage workspace.Usage) {
	if usage == (workspace.Usage{}) {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.isClosing() {
		u.log.LogAttrs(context.Background(), slog.LevelError, "a turn's usage lost: it ended after the usage writer stopped",
			slog.String("thread", id.String()))
		return
	}
	if len(u.pending) == 0 {
		u.pendingSince = time.Now()
	}
	addTo(u.pending, id, usage)
	if !u.running {
		u.running = true
		u.wg.Go(u.run) // under mu: before close's Wait
	}
}

// addTo adds usage to id's sum in m.
func addTo(m map[workspace.ThreadID]workspace.Usage, id workspace.ThreadID, usage workspace.Usage) {
	sum := m[id]
	sum.Add(usage)
	m[id] = sum
}

// run writes the pending usage until there is none, at most once per usageInterval (backing off
// while writes fail).
func (u *usageWriter) run() {
	wait := usageInterval
	var batch workspace.UsageBatch // the batch being written, kept as it is until it is
	for {
		u.mu.Lock()
		if batch.Usage == nil {
			if len(u.pending) == 0 {
				u.running = false
				u.mu.Unlock()
				return
			}
			u.number++
			batch = workspace.UsageBatch{Writer: u.id, Number: u.number, Usage: u.pending}
			u.pending = map[workspace.ThreadID]workspace.Usage{}
			u.batchSince, u.pendingSince = u.pendingSince, time.Time{}
		}
		u.mu.Unlock()

		closing := u.isClosing()
		err := u.store.AddUsage(context.Background(), batch)
		switch {
		case err == nil:
			wait = usageInterval
			batch = workspace.UsageBatch{}
			u.written()
		case closing:
			u.log.LogAttrs(context.Background(), slog.LevelError, "turns' usage lost at shutdown", slog.Int("threads", len(batch.Usage)), slog.Any("err", err))
			batch = workspace.UsageBatch{}
			u.written()
		default:
			wait = min(wait*2, maxUsageBackoff)
			u.log.LogAttrs(context.Background(), slog.LevelWarn, "turns' usage not written yet; retrying", slog.Int("threads", len(batch.Usage)),
				slog.Duration("wait", wait), slog.Any("err", err))
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

// written notes that the batch being written is gone (written, or lost at shutdown).
func (u *usageWriter) written() {
	u.mu.Lock()
	u.batchSince = time.Time{}
	u.mu.Unlock()
}

// lag is how long the oldest usage not yet written has waited: 0 when all is written. It grows
// while Postgres refuses the writes (wsproxy_usage_lag_seconds).
func (u *usageWriter) lag() time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	since := u.batchSince
	if since.IsZero() {
		since = u.pendingSince
	}
	if since.IsZero() {
		return 0
	}
	return time.Since(since)
}

func (u *usageWriter) isClosing() bool {
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
	u.closeOne.Do(func() {
		u.mu.Lock() // add keeps nothing more once it is closed
		close(u.closing)
		u.mu.Unlock()
	})
	u.wg.Wait()
}
