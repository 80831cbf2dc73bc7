package loadbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// Failover is make failover: two local clusters with streaming replication (synchronous or
// not), two wsproxy instances whose DATABASE_URL names both hosts with
// target_session_attrs=read-write, mixed traffic (thread turns with a tool round, streamed and
// not, the user's edits, an event stream per instance followed with Last-Event-ID), and Faults
// times the primary stopped hard (pg_ctl stop -m immediate) and the standby promoted; between
// two faults the old primary is rebuilt as a standby of the new one (pg_basebackup). Per fault
// it prints the turns failed, the longest time to a client's first good turn after it, the
// acknowledged writes missing afterwards (a tool call is acknowledged when its result reached
// the model; a user's edit when its 201 reached the user), the writes stored twice, and whether
// the event streams resumed without a gap.
type Failover struct {
	Wsproxy     string
	Synchronous bool
	Clients     int
	Faults      int
	Between     time.Duration // traffic before the first fault and after each one's recovery
	Dir         string        // work folder ("" is a temporary one, removed after)
	// Lag, when set, holds the primary's WAL sender (SIGSTOP) for Lag before each fault, until
	// the primary is stopped: a standby that far behind, as a slow network or a busy standby
	// leaves it. With asynchronous replication the primary's commits of that time are
	// acknowledged and never reach the standby; with synchronous replication they wait for it.
	Lag time.Duration
}

// outcome is one request of the run.
type outcome struct {
	client     int
	start, end time.Time
	ok         bool
	what       string // what a failed one got
}

// streamEvent is an event a live stream received.
type streamEvent struct {
	id       int64
	key      string // its kind and time: tells an event from another that took its id
	at, recv time.Time
}

// failoverRun is one run: its clusters, instances, clients, what they saw.
type failoverRun struct {
	f        Failover
	up       *soakModel
	bases    []string
	client   *http.Client
	mu       sync.Mutex
	outcomes []outcome
	userAck  map[string]time.Time // titles the user's POST got 201 for
	threads  map[string]bool
	streams  [][]streamEvent // per instance
	resumes  []int           // per instance: reconnections with Last-Event-ID
	seq      atomic.Int64
}

// faultReport is what one fault did.
type faultReport struct {
	at                      time.Time
	promoted                time.Duration // from the stop to the standby promoted
	failed, total           int
	failures                map[string]int // what the failed requests got
	firstGood               time.Duration  // the longest, over the clients, to their first good turn
	missingCalls, missingUs int            // acknowledged tool calls, user edits missing
	eventDelay              time.Duration  // the longest from an event's commit to a stream, after recovery
}

const watchedThread = "failover-watched"

// Run runs the failover and prints its report.
func (f Failover) Run(ctx context.Context) error {
	if f.Faults < 1 || f.Clients < 1 {
		return errors.New("failover: -faults and -c must be at least 1")
	}
	dir := f.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "wsproxy-failover.")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	env, err := newPGEnv(dir)
	if err != nil {
		return err
	}
	ports := make([]int, 2)
	for i := range ports {
		a, err := freeAddr()
		if err != nil {
			return err
		}
		ports[i], _ = strconv.Atoi(a[strings.LastIndex(a, ":")+1:])
	}
	primary, standby := &pgCluster{env: env, name: "a", port: ports[0]}, &pgCluster{env: env, name: "b", port: ports[1]}
	defer func() {
		for _, c := range []*pgCluster{primary, standby} {
			if c.running() {
				_ = c.stop("fast")
			}
		}
	}()
	mode := "asynchronous"
	if f.Synchronous {
		mode = "synchronous"
	}
	fmt.Printf("failover (%s replication): clusters on 127.0.0.1:%d and :%d in %s\n", mode, ports[0], ports[1], dir)
	if err := primary.initPrimary(); err != nil {
		return err
	}
	if err := primary.start(); err != nil {
		return err
	}
	if err := f.addStandby(ctx, primary, standby); err != nil {
		return err
	}

	r := &failoverRun{f: f, up: newSoakModel(fake.Faults{}), client: &http.Client{Timeout: 30 * time.Second},
		userAck: map[string]time.Time{}, threads: map[string]bool{watchedThread: true}}
	upAddr, err := freeAddr()
	if err != nil {
		return err
	}
	upSrv := newSoakServer(r.up)
	upSrv.Addr = upAddr
	go func() { _ = upSrv.ListenAndServe() }()
	defer upSrv.Close()
	dbURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2", ports[0], ports[1])
	for range 2 {
		addr, cmd, err := startWsproxy(f.Wsproxy, "DATABASE_URL="+dbURL, "UPSTREAM_BASE_URL=http://"+upAddr+"/v1",
			"ADMIN_TOKEN="+adminToken, "LOG_LEVEL=error", "UPSTREAM_TIMEOUT=5s", "DATABASE_TIMEOUT=3s", "DATABASE_WAIT=60s")
		if err != nil {
			return err
		}
		defer stop(cmd)
		r.bases = append(r.bases, "http://"+addr)
	}
	if code := r.admin(r.bases[0], "POST", "/admin/v1/threads/"+watchedThread+"/preferences", `{"title":"watched"}`); code != 201 {
		return fmt.Errorf("seed the watched thread: %d", code)
	}
	r.streams, r.resumes = make([][]streamEvent, len(r.bases)), make([]int, len(r.bases))

	streamCtx, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg, streams sync.WaitGroup
	for i := range r.bases {
		streams.Go(func() { r.follow(streamCtx, i) })
	}
	for c := range f.Clients {
		wg.Go(func() { r.drive(ctx, c) })
	}

	var faults []*faultReport
	err = func() error {
		if !sleepCtx(ctx, f.Between) {
			return ctx.Err()
		}
		for k := range f.Faults {
			var sender int
			if f.Lag > 0 {
				if sender, err = primary.walSender(ctx); err != nil {
					return err
				}
				if err := syscall.Kill(sender, syscall.SIGSTOP); err != nil {
					return fmt.Errorf("hold the WAL sender: %w", err)
				}
				fmt.Printf("fault %d: the primary's WAL sender held for %v\n", k+1, f.Lag)
				if !sleepCtx(ctx, f.Lag) {
					_ = syscall.Kill(sender, syscall.SIGCONT)
					return ctx.Err()
				}
			}
			if f.Lag > 0 {
				fmt.Printf("  %s\n", primary.behind(ctx))
			}
			fr := &faultReport{at: time.Now()}
			faults = append(faults, fr)
			fmt.Printf("fault %d: the primary (%s) stopped hard, the standby (%s) promoted\n", k+1, primary.name, standby.name)
			if err := primary.crash(sender); err != nil {
				return err
			}
			if err := standby.promote(); err != nil {
				return err
			}
			fr.promoted = time.Since(fr.at)
			primary, standby = standby, primary
			if err := r.waitRecovered(ctx, fr.at); err != nil {
				return err
			}
			if k+1 < f.Faults {
				fmt.Printf("  rebuilding %s as a standby of %s\n", standby.name, primary.name)
				if err := f.addStandby(ctx, primary, standby); err != nil {
					return err
				}
			}
			if !sleepCtx(ctx, f.Between) {
				return ctx.Err()
			}
		}
		return nil
	}()
	cancel()
	wg.Wait()
	if err == nil {
		err = r.caughtUp(streamCtx)
	}
	stopStreams()
	streams.Wait()
	if err != nil {
		return err
	}
	return r.report(faults)
}

// addStandby makes standby a streaming standby of primary and waits until it streams; with
// synchronous replication, the primary then waits for it at every commit.
func (f Failover) addStandby(ctx context.Context, primary, standby *pgCluster) error {
	if err := standby.initStandby(primary); err != nil {
		return err
	}
	if err := standby.start(); err != nil {
		return err
	}
	if err := primary.waitStandby(ctx, false); err != nil {
		return err
	}
	if !f.Synchronous {
		return nil
	}
	if err := primary.setSynchronous(ctx, true); err != nil {
		return err
	}
	return primary.waitStandby(ctx, true)
}

// waitRecovered waits until every client had a good turn that started after the fault (for
// two minutes at most).
func (r *failoverRun) waitRecovered(ctx context.Context, at time.Time) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		good := map[int]bool{}
		r.mu.Lock()
		for _, o := range r.outcomes {
			if o.ok && !o.start.Before(at) {
				good[o.client] = true
			}
		}
		r.mu.Unlock()
		if len(good) == r.f.Clients {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d clients had no good turn 2 minutes after the fault", r.f.Clients-len(good), r.f.Clients)
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// drive is one client: thread turns (a new preference each, half of them streamed) on its own
// threads, the user's additions there, and, for client 0, the user's locks and unlocks of the
// watched thread's preference (the events the streams follow). A failed request is not retried:
// each attempt writes a title of its own, so a title stored twice is a write wsproxy repeated.
func (r *failoverRun) drive(ctx context.Context, c int) {
	for n := 0; ctx.Err() == nil; n++ {
		thread := fmt.Sprintf("failover-%d-%d", c, n/40) // a fresh thread before the 100-preference limit
		r.mu.Lock()
		r.threads[thread] = true
		r.mu.Unlock()
		base := r.bases[n%len(r.bases)]
		title := fmt.Sprintf("%s write %d", thread, r.seq.Add(1))
		start := time.Now()
		var ok bool
		var what string
		switch x := rand.IntN(8); {
		case c == 0 && x < 3:
			code := r.admin(base, "PATCH", "/admin/v1/threads/"+watchedThread+"/preferences/1", fmt.Sprintf(`{"locked":%t}`, n%2 == 0))
			ok, what = code == 200, fmt.Sprintf("user edit %d", code)
		case x < 6:
			stream := x >= 3
			code, body := r.post(ctx, base, thread, turnBody(title, stream))
			ok, what = code == 200 && !stream, fmt.Sprintf("turn %d", code)
			if stream && code == 200 {
				ok = strings.HasSuffix(body, "data: [DONE]\n\n") && !strings.Contains(body, `data: {"error"`)
				what = "stream's error event"
			}
		default:
			code := r.admin(base, "POST", "/admin/v1/threads/"+thread+"/preferences", fmt.Sprintf(`{"title":%q}`, title))
			ok, what = code == 201, fmt.Sprintf("user edit %d", code)
			if ok {
				r.mu.Lock()
				r.userAck[title] = time.Now()
				r.mu.Unlock()
			}
		}
		r.mu.Lock()
		if ctx.Err() == nil || ok {
			r.outcomes = append(r.outcomes, outcome{client: c, start: start, end: time.Now(), ok: ok, what: what})
		}
		r.mu.Unlock()
		if !ok {
			sleepCtx(ctx, 50*time.Millisecond) // a client's backoff
		}
	}
}

func (r *failoverRun) post(ctx context.Context, base, thread, body string) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Thread-Id", thread)
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *failoverRun) admin(base, method, path, body string) int {
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := r.client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// follow keeps an event stream of the watched thread open on instance i, coming back with
// Last-Event-ID whenever it ends, until ctx ends.
func (r *failoverRun) follow(ctx context.Context, i int) {
	var last int64
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			r.mu.Lock()
			r.resumes[i]++
			r.mu.Unlock()
			sleepCtx(ctx, 100*time.Millisecond)
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", r.bases[i]+"/admin/v1/threads/"+watchedThread+"/events/stream", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		if last > 0 {
			req.Header.Set("Last-Event-ID", strconv.FormatInt(last, 10))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		if resp.StatusCode != 200 {
			resp.Body.Close()
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		var id int64
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				id, _ = strconv.ParseInt(strings.TrimPrefix(line, "id: "), 10, 64)
			case strings.HasPrefix(line, "data: ") && id > 0:
				var e struct {
					At   time.Time `json:"at"`
					Kind string    `json:"kind"`
				}
				_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &e)
				r.mu.Lock()
				r.streams[i] = append(r.streams[i], streamEvent{id: id, key: e.Kind + " " + e.At.Format(time.RFC3339Nano), at: e.At, recv: time.Now()})
				r.mu.Unlock()
				last, id = id, 0
			}
		}
		resp.Body.Close()
	}
}

// events are the watched thread's events as the database holds them, oldest first: each id
// with its key (streamEvent.key).
func (r *failoverRun) events() ([]int64, map[int64]string, error) {
	var ids []int64
	keys := map[int64]string{}
	for after := int64(0); ; {
		var page struct {
			Data []struct {
				ID   int64     `json:"id"`
				Kind string    `json:"kind"`
				At   time.Time `json:"at"`
			} `json:"data"`
			HasMore bool `json:"has_more"`
		}
		code, body := r.get(r.bases[0], fmt.Sprintf("/admin/v1/threads/%s/events?limit=500&after=%d", watchedThread, after))
		if code != 200 || json.Unmarshal(body, &page) != nil {
			return nil, nil, fmt.Errorf("read the watched thread's events: %d %s", code, body)
		}
		for _, e := range page.Data {
			ids = append(ids, e.ID)
			keys[e.ID] = e.Kind + " " + e.At.Format(time.RFC3339Nano)
			after = e.ID
		}
		if !page.HasMore || len(page.Data) == 0 {
			return ids, keys, nil
		}
	}
}

// caughtUp waits, once the traffic stopped, until every stream has the thread's last event
// (for 30 s at most: past that the report shows where each stopped).
func (r *failoverRun) caughtUp(ctx context.Context) error {
	ids, _, err := r.events()
	if err != nil || len(ids) == 0 {
		return err
	}
	last := ids[len(ids)-1]
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		done := true
		r.mu.Lock()
		for _, evs := range r.streams {
			if len(evs) == 0 || evs[len(evs)-1].id < last {
				done = false
			}
		}
		r.mu.Unlock()
		if done || !sleepCtx(ctx, 50*time.Millisecond) {
			break
		}
	}
	return ctx.Err()
}

// report reads what the database holds (through the last instance, on the last primary) and
// prints the figures of each fault; it fails when an acknowledged write is missing with
// synchronous replication, or a write is stored twice, or a stream has a gap.
func (r *failoverRun) report(faults []*faultReport) error {
	stored := map[string]int{}
	for thread := range r.threads {
		var d struct {
			Preferences []struct {
				Title string `json:"title"`
			} `json:"preferences"`
		}
		code, body := r.get(r.bases[len(r.bases)-1], "/admin/v1/threads/"+thread)
		if code == 404 {
			continue
		}
		if code != 200 || json.Unmarshal(body, &d) != nil {
			return fmt.Errorf("read thread %s: %d %s", thread, code, body)
		}
		for _, p := range d.Preferences {
			stored[p.Title]++
		}
	}
	events, keys, err := r.events()
	if err != nil {
		return err
	}
	// The fault a write acknowledged at t was lost in: the nearest (its commit may precede the
	// fault and its acknowledgement follow it); none past faultReach.
	const faultReach = 5 * time.Second
	faultOf := func(t time.Time) int {
		k, best := -1, faultReach
		for j, fr := range faults {
			if d := max(t.Sub(fr.at), fr.at.Sub(t)); d <= best {
				k, best = j, d
			}
		}
		return k
	}
	var unattributed int
	for title, at := range r.up.reportedTitles() {
		if stored[title] == 0 {
			if k := faultOf(at); k >= 0 {
				faults[k].missingCalls++
			} else {
				unattributed++
			}
		}
	}
	for title, at := range r.userAck {
		if stored[title] == 0 {
			if k := faultOf(at); k >= 0 {
				faults[k].missingUs++
			} else {
				unattributed++
			}
		}
	}
	duplicated := 0
	for _, n := range stored {
		if n > 1 {
			duplicated++
		}
	}
	// A request counts for the last fault before its end: one in flight at a fault is that
	// fault's.
	var before struct {
		ok, failed int
		failures   map[string]int
	}
	before.failures = map[string]int{}
	for _, o := range r.outcomes {
		k := -1
		for j, fr := range faults {
			if !o.end.Before(fr.at) {
				k = j
			}
		}
		if k < 0 {
			if o.ok {
				before.ok++
			} else {
				before.failed++
				before.failures[o.what]++
			}
			continue
		}
		fr := faults[k]
		fr.total++
		if !o.ok {
			fr.failed++
			if fr.failures == nil {
				fr.failures = map[string]int{}
			}
			fr.failures[o.what]++
		}
	}
	for _, fr := range faults {
		first := map[int]time.Duration{}
		for _, o := range r.outcomes {
			if o.ok && !o.start.Before(fr.at) {
				if d, seen := first[o.client]; !seen || o.end.Sub(fr.at) < d {
					first[o.client] = o.end.Sub(fr.at)
				}
			}
		}
		for _, d := range first {
			fr.firstGood = max(fr.firstGood, d)
		}
	}
	// The streams: every event of the watched thread reached each, in order, once; after each
	// fault's recovery, how long an event took from its commit to the stream.
	var gaps []string
	for i, evs := range r.streams {
		got := map[int64]int{}
		var prev, firstID int64
		if len(evs) > 0 {
			firstID = evs[0].id // the stream opened after the events before it
		}
		replaced := 0
		for _, e := range evs {
			got[e.id]++
			if keys[e.id] != e.key {
				replaced++
			}
			if e.id <= prev {
				gaps = append(gaps, fmt.Sprintf("instance %d: event %d after %d", i+1, e.id, prev))
			}
			prev = e.id
			for k, fr := range faults {
				if e.at.After(fr.at.Add(fr.firstGood)) && (k+1 == len(faults) || e.at.Before(faults[k+1].at)) {
					fr.eventDelay = max(fr.eventDelay, e.recv.Sub(e.at))
				}
			}
		}
		var missed []string
		for _, id := range events {
			if got[id] == 0 && id > firstID && id <= prev {
				missed = append(missed, fmt.Sprintf("%d (%s)", id, keys[id]))
			}
		}
		if len(missed) > 0 {
			gaps = append(gaps, fmt.Sprintf("instance %d: events missed: %s", i+1, strings.Join(missed, ", ")))
		}
		if replaced > 0 {
			gaps = append(gaps, fmt.Sprintf("instance %d: %d events streamed that the new primary does not have (lost in the failover; their ids taken again)", i+1, replaced))
		}
		if prev < events[len(events)-1] {
			gaps = append(gaps, fmt.Sprintf("instance %d: the stream stopped at event %d of %d", i+1, prev, events[len(events)-1]))
		}
	}

	mode := "asynchronous"
	if r.f.Synchronous {
		mode = "synchronous"
	}
	mode += " replication"
	if r.f.Lag > 0 {
		mode += fmt.Sprintf(", the WAL sender held %v before each fault", r.f.Lag)
	}
	fmt.Printf("failover, %s: %d clients on 2 instances, %d requests (turns with a tool round, streamed and not; the user's edits), %d faults\n",
		mode, r.f.Clients, len(r.outcomes), len(faults))
	fmt.Printf("  before the first fault: %d good, %d failed %v\n", before.ok, before.failed, before.failures)
	for k, fr := range faults {
		fmt.Printf("  fault %d: promoted in %v; %d of %d requests failed until the next fault %v; the longest to a client's first good request: %v; "+
			"acknowledged tool calls missing: %d, acknowledged user edits missing: %d; longest from an event's commit to the streams after recovery: %v\n",
			k+1, fr.promoted.Round(time.Millisecond), fr.failed, fr.total, fr.failures, fr.firstGood.Round(time.Millisecond), fr.missingCalls, fr.missingUs,
			fr.eventDelay.Round(time.Millisecond))
	}
	fmt.Printf("  acknowledged tool calls: %d, user edits: %d; written twice: %d; missing and acknowledged more than 5s from a fault: %d\n",
		len(r.up.reportedTitles()), len(r.userAck), duplicated, unattributed)
	fmt.Printf("  event streams: %d events of the watched thread, %v reconnections with Last-Event-ID per instance; ", len(events), r.resumes)
	if len(gaps) == 0 {
		fmt.Println("resumed without a gap")
	} else {
		fmt.Printf("GAPS: %s\n", strings.Join(gaps, "; "))
	}
	var problems []string
	if duplicated > 0 || unattributed > 0 {
		problems = append(problems, "writes stored twice or lost outside a fault")
	}
	for _, fr := range faults {
		// Woken by its replica's hub, a stream has an event within EVENTS_POLL_INTERVAL; without
		// it, at the stream's heartbeat (15 s).
		if fr.eventDelay > 10*time.Second {
			problems = append(problems, fmt.Sprintf("an event took %v to reach the streams after a fault: the event hub's reads did not follow the promotion", fr.eventDelay.Round(time.Millisecond)))
			break
		}
	}
	if r.f.Synchronous {
		for _, fr := range faults {
			if fr.missingCalls+fr.missingUs > 0 {
				problems = append(problems, "acknowledged writes missing with synchronous replication")
				break
			}
		}
		if len(gaps) > 0 {
			problems = append(problems, "an event stream has a gap")
		}
	}
	if len(problems) > 0 {
		return errors.New("failover: " + strings.Join(problems, "; "))
	}
	return nil
}

func (r *failoverRun) get(base, path string) (int, []byte) {
	req, _ := http.NewRequest("GET", base+path, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
