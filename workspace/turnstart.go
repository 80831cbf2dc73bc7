package workspace

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wsproxy/wsproxy/db"
)

// Batches of turn starts: how many are under way at once, each on a pooled connection of its
// own, and how many turn starts one carries at most (Postgres runs them one after the other, in
// a few milliseconds for 64; their threads stay locked until the batch commits).
const (
	maxTurnStartBatches = 1
	maxTurnStartBatch   = 64
)

// turnStarter begins the turns of concurrent requests together, as group commit does: a turn
// start that finds fewer than maxTurnStartBatches batches under way goes at once, with those
// waiting; the others wait for the next batch, which leaves as soon as one under way is back.
// However many turns start at once, their starts hold at most maxTurnStartBatches pooled
// connections, for one round trip a batch (db.TurnStarts), instead of one connection each: under
// load a round trip lasts as long as the proxy and Postgres take to be scheduled, and the turns
// would wait for the pool in turn. A turn's start waits for at most the batch under way and its
// own; one that starts alone goes at once.
//
// A batch never waits for a thread's row that another transaction holds (an edit, a tool call of
// another turn): that thread's start comes back from it without a turn, and begins its turn on
// its own (startHeld), so that a held row delays its own thread's turns only.
type turnStarter struct {
	pool    *pgxpool.Pool
	timeout time.Duration

	mu      sync.Mutex
	waiting []*pendingStart
	running int                    // batches under way
	held    map[string]*heldThread // threads whose starts wait for their row, by thread
}

// heldThread is a thread whose row another transaction held when one of its turns started.
type heldThread struct {
	token  chan struct{} // of one: held by the start that waits for the row
	starts int           // the thread's starts that have not returned; the entry goes with the last
}

// pendingStart is one turn start: its thread, where its result goes (buffered: the sender never
// waits for a caller that gave up), and who has it: the start's result is handed over once, to
// its caller or, when the caller gave up first, back to the batch's sender, which gives back the
// turn it began (docs/spec.md §2: a turn whose caller answered 503, or went on without its
// workspace, takes no number).
type pendingStart struct {
	ctx   context.Context
	args  db.TurnStartParams
	done  chan startResult
	state atomic.Int32 // startWaiting, then startAnswered (the sender's) or startLeft (the caller's)
}

// The states of a pendingStart's hand-over.
const (
	startWaiting int32 = iota
	startAnswered
	startLeft
)

// answer hands r over to p's caller, and reports false when the caller gave up first (r is then
// the sender's to give back).
func (p *pendingStart) answer(r startResult) bool {
	if !p.state.CompareAndSwap(startWaiting, startAnswered) {
		return false
	}
	p.done <- r
	return true
}

// leave is the caller's giving up: it reports false when the result was handed over first (the
// caller then takes it from done).
func (p *pendingStart) leave() bool {
	return p.state.CompareAndSwap(startWaiting, startLeft)
}

type startResult struct {
	row db.TurnStartRow
	err error
}

// start begins a turn of thread. The caller that starts a batch sends it itself, so that a turn
// starting alone costs no hand-over (but for a bounded caller, whose own deadline comes before
// the batch's time bound: it waits for the batch only until then); the batches that follow go
// from a goroutine of their own. A start of a thread whose row was held waits for it outside the
// batches.
func (s *turnStarter) start(ctx context.Context, args db.TurnStartParams, bounded bool) (db.TurnStartRow, error) {
	p := &pendingStart{ctx: ctx, args: args, done: make(chan startResult, 1)}
	thread := args.ThreadID
	s.mu.Lock()
	if h := s.held[thread]; h != nil { // the row was held a moment ago: no batch waits for it
		h.starts++
		s.mu.Unlock()
		return s.startHeld(ctx, args, h)
	}
	s.waiting = append(s.waiting, p)
	var batch []*pendingStart
	if s.running < maxTurnStartBatches {
		if batch = s.take(); batch != nil {
			s.running++
		}
	}
	s.mu.Unlock()
	switch {
	case batch == nil:
	case bounded:
		// A caller with less time than the batch may take (a turn that would rather go on
		// without its workspace, WORKSPACE_BUDGET) leaves at its deadline, not the batch's.
		go s.sendAll(batch)
	default:
		s.send(batch)
		if next := s.next(); next != nil {
			go s.sendAll(next)
		}
	}
	var r startResult
	select {
	case r = <-p.done:
	case <-ctx.Done():
		if p.leave() {
			return db.TurnStartRow{}, ctx.Err()
		}
		r = <-p.done // answered as it left: the turn is the caller's
	}
	if r.err == nil && r.row.Turn == 0 && r.row.Refused == "" { // the row was held: no turn begun
		return s.startHeld(ctx, args, s.hold(thread))
	}
	return r.row, r.err
}

// hold counts a start of thread, whose row another transaction holds, among its held starts.
func (s *turnStarter) hold(thread string) *heldThread {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.held[thread]
	if h == nil {
		h = &heldThread{token: make(chan struct{}, 1)}
		if s.held == nil {
			s.held = map[string]*heldThread{}
		}
		s.held[thread] = h
	}
	h.starts++
	return h
}

// startHeld begins a turn of a thread whose row another transaction held (or whose parents
// another change was storing), in a statement of its own that waits for them
// (db.TurnStartWaiting: Postgres gives up the wait at ctx's deadline, and a start that failed
// never begins its turn later), one start of the thread at a time: however many of them wait,
// the held row costs one pooled connection, and the batches nothing. A start that Postgres rolled
// back for a race with a change of parents (db.Retryable) is sent again, at most
// maxParentsAttempts times in all.
func (s *turnStarter) startHeld(ctx context.Context, args db.TurnStartParams, h *heldThread) (db.TurnStartRow, error) {
	thread := args.ThreadID
	defer func() {
		s.mu.Lock()
		if h.starts--; h.starts == 0 {
			delete(s.held, thread)
		}
		s.mu.Unlock()
	}()
	select {
	case h.token <- struct{}{}:
		defer func() { <-h.token }()
	case <-ctx.Done():
		return db.TurnStartRow{}, ctx.Err()
	}
	for attempt := 1; ; attempt++ {
		row, err := db.TurnStartWaiting(ctx, s.pool, args)
		if attempt == maxParentsAttempts || !db.Retryable(err) {
			return row, err
		}
	}
}

// next takes the turn starts that waited while a batch was under way, or ends the batch's turn
// of sending when none did.
func (s *turnStarter) next() []*pendingStart {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch := s.take()
	if batch == nil {
		s.running--
	}
	return batch
}

// take takes the next batch off the waiting list, first come first, but for turn starts whose
// callers gave up (the client left, or the operation's time ran out). The caller holds mu.
func (s *turnStarter) take() []*pendingStart {
	var batch []*pendingStart
	n := 0
	for ; n < len(s.waiting) && len(batch) < maxTurnStartBatch; n++ {
		if p := s.waiting[n]; p.ctx.Err() == nil {
			batch = append(batch, p)
		}
	}
	if s.waiting = s.waiting[n:]; len(s.waiting) == 0 {
		s.waiting = nil
	}
	return batch
}

// sendAll sends batch, then the turn starts that waited meanwhile, until none did.
func (s *turnStarter) sendAll(batch []*pendingStart) {
	for ; batch != nil; batch = s.next() {
		s.send(batch)
	}
}

// send begins the batch's turns in one round trip, bounded by the store's timeout; its context
// is the first turn's, without its cancellation (the others' starts go on when that client
// leaves), so that a trace shows the batch below that turn. The turn starts whose callers gave
// up while the batch waited for its connection are left out: they begin no turn. Those whose
// callers gave up while it ran get their turns given back once it committed (giveBack): those
// callers answered without a turn.
func (s *turnStarter) send(batch []*pendingStart) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), s.timeout)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		for _, p := range batch {
			p.answer(startResult{err: err})
		}
		return
	}
	defer conn.Release()
	batch = slices.DeleteFunc(batch, func(p *pendingStart) bool { return p.ctx.Err() != nil })
	if len(batch) == 0 {
		return
	}
	starts := make([]db.TurnStartParams, 0, len(batch))
	for _, p := range batch {
		starts = append(starts, p.args)
	}
	rows, err := db.TurnStarts(ctx, conn, starts)
	var left []db.TurnUndoParams // the turns begun for callers that gave up
	for i, p := range batch {
		if err != nil {
			p.answer(startResult{err: err})
			continue
		}
		if !p.answer(startResult{row: rows[i]}) && rows[i].Turn > 0 {
			left = append(left, db.TurnUndoParams{ThreadID: p.args.ThreadID, Turn: rows[i].Turn, CreatedAt: rows[i].CreatedAt})
		}
	}
	if len(left) > 0 {
		go s.giveBack(context.WithoutCancel(batch[0].ctx), left)
	}
}

// giveBack gives back the turns of starts whose callers gave up while their batch ran, on a
// connection of its own (an undo waits for its thread's row, which the next batch must not), each
// thread's later turn first. A failure leaves those turns counted, as a crash before it would: a
// number and a snapshot of the workspace as it stood, nothing of anyone's workspace.
func (s *turnStarter) giveBack(ctx context.Context, left []db.TurnUndoParams) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_ = db.TurnUndos(ctx, s.pool, left)
}
