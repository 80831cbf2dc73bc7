package loadbench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// The latency table (make bench-latency): streamed turns against a model upstream with a hosted
// model's timing, at a given number of concurrent streams, open-loop, each through the bare
// httputil.ReverseProxy and through wsproxy at the same load.

// latencyScenario is one kind of row.
type latencyScenario struct {
	name   string
	target string // targetDirect, targetBare or targetWsproxy
	thread bool   // a thread turn (X-Thread-Id)
	// tool: the model's first round is a workspace call. wsproxy runs it and sends the second
	// round itself; a client of the model upstream or of the bare proxy sends that round
	// itself, as a client running its own tool would.
	tool bool
	// bin, when set, is the wsproxy binary of the row (-before); else -wsproxy's.
	bin string
}

const (
	targetDirect  = "direct"
	targetBare    = "bare"
	targetWsproxy = "wsproxy"
)

var latencyScenarios = []latencyScenario{
	{name: "direct", target: targetDirect},
	{name: "bare proxy", target: targetBare},
	{name: "wsproxy pass-through", target: targetWsproxy},
	{name: "wsproxy thread turn", target: targetWsproxy, thread: true},
	{name: "direct, tool round", target: targetDirect, tool: true},
	{name: "bare proxy, tool round", target: targetBare, tool: true},
	{name: "wsproxy one tool round", target: targetWsproxy, thread: true, tool: true},
}

// Latency is the latency table of make bench-latency: streamed turns at a model's pace,
// open-loop at each number of concurrent streams, directly, through the bare proxy and through
// wsproxy (pass-through, a thread turn, one tool round), each row a fresh proxy; it prints each
// row as it ends, then the table and the targets.
type Latency struct {
	Wsproxy string // the wsproxy binary
	// Before, when set, is another wsproxy binary (an earlier build) whose rows run just before
	// each wsproxy row, for a comparison.
	Before      string
	DatabaseURL string
	Streams     []int         // the rows' numbers of concurrent streams
	Window      time.Duration // the measured part of each row, after its ramp
	Size        int           // request body size in bytes
	// Scenarios, when set, keeps only the scenarios whose names contain one of these words.
	Scenarios []string
	Rounds    int // rounds of the rows at each load; the table gives each figure's median
	Pool      int // wsproxy's pool_max_conns (0: the URL's, else pgx's default)
	Timing    fake.Timing
}

// Run runs the rows and prints the table.
func (l Latency) Run(ctx context.Context) error {
	h := &latencyHarness{bin: l.Wsproxy, dbURL: l.DatabaseURL, timing: l.Timing, window: l.Window, size: l.Size, pool: l.Pool}
	if h.dbURL == "" {
		return errors.New("the latency table needs a Postgres")
	}
	rounds := max(l.Rounds, 1)
	scenarios := latencyScenarios
	if len(l.Scenarios) > 0 {
		scenarios = nil
		for _, s := range latencyScenarios {
			for _, w := range l.Scenarios {
				if strings.Contains(s.name, strings.TrimSpace(w)) {
					scenarios = append(scenarios, s)
					break
				}
			}
		}
	}
	if l.Before != "" {
		var both []latencyScenario
		for _, s := range scenarios {
			if s.target == targetWsproxy {
				b := s
				b.name, b.bin = s.name+" (before)", l.Before
				both = append(both, b)
			}
			both = append(both, s)
		}
		scenarios = both
	}
	if err := h.start(); err != nil {
		return err
	}
	defer h.stop()
	fmt.Printf("model: %s to the first token, then %d chunks at %s (a round: %s); open-loop rows of %s after a ramp; %s\n",
		h.timing.TTFT, h.timing.Chunks, h.timing.Interval, h.timing.Total(), h.window, machine())
	var rows []latencyRow
	for _, n := range l.Streams {
		var runs [][]latencyRow // by scenario
		for round := range rounds {
			for i, s := range scenarios {
				if err := ctx.Err(); err != nil {
					return err
				}
				r, err := h.row(ctx, s, n)
				if err != nil {
					return fmt.Errorf("%s at %d streams: %w", s.name, n, err)
				}
				fmt.Printf("round %d %s\n", round+1, r.progress())
				if round == 0 {
					runs = append(runs, nil)
				}
				runs[i] = append(runs[i], r)
			}
		}
		for _, rs := range runs {
			rows = append(rows, medianRow(rs))
		}
	}
	if rounds > 1 {
		fmt.Printf("\nMedians over %d rounds", rounds)
	}
	printLatencyTable(os.Stdout, rows)
	return nil
}

// medianRow is the rows of one scenario and load over rounds: the streams of all of them, and
// per figure its median.
func medianRow(rs []latencyRow) latencyRow {
	m := rs[0]
	m.errors = map[string]int{}
	m.started, m.ok, m.completed = 0, 0, 0
	for _, r := range rs {
		m.started += r.started
		m.ok += r.ok
		m.completed += r.completed
		for k, v := range r.errors {
			m.errors[k] += v
		}
	}
	med := func(f func(latencyRow) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return medianOf(v)
	}
	d := func(f func(latencyRow) time.Duration) time.Duration {
		return time.Duration(med(func(r latencyRow) float64 { return float64(f(r)) }))
	}
	m.ttft50 = d(func(r latencyRow) time.Duration { return r.ttft50 })
	m.ttft99 = d(func(r latencyRow) time.Duration { return r.ttft99 })
	m.poolWait99 = d(func(r latencyRow) time.Duration { return r.poolWait99 })
	m.cpu = d(func(r latencyRow) time.Duration { return r.cpu })
	m.pgCPU = d(func(r latencyRow) time.Duration { return r.pgCPU })
	m.connPerAcquire = d(func(r latencyRow) time.Duration { return r.connPerAcquire })
	m.connPerTurn = d(func(r latencyRow) time.Duration { return r.connPerTurn })
	m.open = med(func(r latencyRow) float64 { return r.open })
	m.rssPerStream = med(func(r latencyRow) float64 { return r.rssPerStream })
	m.goroPerStream = med(func(r latencyRow) float64 { return r.goroPerStream })
	m.stackPerStream = med(func(r latencyRow) float64 { return r.stackPerStream })
	m.heapPerStream = med(func(r latencyRow) float64 { return r.heapPerStream })
	m.upPeak = int64(med(func(r latencyRow) float64 { return float64(r.upPeak) }))
	m.upNew = int64(med(func(r latencyRow) float64 { return float64(r.upNew) }))
	m.pgPeak = med(func(r latencyRow) float64 { return r.pgPeak })
	m.pgOpen = med(func(r latencyRow) float64 { return r.pgOpen })
	m.machineBusy = med(func(r latencyRow) float64 { return r.machineBusy })
	m.othersBusy = med(func(r latencyRow) float64 { return r.othersBusy })
	return m
}

// latencyHarness runs the rows: it owns the model upstream and, for each row, a fresh proxy.
type latencyHarness struct {
	bin, dbURL string
	timing     fake.Timing
	window     time.Duration
	size       int
	pool       int // wsproxy's pool_max_conns (0: its default)

	model      string // the model upstream's address
	modelCmd   *exec.Cmd
	postmaster int // the pid of the Postgres server of dbURL
	seeded     int // threads lat-0 … lat-(seeded-1) have their preference
	probe      *http.Client
}

func (h *latencyHarness) start() error {
	h.probe = &http.Client{Timeout: 2 * time.Second}
	var err error
	if h.postmaster, err = postmasterPID(h.dbURL); err != nil {
		return err
	}
	h.model, h.modelCmd, err = spawnSelf(nil, "model", "-ttft", h.timing.TTFT.String(), "-chunks", strconv.Itoa(h.timing.Chunks),
		"-interval", h.timing.Interval.String())
	return err
}

func (h *latencyHarness) stop() {
	if h.modelCmd != nil {
		stop(h.modelCmd)
	}
}

// postmasterPID is the pid of the server process of the Postgres at url: the parent of a
// backend.
func postmasterPID(url string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, fmt.Errorf("read the backend's pid: %w", err)
	}
	st, ok := readProcStat(backend)
	if !ok {
		return 0, fmt.Errorf("postgres backend %d is not in /proc (is Postgres on another machine?)", backend)
	}
	return st.ppid, nil
}

// target is where a row's load goes: the model upstream itself, or a proxy started for the
// row.
type target struct {
	base string // http://host:port
	cmd  *exec.Cmd
	kind string
}

func (t target) pid() int {
	if t.cmd == nil {
		return 0
	}
	return t.cmd.Process.Pid
}

func (h *latencyHarness) startTarget(s latencyScenario) (target, error) {
	switch kind := s.target; kind {
	case targetBare:
		addr, cmd, err := spawnSelf(nil, "bareproxy", "-target", "http://"+h.model)
		return target{base: "http://" + addr, cmd: cmd, kind: kind}, err
	case targetWsproxy:
		dbURL := h.dbURL
		if h.pool > 0 {
			u, err := url.Parse(dbURL)
			if err != nil {
				return target{}, fmt.Errorf("DATABASE_URL: %w", err)
			}
			q := u.Query()
			q.Set("pool_max_conns", strconv.Itoa(h.pool))
			u.RawQuery = q.Encode()
			dbURL = u.String()
		}
		addr, cmd, err := startWsproxy(cmp.Or(s.bin, h.bin), "DATABASE_URL="+dbURL, "UPSTREAM_BASE_URL=http://"+h.model+"/v1", "ADMIN_TOKEN="+adminToken, "LOG_LEVEL=warn")
		return target{base: "http://" + addr, cmd: cmd, kind: kind}, err
	}
	return target{base: "http://" + h.model, kind: targetDirect}, nil
}

// threads is the number of threads a row of n streams turns over: twice n, so that two turns of
// one thread overlap only when streams take twice the model's time.
func threads(n int) int { return 2 * n }

// seed gives the threads a row needs their preference (the tool round updates it), through t.
func (h *latencyHarness) seed(t target, n int) error {
	want := threads(n)
	if h.seeded >= want {
		return nil
	}
	next := atomic.Int64{}
	next.Store(int64(h.seeded))
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(want); i = next.Add(1) - 1 {
				if err := seed(t.base, threadName(int(i))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	h.seeded = want
	return nil
}

func threadName(i int) string { return "lat-" + strconv.Itoa(i) }

// streamDuration is how long a stream of s takes at the model's pace.
func (h *latencyHarness) streamDuration(s latencyScenario) time.Duration {
	if s.tool {
		return 2 * h.timing.Total()
	}
	return h.timing.Total()
}

// row runs one row: a fresh proxy (for the proxy rows), a warm-up, then open-loop arrivals at
// the rate that keeps n streams open: a ramp of one stream's time and a second, then the
// measured window, then the streams still open run to their end.
func (h *latencyHarness) row(ctx context.Context, s latencyScenario, n int) (latencyRow, error) {
	t, err := h.startTarget(s)
	if err != nil {
		return latencyRow{}, err
	}
	if t.cmd != nil {
		defer stop(t.cmd)
	}
	if s.thread {
		if err := h.seed(t, n); err != nil {
			return latencyRow{}, err
		}
	}
	warm := h.openLoop(s, t, n)
	warm.rate, warm.duration = 1000, 20*time.Millisecond // about 20 streams at once
	warm.run(ctx)
	loop := h.openLoop(s, t, n)
	time.Sleep(200 * time.Millisecond)
	before := h.sample(t, loop)

	ramp := h.streamDuration(s) + time.Second
	loop.duration = ramp + h.window
	var (
		samples         []latencySample
		start, end      latencySample
		samplerDone     = make(chan struct{})
		runStart        = time.Now()
		machineBefore   cpuTimes
		ourBefore       time.Duration
		machineAfter    cpuTimes
		ourAfter        time.Duration
		upBefore, upEnd loadStats
	)
	go func() {
		defer close(samplerDone)
		if !sleepCtx(ctx, ramp) {
			return
		}
		upBefore = h.upstreamStats(true)
		machineBefore, ourBefore = readCPUTimes(), h.ourCPU(t)
		start = h.sample(t, loop)
		for i := 0; ctx.Err() == nil && (i < 4 || time.Since(runStart) < ramp+h.window); i++ { // under load a sample may take seconds
			time.Sleep(250 * time.Millisecond)
			samples = append(samples, h.sample(t, loop))
		}
		end = h.sample(t, loop)
		upEnd = h.upstreamStats(false)
		machineAfter, ourAfter = readCPUTimes(), h.ourCPU(t)
	}()
	results := loop.run(ctx)
	<-samplerDone
	if err := ctx.Err(); err != nil {
		return latencyRow{}, err
	}

	r := latencyRow{scenario: s, n: n, errors: map[string]int{}, window: h.window}
	var ttfts []time.Duration
	completed := 0
	for _, res := range results {
		r.started++
		if res.err != "" {
			r.errors[res.err]++
			continue
		}
		r.ok++
		if res.start >= ramp && res.start < ramp+h.window {
			ttfts = append(ttfts, res.ttft)
		}
		if res.end >= ramp && res.end < ramp+h.window {
			completed++
		}
	}
	slices.Sort(ttfts)
	r.ttft50, r.ttft99 = percentile(ttfts, .50), percentile(ttfts, .99)
	r.summarize(before, start, end, samples, completed)
	r.upPeak, r.upNew = upEnd.Peak, upEnd.Accepted-upBefore.Accepted
	busy := machineAfter.busy - machineBefore.busy
	r.machineBusy = float64(busy) / float64(machineAfter.total-machineBefore.total)
	r.othersBusy = max(0, float64(busy-int64((ourAfter-ourBefore)/cpuTick))/float64(machineAfter.total-machineBefore.total))
	return r, nil
}

// openLoop builds the row's load, arrivals at the rate that keeps n streams open.
func (h *latencyHarness) openLoop(s latencyScenario, t target, n int) *openLoop {
	transport := &http.Transport{
		MaxIdleConnsPerHost: 4 * n, IdleConnTimeout: time.Minute, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	}
	o := &openLoop{
		client: &http.Client{Transport: transport, Timeout: 2 * time.Minute},
		url:    t.base + chatPath,
		first:  RequestBody(h.size, true),
		header: http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer sk-load"}},
		rate:   float64(n) / h.streamDuration(s).Seconds(),
		expect: [2]time.Duration{h.streamDuration(s)},
	}
	if s.tool {
		o.header.Set(fake.ToolRoundHeader, "1")
		if s.target != targetWsproxy {
			o.second = withToolResult(o.first)
			o.expect = [2]time.Duration{h.timing.Total(), h.timing.Total()}
		}
	}
	if s.thread {
		m := threads(n)
		o.thread = func(k int) string { return threadName(k % m) }
	}
	return o
}

// withToolResult is a request body with the model's workspace call and its result appended to
// its messages: the round a client sends after running the call itself.
func withToolResult(body []byte) []byte {
	i := bytes.LastIndex(body, []byte("]}"))
	c := fake.WorkspaceCall(1) // the client's own call: what it set is not read
	return slices.Concat(body[:i], []byte(`,{"role":"assistant","content":null,"tool_calls":[{"id":`+strconv.Quote(c.ID)+`,"type":"function","function":{"name":`+
		strconv.Quote(c.Name)+`,"arguments":`+strconv.Quote(c.Arguments)+`}}]},{"role":"tool","tool_call_id":`+strconv.Quote(c.ID)+`,"content":"{\"ok\":true}"}]}`))
}

// maxOpenStreams caps the streams a row holds open at once: a proxy holds two connections (two
// open files) a stream, and these machines allow 20,000 a process. Past it, an arrival is not
// sent and counts as a failure (errOverCap): the proxy fell that far behind.
const maxOpenStreams = 9_500

const errOverCap = "not sent: 9,500 streams open"

// openLoop sends streams at Poisson arrivals of rate per second for duration, each on its own
// whatever the others do, and returns once every stream ended.
type openLoop struct {
	client *http.Client
	url    string
	first  []byte
	second []byte // the client's own second round (nil: none)
	header http.Header
	thread func(k int) string // nil: no thread
	// expect is how long the model takes to answer the first request and the second: a client
	// reads an answer's first event as it comes, and the rest once the model is done, so that
	// the load generator's CPU goes to the streams' starts and ends rather than to a wakeup for
	// each of 200,000 events a second (the proxy writes every event as it comes all the same;
	// the connection's buffers hold a stream's few kilobytes meanwhile).
	expect   [2]time.Duration
	rate     float64
	duration time.Duration
	open     atomic.Int64
}

// streamResult is one stream: when it started and ended (from the run's start), its time to the
// first event of the answer, and what went wrong ("" for nothing).
type streamResult struct {
	start, end, ttft time.Duration
	err              string
}

// An ended ctx stops the arrivals; the streams open run to their end.
func (o *openLoop) run(ctx context.Context) []streamResult {
	defer o.client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(1, 2))
	var (
		mu      sync.Mutex
		results []streamResult
		wg      sync.WaitGroup
	)
	start := time.Now()
	at := time.Duration(0)
	for k := 0; ; k++ {
		at += time.Duration(rng.ExpFloat64() / o.rate * float64(time.Second))
		if at >= o.duration {
			break
		}
		if !sleepCtx(ctx, time.Until(start.Add(at))) {
			break
		}
		if o.open.Add(1) > maxOpenStreams {
			o.open.Add(-1)
			mu.Lock()
			results = append(results, streamResult{start: at, end: at, err: errOverCap})
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			defer o.open.Add(-1)
			r := o.stream(k, start)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
	wg.Wait()
	return results
}

// stream runs stream k: its request (and its second round when the client sends it).
func (o *openLoop) stream(k int, runStart time.Time) streamResult {
	t0 := time.Now()
	r := streamResult{start: t0.Sub(runStart)}
	ttft, err := o.post(o.first, k, t0, o.expect[0])
	if err == nil && o.second != nil {
		ttft, err = o.post(o.second, k, t0, o.expect[1])
	}
	r.end = time.Since(runStart)
	if err != nil {
		r.err = errorKind(err)
		return r
	}
	r.ttft = ttft
	return r
}

var errIncomplete = errors.New("stream ended before [DONE]")

// post sends one streamed request and reads its answer to the end (its first event as it
// comes, the rest from expect after the request on): the time from t0 to its first data line,
// or an error for a status other than 200, an error event or a stream without its [DONE].
func (o *openLoop) post(body []byte, k int, t0 time.Time, expect time.Duration) (time.Duration, error) {
	sent := time.Now()
	req, err := http.NewRequest(http.MethodPost, o.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header = o.header.Clone()
	if o.thread != nil {
		req.Header.Set("X-Thread-Id", o.thread(k))
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	var ttft time.Duration
	done := false
	for {
		line, err := br.ReadSlice('\n')
		if bytes.HasPrefix(line, []byte("data: ")) {
			if ttft == 0 {
				ttft = time.Since(t0)
				time.Sleep(time.Until(sent.Add(expect)))
			}
			if bytes.HasPrefix(line, []byte(`data: {"error"`)) {
				return 0, errors.New("error event")
			}
			done = bytes.HasPrefix(line, []byte("data: [DONE]"))
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if !done {
		return 0, errIncomplete
	}
	return ttft, nil
}

// sleepCtx sleeps for d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// errorKind names a failure without its addresses, for counting.
func errorKind(err error) string {
	s := err.Error()
	for _, k := range []string{"connection reset", "connection refused", "broken pipe", "timeout", "deadline", "too many open files", "EOF"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

// latencySample is what the harness reads of the processes now and then.
type latencySample struct {
	open       int64 // streams the client has open
	rss        int64 // the proxy's resident memory
	goroutines float64
	pgAcquired float64 // wsproxy's pooled connections in use
	pgOpen     float64 // and open
	pgMax      float64
	stack      float64 // the proxy's goroutine stacks and heap in use (wsproxy: its metrics)
	heap       float64
	acquires   float64 // wsproxy's acquires of a pooled connection so far
	cpu        time.Duration
	pgCPU      time.Duration
	poolWait   histogram
	scraped    bool // the figures below open, rss and cpu came (a scrape may time out under load)
}

func (h *latencyHarness) sample(t target, o *openLoop) latencySample {
	s := latencySample{open: o.open.Load()}
	pid := t.pid()
	if pid == 0 {
		return s
	}
	s.rss, _ = currentRSS(pid)
	s.cpu = procCPU(pid)
	switch t.kind {
	case targetBare:
		var ls loadStats
		if err := getJSON(h.probe, t.base+statsPath, &ls); err == nil {
			s.goroutines, s.scraped = float64(ls.Goroutines), true
		}
	case targetWsproxy:
		m, err := scrapeAll(h.probe, t.base)
		s.scraped = err == nil
		s.goroutines = m["go_goroutines"]
		s.pgAcquired = m["wsproxy_db_pool_acquired_connections"]
		s.pgOpen = m["wsproxy_db_pool_connections"]
		s.pgMax = m["wsproxy_db_pool_max_connections"]
		s.poolWait = histogramOf(m, "wsproxy_db_pool_acquire_duration_seconds")
		s.acquires = m["wsproxy_db_pool_acquire_duration_seconds_count"]
		s.stack, s.heap = m["go_memstats_stack_inuse_bytes"], m["go_memstats_heap_inuse_bytes"]
		s.pgCPU = postgresCPU(h.postmaster)
	}
	return s
}

func (h *latencyHarness) upstreamStats(reset bool) loadStats {
	u := "http://" + h.model + statsPath
	if reset {
		u += "?reset"
	}
	var s loadStats
	_ = getJSON(h.probe, u, &s)
	return s
}

func getJSON(c *http.Client, url string, v any) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// scrapeAll reads every sample of /metrics, keyed by its name and labels as written.
func scrapeAll(c *http.Client, base string) (map[string]float64, error) {
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// histogram is a Prometheus histogram's cumulative buckets.
type histogram struct {
	le     []float64
	counts []float64
}

func histogramOf(m map[string]float64, name string) histogram {
	var h histogram
	for k, v := range m {
		rest, ok := strings.CutPrefix(k, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, err := strconv.ParseFloat(strings.TrimSuffix(rest, `"}`), 64)
		if err != nil {
			continue
		}
		h.le = append(h.le, le)
		h.counts = append(h.counts, v)
	}
	idx := make([]int, len(h.le))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case h.le[a] < h.le[b]:
			return -1
		case h.le[a] > h.le[b]:
			return 1
		}
		return 0
	})
	sorted := histogram{}
	for _, i := range idx {
		sorted.le = append(sorted.le, h.le[i])
		sorted.counts = append(sorted.counts, h.counts[i])
	}
	return sorted
}

// quantileSince is the q-quantile of the observations made between before and h, interpolated
// within its bucket as Prometheus's histogram_quantile does; -1 when there were none.
func (h histogram) quantileSince(before histogram, q float64) time.Duration {
	if len(h.le) == 0 {
		return -1
	}
	counts := slices.Clone(h.counts)
	if len(before.counts) == len(counts) {
		for i := range counts {
			counts[i] -= before.counts[i]
		}
	}
	total := counts[len(counts)-1]
	if total <= 0 {
		return -1
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, c := range counts {
		if c >= rank {
			upper := h.le[i]
			if math.IsInf(upper, 1) {
				upper = lower
			}
			in := c - below
			frac := 1.0
			if in > 0 {
				frac = (rank - below) / in
			}
			return time.Duration((lower + (upper-lower)*frac) * float64(time.Second))
		}
		lower, below = h.le[i], c
	}
	return time.Duration(lower * float64(time.Second))
}

// latencyRow is one row of the table.
type latencyRow struct {
	scenario    latencyScenario
	n           int
	window      time.Duration
	started, ok int
	errors      map[string]int

	ttft50, ttft99 time.Duration
	open           float64 // mean open streams over the window
	rssPerStream   float64 // bytes
	goroPerStream  float64
	// wsproxy's: its goroutine stacks and heap in use per open stream, and the time a pooled
	// connection is held per acquire (Little's law: connections in use over acquires per second).
	stackPerStream, heapPerStream float64
	connPerAcquire, connPerTurn   time.Duration
	upPeak, upNew                 int64
	pgPeak, pgOpen                float64 // pooled connections: the most in use in a sample, the most open
	pgMax                         float64
	poolWait99                    time.Duration // -1: no figure
	cpu, pgCPU                    time.Duration // per stream that ended in the window
	completed                     int

	machineBusy, othersBusy float64 // shares of the machine's CPU time over the window
}

func (r *latencyRow) summarize(before, start, end latencySample, samples []latencySample, completed int) {
	var open, rss, goro, stack, heap, acquired []float64
	for _, s := range samples {
		open = append(open, float64(s.open))
		rss = append(rss, float64(s.rss))
		if !s.scraped {
			continue
		}
		goro = append(goro, s.goroutines)
		stack = append(stack, s.stack)
		heap = append(heap, s.heap)
		acquired = append(acquired, s.pgAcquired)
		r.pgPeak = max(r.pgPeak, s.pgAcquired)
		r.pgOpen = max(r.pgOpen, s.pgOpen)
		r.pgMax = max(r.pgMax, s.pgMax)
	}
	r.open = mean(open)
	if r.open > 0 {
		r.rssPerStream = (medianOf(rss) - float64(before.rss)) / r.open
		r.goroPerStream = (medianOf(goro) - before.goroutines) / r.open
		r.stackPerStream = (medianOf(stack) - before.stack) / r.open
		r.heapPerStream = (medianOf(heap) - before.heap) / r.open
	}
	if n := end.acquires - start.acquires; n > 0 {
		r.connPerAcquire = time.Duration(mean(acquired) * float64(r.window) / n)
	}
	if completed > 0 {
		r.connPerTurn = time.Duration(mean(acquired) * float64(r.window) / float64(completed))
	}
	r.completed = completed
	if completed > 0 {
		r.cpu = (end.cpu - start.cpu) / time.Duration(completed)
		r.pgCPU = (end.pgCPU - start.pgCPU) / time.Duration(completed)
	}
	r.poolWait99 = end.poolWait.quantileSince(start.poolWait, .99)
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func (r latencyRow) success() float64 { return 100 * float64(r.ok) / float64(max(r.started, 1)) }

func (r latencyRow) progress() string {
	errs := ""
	if len(r.errors) > 0 {
		errs = fmt.Sprintf("  errors %v", r.errors)
	}
	ws := ""
	if r.scenario.target == targetWsproxy {
		ws = fmt.Sprintf("  stack %.1f KiB heap %.1f KiB a stream, a pooled connection held %s an acquire, %s a turn",
			r.stackPerStream/1024, r.heapPerStream/1024, dur(r.connPerAcquire), dur(r.connPerTurn))
	}
	return fmt.Sprintf("%5d streams  %-33s %6.2f%% of %d  ttft p50 %s p99 %s  open %.0f  machine %.0f%% busy (others %.0f%%)%s%s",
		r.n, r.scenario.name, r.success(), r.started, dur(r.ttft50), dur(r.ttft99), r.open, 100*r.machineBusy, 100*r.othersBusy, ws, errs)
}

// printLatencyTable prints the rows with their TTFT added over the direct row of the same kind
// and load, then the targets.
func printLatencyTable(w io.Writer, rows []latencyRow) {
	direct := map[string]latencyRow{}
	bare := map[string]latencyRow{}
	key := func(r latencyRow) string { return strconv.Itoa(r.n) + "/" + strconv.FormatBool(r.scenario.tool) }
	for _, r := range rows {
		switch r.scenario.target {
		case targetDirect:
			direct[key(r)] = r
		case targetBare:
			bare[key(r)] = r
		}
	}
	added := func(r latencyRow) (p50, p99 time.Duration) {
		d := direct[key(r)]
		return r.ttft50 - d.ttft50, r.ttft99 - d.ttft99
	}
	fmt.Fprintf(w, "\n%7s  %-33s %8s %9s %9s %10s %10s %10s %8s %11s %9s %10s %10s %10s %9s\n", "streams", "scenario", "success",
		"ttft p50", "ttft p99", "added p50", "added p99", "RSS/strm", "gor/strm", "up conns", "pg conns", "pool p99", "CPU/turn", "pg/turn", "busy")
	for _, r := range rows {
		a50, a99 := added(r)
		cols := []string{fmt.Sprintf("%.2f%%", r.success()), dur(r.ttft50), dur(r.ttft99), "-", "-", "-", "-",
			fmt.Sprintf("%d/%d", r.upPeak, r.upNew), "-", "-", "-", "-", fmt.Sprintf("%.0f/%.0f%%", 100*r.machineBusy, 100*r.othersBusy)}
		if r.scenario.target != targetDirect {
			cols[3], cols[4] = dur(a50), dur(a99)
			cols[5] = fmt.Sprintf("%.1f KiB", r.rssPerStream/1024)
			cols[6] = fmt.Sprintf("%.2f", r.goroPerStream)
			cols[10] = dur(r.cpu)
		}
		if r.scenario.target == targetWsproxy {
			cols[8] = fmt.Sprintf("%.0f/%.0f/%.0f", r.pgPeak, r.pgOpen, r.pgMax)
			if r.poolWait99 >= 0 {
				cols[9] = dur(r.poolWait99)
			}
			cols[11] = dur(r.pgCPU)
		}
		fmt.Fprintf(w, "%7d  %-33s %8s %9s %9s %10s %10s %10s %8s %11s %9s %10s %10s %10s %9s\n", r.n, r.scenario.name,
			cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6], cols[7], cols[8], cols[9], cols[10], cols[11], cols[12])
	}
	fmt.Fprintln(w, "\nup conns: connections open at the model upstream, peak / new in the window; pg conns: pooled connections in use (the most in a sample, 4 a second) / open / the pool's size;")
	fmt.Fprintln(w, "pool p99: the wait for a pooled connection; CPU/turn: the proxy's CPU time per stream ended in the window (pg: all of Postgres's);")
	fmt.Fprintln(w, "busy: the machine's CPU in use over the window / the part of it not this harness's (2 cores = 100%).")

	fmt.Fprintln(w, "\nTargets")
	for _, r := range rows {
		if !r.scenario.thread || r.scenario.bin != "" {
			continue
		}
		b, ok := bare[key(r)]
		name := fmt.Sprintf("%s, %d streams", r.scenario.name, r.n)
		check(name+": 100% success", r.ok == r.started, fmt.Sprintf("%d of %d", r.ok, r.started))
		if !ok {
			continue
		}
		check(name+": RSS per open stream at most 1.5x the bare proxy's", r.rssPerStream <= 1.5*b.rssPerStream,
			fmt.Sprintf("%.1f vs %.1f KiB (%.2fx)", r.rssPerStream/1024, b.rssPerStream/1024, r.rssPerStream/b.rssPerStream))
		_, a99 := added(r)
		_, b99 := added(b)
		check(name+": added TTFT p99 at most 2x the bare proxy's", a99 <= 2*max(b99, 0),
			fmt.Sprintf("%s vs %s", dur(a99), dur(b99)))
	}
}

// machine describes the machine and how busy it is now.
func machine() string {
	load, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(load))
	if len(f) >= 3 {
		return fmt.Sprintf("load average %s %s %s on %d CPUs", f[0], f[1], f[2], runtime.NumCPU())
	}
	return fmt.Sprintf("%d CPUs", runtime.NumCPU())
}

// spawnSelf starts this program with args, and env on top of this process's environment, and
// returns the address it listens on.
func spawnSelf(env []string, args ...string) (string, *exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop(cmd)
		return "", nil, fmt.Errorf("%s: %w", args[0], err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return strings.TrimSpace(strings.TrimPrefix(line, "listening on ")), cmd, nil
}
