package loadbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
	"github.com/wsproxy/wsproxy/workspace"
)

// Writes is make bench-writes: workspace writes per second beside a plain durable write, at
// several numbers of concurrent writers, each on a thread of its own, in one run, interleaved
// over rounds (docs/scaling.md, BENCHMARKS.md). Its rows:
//
//   - plain insert: a one-row INSERT per transaction, durable (the server's synchronous_commit),
//     from a pool of one connection a writer: what the database does for any durable write;
//   - user edits: PATCH …/preferences/1 with a new subtitle (the admin REST: one durable
//     transaction, its event included) through wsproxy A;
//   - tool rounds: a thread turn through wsproxy A whose model (the fake, in this process) answers
//     its first round with update_preferences of a new subtitle, then with text: a turn's start,
//     its durable tool call with its event, and two exchanges with the model;
//   - in-process edits (Floor): the user edits' writes through the workspace package in this
//     process, without HTTP: the least the database and the domain do for them.
//
// wsproxy A and B are started for each number of writers with a pool of one connection a writer
// (pool_max_conns); B holds an event stream on each writer's thread, and the delay from each
// event's time (its insert, just before its commit) to its arrival on B's stream is the event
// delivery delay. Every write acknowledged must reach B's stream: a write that does not is an
// error of the run.
type Writes struct {
	Wsproxy     string        // the wsproxy binary
	DatabaseURL string        // a durable Postgres (fsync on)
	Writers     []int         // concurrent writers of each row
	Duration    time.Duration // of each row's run
	Rounds      int
	Floor       bool // the in-process edits row
}

// The rows of a run.
const (
	rowPlain   = "plain insert"
	rowEdits   = "user edits (admin REST)"
	rowTools   = "tool rounds (turns)"
	rowInProcs = "in-process edits (floor)"
)

// writesRun is one run: what it started, and what each row measured.
type writesRun struct {
	Writes
	admin *pgxpool.Pool
	// postmaster is the Postgres server's, whose CPU (and its backends') each row is charged.
	postmaster int
	model      string // the fake model's base URL
	client     *http.Client
	// results per row and number of writers: each round's figures.
	results map[string]map[int][]writeResult
	// delays per row and number of writers: every event's, over the rounds.
	delays map[string]map[int][]time.Duration
	seen   map[string]map[int][2]int // events seen on B, writes acknowledged
	// edits numbers the edits: each sets a subtitle no edit set before, so that each changes
	// its preference and writes its event (an edit that changes nothing writes none).
	edits atomic.Int64
}

// writeResult is one row's run.
type writeResult struct {
	rate   float64 // acknowledged writes per second
	failed int
	busy   float64 // the machine's CPU busy share during the run
	// cpu is the CPU time of the work itself per acknowledged write: Postgres's, the wsproxy
	// processes' and this process's (the writers, the streams' readers, the fake model), not
	// what else runs on the machine.
	cpu time.Duration
}

// Run measures and prints.
func (w Writes) Run(ctx context.Context) error {
	if w.DatabaseURL == "" {
		return errors.New("the writes benchmark needs DATABASE_URL, a durable Postgres")
	}
	r := &writesRun{Writes: w, results: map[string]map[int][]writeResult{},
		delays: map[string]map[int][]time.Duration{}, seen: map[string]map[int][2]int{}}
	var err error
	if r.admin, err = pgxpool.New(ctx, w.DatabaseURL); err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer r.admin.Close()
	var fsync, syncCommit string
	if err := r.admin.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&fsync, &syncCommit); err != nil {
		return err
	}
	if _, err := r.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS load_writes_plain (writer integer NOT NULL, n bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("plain insert's table: %w", err)
	}
	if r.postmaster, err = postmasterPID(w.DatabaseURL); err != nil {
		return err
	}
	model, stopModel, err := serveModel()
	if err != nil {
		return err
	}
	defer stopModel()
	r.model = model
	t := &http.Transport{MaxIdleConns: 0, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, DisableCompression: true}
	defer t.CloseIdleConnections()
	r.client = &http.Client{Transport: t}

	fmt.Printf("%d rounds x writers %v, %s each (after a 500ms warm-up); Postgres fsync=%s synchronous_commit=%s\n",
		w.Rounds, w.Writers, w.Duration, fsync, syncCommit)
	for round := 1; round <= w.Rounds; round++ {
		for _, c := range w.Writers {
			if err := r.round(ctx, round, c); err != nil {
				return err
			}
		}
	}
	return r.report()
}

// round runs every row once at c writers: the rows of the database alone, and those through
// wsproxy (A and B started for them, with a pool of c), in one order and the other in turn.
func (r *writesRun) round(ctx context.Context, round, c int) error {
	alone := func() error {
		if err := r.plain(ctx, round, c); err != nil {
			return err
		}
		if r.Floor {
			return r.inProcess(ctx, round, c)
		}
		return nil
	}
	if round%2 == 1 {
		if err := alone(); err != nil {
			return err
		}
		return r.throughWsproxy(ctx, round, c, []string{rowEdits, rowTools})
	}
	if err := r.throughWsproxy(ctx, round, c, []string{rowTools, rowEdits}); err != nil {
		return err
	}
	return alone()
}

// record keeps a row's run and prints it.
func (r *writesRun) record(round, c int, row string, res writeResult) {
	if r.results[row] == nil {
		r.results[row] = map[int][]writeResult{}
	}
	r.results[row][c] = append(r.results[row][c], res)
	fmt.Printf("round %d  c=%-3d %-26s %8.0f writes/s  %7s CPU a write  (%d failed; the machine %3.0f%% busy)\n", round, c, row, res.rate, dur(res.cpu), res.failed, 100*res.busy)
}

// plain runs the plain durable insert at c writers, from a pool of c.
func (r *writesRun) plain(ctx context.Context, round, c int) error {
	pool, err := r.pool(ctx, c, "")
	if err != nil {
		return err
	}
	defer pool.Close()
	insert := func(ctx context.Context, i, k int) error {
		_, err := pool.Exec(ctx, `INSERT INTO load_writes_plain (writer, n) VALUES ($1, $2)`, i, k)
		return err
	}
	res, _ := closedLoop(ctx, c, 500*time.Millisecond, insert) // warm-up
	if res.rate == 0 {
		return errors.New("plain insert: no write succeeded")
	}
	res, _ = r.measure(ctx, c, insert)
	r.record(round, c, rowPlain, res)
	return nil
}

// inProcess runs the user edits through the workspace package in this process, on a schema of
// its own (migrated here), from a pool of c.
func (r *writesRun) inProcess(ctx context.Context, round, c int) error {
	var schema string
	if err := r.admin.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return err
	}
	schema += "_writes_floor"
	if _, err := r.admin.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema); err != nil {
		return err
	}
	pool, err := r.pool(ctx, c, schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := db.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("the floor's schema: %w", err)
	}
	store := workspace.NewStore(pool, workspace.Options{})
	ws := make([]*workspace.Workspace, c)
	for i := range ws {
		ws[i] = store.Workspace(workspace.ThreadID{Name: fmt.Sprintf("floor-%d-%d", c, i)})
		if _, err := ws[i].AddPreference(ctx, workspace.PreferenceInput{Title: "Soil carbon"}); err != nil && !errors.As(err, new(*workspace.DuplicateError)) {
			return fmt.Errorf("seed the floor's threads: %w", err)
		}
	}
	edit := func(ctx context.Context, i, _ int) error {
		s := fmt.Sprintf("edit %d", r.edits.Add(1))
		_, err := ws[i].UpdatePreference(ctx, 1, workspace.PreferencePatch{Subtitle: &s})
		return err
	}
	if res, _ := closedLoop(ctx, c, 500*time.Millisecond, edit); res.rate == 0 {
		return errors.New("in-process edits: no write succeeded")
	}
	res, _ := r.measure(ctx, c, edit)
	r.record(round, c, rowInProcs, res)
	return nil
}

// pool is a pool of c connections on the database, in schema when set, all of them open.
func (r *writesRun) pool(ctx context.Context, c int, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(r.DatabaseURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(c), int32(c)
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	conns := make([]*pgxpool.Conn, 0, c)
	defer func() {
		for _, conn := range conns {
			conn.Release()
		}
	}()
	for range c {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			return nil, err
		}
		conns = append(conns, conn)
	}
	return pool, nil
}

// throughWsproxy starts wsproxy A and B with a pool of c, runs rows through A with a stream of
// each writer's thread open on B, and stops them.
func (r *writesRun) throughWsproxy(ctx context.Context, round, c int, rows []string) error {
	u, err := url.Parse(r.DatabaseURL)
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(c))
	u.RawQuery = q.Encode()
	env := []string{"DATABASE_URL=" + u.String(), "UPSTREAM_BASE_URL=" + r.model + "/v1", "ADMIN_TOKEN=" + adminToken, "LOG_LEVEL=warn"}
	a, cmdA, err := startWsproxy(r.Wsproxy, env...)
	if err != nil {
		return err
	}
	defer stop(cmdA)
	b, cmdB, err := startWsproxy(r.Wsproxy, env...)
	if err != nil {
		return err
	}
	defer stop(cmdB)
	for _, row := range rows {
		if err := r.wsproxyRow(ctx, round, c, row, "http://"+a, "http://"+b, cmdA.Process.Pid, cmdB.Process.Pid); err != nil {
			return err
		}
	}
	return nil
}

// wsproxyRow runs one row through wsproxy A at c writers, each on its thread, with B's streams.
func (r *writesRun) wsproxyRow(ctx context.Context, round, c int, row, a, b string, pids ...int) error {
	prefix := "edit"
	if row == rowTools {
		prefix = "tool"
	}
	threads := make([]string, c)
	for i := range threads {
		threads[i] = fmt.Sprintf("%s-%d-%d", prefix, c, i)
		if err := seed(a, threads[i]); err != nil {
			return err
		}
	}
	body := RequestBody(1024, false)
	write := func(ctx context.Context, i, _ int) error {
		var req *http.Request
		if row == rowEdits {
			req, _ = http.NewRequestWithContext(ctx, "PATCH", a+"/admin/v1/threads/"+threads[i]+"/preferences/1",
				strings.NewReader(fmt.Sprintf(`{"subtitle":"edit %d"}`, r.edits.Add(1))))
			req.Header.Set("Authorization", "Bearer "+adminToken)
		} else {
			req, _ = http.NewRequestWithContext(ctx, "POST", a+chatPath, bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-load")
			req.Header.Set("X-Thread-Id", threads[i])
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := r.client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s", resp.Status)
		}
		return err
	}
	if res, _ := closedLoop(ctx, c, 500*time.Millisecond, write); res.rate == 0 {
		return fmt.Errorf("%s: no write succeeded", row)
	}
	streams, err := r.openStreams(ctx, b, threads)
	if err != nil {
		return err
	}
	res, acked := r.measure(ctx, c, write, pids...)
	seen, delays := streams.wait(acked, 30*time.Second)
	r.record(round, c, row, res)
	if r.delays[row] == nil {
		r.delays[row], r.seen[row] = map[int][]time.Duration{}, map[int][2]int{}
	}
	r.delays[row][c] = append(r.delays[row][c], delays...)
	total := 0
	for _, n := range acked {
		total += n
	}
	s := r.seen[row][c]
	r.seen[row][c] = [2]int{s[0] + seen, s[1] + total}
	if seen < total {
		return fmt.Errorf("%s at %d writers: %d writes acknowledged, %d of their events reached the streams on the other replica within 30 s", row, c, total, seen)
	}
	return nil
}

// measure runs c writers for the run's duration (closedLoop) and charges them the CPU time of
// Postgres, of this process and of pids.
func (r *writesRun) measure(ctx context.Context, c int, write func(ctx context.Context, i, k int) error, pids ...int) (writeResult, []int) {
	ours := func() time.Duration {
		t := postgresCPU(r.postmaster) + procCPU(os.Getpid())
		for _, pid := range pids {
			t += procCPU(pid)
		}
		return t
	}
	before := ours()
	res, ok := closedLoop(ctx, c, r.Duration, write)
	total := 0
	for _, n := range ok {
		total += n
	}
	if total > 0 {
		res.cpu = (ours() - before) / time.Duration(total)
	}
	return res, ok
}

// closedLoop runs n writers for d, each calling write again as soon as it returned (k: its
// k-th call), a call begun before the end running to its end; it returns the rate of the
// successes and the successes of each writer.
func closedLoop(ctx context.Context, n int, d time.Duration, write func(ctx context.Context, i, k int) error) (writeResult, []int) {
	ok := make([]int, n)
	failed := make([]int, n)
	cpu := readCPUTimes()
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for k := 0; time.Now().Before(end) && ctx.Err() == nil; k++ {
				if err := write(context.WithoutCancel(ctx), i, k); err != nil {
					failed[i]++
					continue
				}
				ok[i]++
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	after := readCPUTimes()
	res := writeResult{}
	total := 0
	for i := range n {
		total += ok[i]
		res.failed += failed[i]
	}
	res.rate = float64(total) / elapsed.Seconds()
	if t := after.total - cpu.total; t > 0 {
		res.busy = float64(after.busy-cpu.busy) / float64(t)
	}
	return res, ok
}

// eventStreams are the event streams of a row's threads on replica B.
type eventStreams struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
	mu     sync.Mutex
	got    []int // events received, by writer
	delays []time.Duration
	errs   []error
}

// openStreams opens an event stream of each thread on base (from the thread's latest event on)
// and reads it until wait.
func (r *writesRun) openStreams(ctx context.Context, base string, threads []string) (*eventStreams, error) {
	ctx, cancel := context.WithCancel(ctx)
	s := &eventStreams{cancel: cancel, got: make([]int, len(threads))}
	opened := make(chan error, len(threads))
	for i, t := range threads {
		s.done.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", base+"/admin/v1/threads/"+t+"/events/stream", nil)
			req.Header.Set("Authorization", "Bearer "+adminToken)
			resp, err := r.client.Do(req)
			if err == nil && resp.StatusCode != http.StatusOK {
				resp.Body.Close()
				err = fmt.Errorf("stream of %s: %s", t, resp.Status)
			}
			opened <- err
			if err != nil {
				return
			}
			defer resp.Body.Close()
			rd := bufio.NewReader(resp.Body)
			for {
				line, err := rd.ReadString('\n')
				if err != nil {
					return
				}
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok {
					continue
				}
				now := time.Now()
				var ev struct {
					At time.Time `json:"at"`
				}
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					continue
				}
				s.mu.Lock()
				s.got[i]++
				s.delays = append(s.delays, now.Sub(ev.At))
				s.mu.Unlock()
			}
		})
	}
	for range threads {
		if err := <-opened; err != nil {
			s.cancel()
			s.done.Wait()
			return nil, err
		}
	}
	return s, nil
}

// wait waits until each stream has as many events as its writer's acknowledged writes, or for
// at most limit, closes the streams, and returns the events they got of those and their delays.
func (s *eventStreams) wait(acked []int, limit time.Duration) (int, []time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		all := true
		for i, n := range acked {
			if s.got[i] < n {
				all = false
				break
			}
		}
		s.mu.Unlock()
		if all {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.cancel()
	s.done.Wait()
	seen := 0
	for i, n := range acked {
		seen += min(s.got[i], n)
	}
	return seen, s.delays
}

// serveModel serves the fake model in this process, every turn's first round a workspace call
// of a new subtitle (fake.WorkspaceCall), and returns its base URL and how to stop it.
func serveModel() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: fake.New(fake.Options{ToolRound: true}), ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// report prints the medians over the rounds: writes per second beside the plain insert's, the
// event delivery delays, and the targets of issue #51.
func (r *writesRun) report() error {
	med := func(row string, c int) writeResult {
		rs := r.results[row][c]
		if len(rs) == 0 {
			return writeResult{}
		}
		rates := make([]float64, len(rs))
		busy := make([]float64, len(rs))
		cpu := make([]time.Duration, len(rs))
		for i, x := range rs {
			rates[i], busy[i], cpu[i] = x.rate, x.busy, x.cpu
		}
		slices.Sort(rates)
		slices.Sort(busy)
		slices.Sort(cpu)
		return writeResult{rate: rates[len(rates)/2], busy: busy[len(busy)/2], cpu: cpu[len(cpu)/2]}
	}
	rows := []string{rowPlain, rowEdits, rowTools}
	if r.Floor {
		rows = append(rows, rowInProcs)
	}
	fmt.Printf("\nWrites per second, medians over %d rounds (ratio to the plain insert; the machine's CPU busy)\n", r.Rounds)
	fmt.Printf("%-8s", "writers")
	for _, row := range rows {
		fmt.Printf(" %30s", row)
	}
	fmt.Println()
	for _, c := range r.Writers {
		fmt.Printf("%-8d", c)
		plain := med(rowPlain, c).rate
		for _, row := range rows {
			m := med(row, c)
			fmt.Printf(" %30s", fmt.Sprintf("%.0f (%.2f, %.0f%%)", m.rate, m.rate/plain, 100*m.busy))
		}
		fmt.Println()
	}

	fmt.Printf("\nCPU time of the work per write (Postgres, wsproxy A and B, this process), medians; the ceiling it sets on %d cores\n", runtime.NumCPU())
	fmt.Printf("%-8s", "writers")
	for _, row := range rows {
		fmt.Printf(" %30s", row)
	}
	fmt.Println()
	for _, c := range r.Writers {
		fmt.Printf("%-8d", c)
		for _, row := range rows {
			m := med(row, c)
			ceiling := 0.0
			if m.cpu > 0 {
				ceiling = float64(runtime.NumCPU()) * float64(time.Second) / float64(m.cpu)
			}
			fmt.Printf(" %30s", fmt.Sprintf("%s (%.0f/s)", dur(m.cpu), ceiling))
		}
		fmt.Println()
	}

	fmt.Printf("\nEvent delivery, from the event's time (its insert, before its commit) to its arrival on the other replica's stream\n")
	fmt.Printf("%-8s %36s %36s\n", "writers", rowEdits, rowTools)
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		return d[min(len(d)-1, int(float64(len(d))*p))]
	}
	worst := time.Duration(0)
	for _, c := range r.Writers {
		fmt.Printf("%-8d", c)
		for _, row := range []string{rowEdits, rowTools} {
			d := slices.Clone(r.delays[row][c])
			slices.Sort(d)
			worst = max(worst, pct(d, .99))
			s := r.seen[row][c]
			fmt.Printf(" %36s", fmt.Sprintf("p50 %s p99 %s (%d of %d)", pct(d, .5).Round(time.Millisecond), pct(d, .99).Round(time.Millisecond), s[0], s[1]))
		}
		fmt.Println()
	}

	fmt.Println("\nTargets (#51)")
	if slices.Contains(r.Writers, 32) {
		plain := med(rowPlain, 32).rate
		for _, row := range []string{rowEdits, rowTools} {
			m := med(row, 32).rate
			check(row+" at 32 writers reach at least 80% of the plain insert's writes/s", m >= 0.8*plain,
				fmt.Sprintf("%.0f vs %.0f (%.0f%%)", m, plain, 100*m/plain))
		}
		if slices.Contains(r.Writers, 8) {
			pg := med(rowPlain, 32).rate / med(rowPlain, 8).rate
			for _, row := range []string{rowEdits, rowTools} {
				g := med(row, 32).rate / med(row, 8).rate
				check(row+" grow from 8 to 32 writers as the plain insert does (at least 80% of its growth)", g >= 0.8*pg,
					fmt.Sprintf("x%.2f vs x%.2f", g, pg))
			}
		}
	}
	check("events reach the other replica's streams with a p99 under 1s", worst < time.Second, "worst p99 "+worst.Round(time.Millisecond).String())
	return nil
}
