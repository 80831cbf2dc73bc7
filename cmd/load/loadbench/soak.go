package loadbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wsproxy/wsproxy/db/dbfault"
	"github.com/wsproxy/wsproxy/proxy/demo"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// soakModel is the upstream of the soak and of the failover run: the fake model
// (proxy/upstreamtest/fake), with faults injected, whose script records the user's message as a
// preference on a turn's first call, and on the call after the tools reads the tool's result and
// notes when each title the proxy reported as recorded reached it (acknowledged to the model).
type soakModel struct {
	*fake.Model
	mu    sync.Mutex
	acked map[string]time.Time // titles the proxy reported recorded, and when
}

func newSoakModel(f fake.Faults) *soakModel {
	m := &soakModel{acked: map[string]time.Time{}}
	m.Model = fake.New(fake.Options{Faults: f, Script: m.script})
	return m
}

func (m *soakModel) script(req *fake.Request) fake.Answer {
	last := req.Messages[len(req.Messages)-1]
	if last.Role != "tool" {
		a, _ := json.Marshal(map[string]any{"items": []map[string]string{{"title": demo.ClientText(last.Text())}}, "action_and_reasoning": "soak"})
		return fake.Answer{Calls: []fake.Call{{ID: "call_soak", Name: "add_preferences", Arguments: string(a)}}}
	}
	var env struct {
		OK     bool   `json:"ok"`
		Result string `json:"result"`
	}
	_ = json.Unmarshal([]byte(last.Text()), &env)
	if env.OK && strings.HasPrefix(env.Result, "recorded 1 preference") {
		// The user's message (the title) is the last user message.
		for i := len(req.Messages) - 1; i >= 0; i-- {
			if req.Messages[i].Role == "user" {
				m.mu.Lock()
				m.acked[demo.ClientText(req.Messages[i].Text())] = time.Now()
				m.mu.Unlock()
				break
			}
		}
	}
	return fake.Answer{Text: "Noted: " + env.Result}
}

// reportedTitles are the titles the proxy reported recorded so far, and when each reached the
// model.
func (m *soakModel) reportedTitles() map[string]time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.acked)
}

// soakTarget is the wsproxy under soak: one instance, or several on one Postgres that the soak's
// clients reach in turn (as a round-robin load balancer would).
type soakTarget struct {
	baseURLs   []string
	adminToken string
	// cutDB, when set, cuts Postgres off for a moment (the soak's database fault) every cutEvery.
	cutDB    func(d time.Duration)
	cutEvery time.Duration
	// settle, when set, runs before each measurement of goroutines and heap, with the load
	// stopped: whatever the target needs to close its idle pools and collect its garbage that
	// time alone does not do (in-process: the test's pools and runtime.GC). The soak's own
	// upstream closes idle connections after upstreamIdle, and its client closes its own.
	settle func()
}

// upstreamIdle is how long the soak's upstream keeps an idle keep-alive connection (and one the
// proxy dialed but never used: ReadHeaderTimeout): past it the proxy's idle connections to it
// are gone, so that they are not taken for a leak.
const upstreamIdle = time.Second

// newSoakServer is the soak upstream's HTTP server, closing idle connections after upstreamIdle.
func newSoakServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, IdleTimeout: upstreamIdle, ReadHeaderTimeout: upstreamIdle}
}

// The verdict on memory: goroutines come back exactly to their baseline once idle pools are
// closed (a goroutine left per request never does); the live heap does not keep what the
// requests brought: it may grow by heapFloor whatever the traffic (a pool, a cache); past that,
// by at most heapPerRequest per request served (a slice that keeps every body keeps kilobytes a
// request, however few requests a short soak serves) and at most heapMax in all (a slow leak
// adds up over a long soak).
const (
	goroutineWait  = 20 * time.Second
	heapFloor      = 2 << 20
	heapPerRequest = 4 << 10
	heapMax        = 8 << 20
)

// soakSummary is what a soak found.
type soakSummary struct {
	Duration                          time.Duration
	Turns, Streamed, Pass, Admin      int64
	ClientErrors                      map[string]int64
	Injected                          map[string]int
	DBCuts                            int
	Reported, StoredOnce              int
	Lost, Duplicated                  int
	GoroutinesBefore, GoroutinesAfter float64
	HeapBefore, HeapAfter             float64 // live heap at the last GC
}

func (s soakSummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak: %s of mixed traffic: %d thread turns (%d streamed), %d pass-through, %d admin edits\n",
		s.Duration.Round(time.Second), s.Turns, s.Streamed, s.Pass, s.Admin)
	fmt.Fprintf(&b, "  faults injected: %v; Postgres cut %d times\n", s.Injected, s.DBCuts)
	fmt.Fprintf(&b, "  errors the clients saw (then retried): %v\n", s.ClientErrors)
	fmt.Fprintf(&b, "  preferences the loop reported recorded: %d; stored exactly once: %d; lost: %d; duplicated: %d\n",
		s.Reported, s.StoredOnce, s.Lost, s.Duplicated)
	fmt.Fprintf(&b, "  goroutines with idle connections closed: %.0f before, %.0f after (none more after)\n", s.GoroutinesBefore, s.GoroutinesAfter)
	fmt.Fprintf(&b, "  live heap: %.1f MB before, %.1f MB after, %.0f bytes a request (a leak: over %d MB and %d KB a request, or over %d MB)\n",
		s.HeapBefore/(1<<20), s.HeapAfter/(1<<20), s.heapPerRequest(), heapFloor>>20, heapPerRequest>>10, heapMax>>20)
	for _, p := range s.problems() {
		fmt.Fprintf(&b, "  PROBLEM: %s\n", p)
	}
	return b.String()
}

// problems lists what the soak found wrong; none is a pass.
func (s soakSummary) problems() []string {
	var out []string
	if s.Reported == 0 {
		out = append(out, "no write was reported: the soak did not run")
	}
	if s.Lost > 0 || s.Duplicated > 0 {
		out = append(out, fmt.Sprintf("writes lost (%d) or duplicated (%d)", s.Lost, s.Duplicated))
	}
	// Fewer after is no leak: a goroutine that lives only while it has work (the usage writer,
	// a batch of turn starts) may have been running when the baseline was taken.
	if s.GoroutinesAfter > s.GoroutinesBefore {
		out = append(out, fmt.Sprintf("goroutines did not come back: %.0f before, %.0f after", s.GoroutinesBefore, s.GoroutinesAfter))
	}
	if growth := s.HeapAfter - s.HeapBefore; growth > heapMax || (growth > heapFloor && s.heapPerRequest() > heapPerRequest) {
		out = append(out, fmt.Sprintf("the live heap grew by %.1f MB, %.0f bytes a request", growth/(1<<20), s.heapPerRequest()))
	}
	return out
}

// heapPerRequest is the live heap's growth divided by the requests served.
func (s soakSummary) heapPerRequest() float64 {
	return (s.HeapAfter - s.HeapBefore) / float64(max(s.Turns+s.Pass+s.Admin, 1))
}

// soakRun is one soak: its target, its clients and what they saw.
type soakRun struct {
	tgt     soakTarget
	next    atomic.Uint64 // the round-robin over the target's instances
	up      *soakModel
	client  *http.Client
	sum     soakSummary
	mu      sync.Mutex
	threads sync.Map // every thread used, to check at the end
}

// soakLoad is how much traffic a soak drives: for a duration (the soak command), or a number of
// requests (the tests: the verdict then judges the same traffic however fast the machine runs
// it). Zero is no limit; the soak stops at the first limit reached.
type soakLoad struct {
	d        time.Duration
	requests int64 // thread turns (each with its retries), pass-through requests and admin edits
}

// soak drives mixed traffic at the target with workers clients, then checks every write, the
// goroutines and the live heap against the baseline taken after a warm-up.
func soak(ctx context.Context, tgt soakTarget, up *soakModel, load soakLoad, workers int) (soakSummary, error) {
	s := &soakRun{tgt: tgt, up: up, client: &http.Client{Timeout: time.Minute}}
	defer s.client.CloseIdleConnections()
	s.sum = soakSummary{ClientErrors: map[string]int64{}}
	s.warmUp(workers)
	var err error
	if s.sum.GoroutinesBefore, s.sum.HeapBefore, err = s.measure(0); err != nil {
		return s.sum, err
	}
	s.drive(ctx, load, workers)
	if err := s.checkWrites(); err != nil {
		return s.sum, err
	}
	s.sum.GoroutinesAfter, s.sum.HeapAfter, err = s.measure(s.sum.GoroutinesBefore)
	return s.sum, err
}

// warmUp runs as many clients as the soak will, so that the pools are as they will be.
func (s *soakRun) warmUp(workers int) {
	var warm sync.WaitGroup
	for w := range workers {
		thread := fmt.Sprintf("warm-up-%d", w)
		s.threads.Store(thread, true)
		warm.Go(func() {
			for i := range 20 {
				s.post("/v1/chat/completions", map[string]string{"X-Thread-Id": thread}, turnBody(fmt.Sprintf("%s pref %d", thread, i), false))
			}
		})
	}
	warm.Wait()
}

// measure waits for the idle connections to close, then reads the target's goroutines and live
// heap (summed over its instances). For the baseline (want 0) it reads until two readings agree;
// after the load it reads until the goroutines are want again, for up to goroutineWait.
func (s *soakRun) measure(want float64) (goroutines, heap float64, err error) {
	deadline := time.Now().Add(goroutineWait)
	last := -1.0
	for {
		s.client.CloseIdleConnections()
		if s.tgt.settle != nil {
			s.tgt.settle()
		}
		time.Sleep(2 * upstreamIdle)
		goroutines, heap = 0, 0
		for _, u := range s.tgt.baseURLs {
			m, err := scrapeMetrics(s.client, u)
			if err != nil {
				return 0, 0, err
			}
			goroutines, heap = goroutines+m["go_goroutines"], heap+m["go_gc_heap_live_bytes"]
		}
		switch {
		case want == 0 && goroutines == last, want != 0 && goroutines == want, time.Now().After(deadline):
			return goroutines, heap, nil
		}
		last = goroutines
	}
}

// turnBody is a thread turn's request: a system prompt of about 8 KB (as agents send) and the
// user's message.
func turnBody(message string, stream bool) string {
	return fmt.Sprintf(`{"model":"soak","stream":%t,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
		stream, soakSystemPrompt, message)
}

var soakSystemPrompt = strings.Repeat("You are a careful assistant for a soak of wsproxy. ", 160)

func (s *soakRun) clientError(what string) {
	s.mu.Lock()
	s.sum.ClientErrors[what]++
	s.mu.Unlock()
}

// instance is the base URL of the next instance, round-robin.
func (s *soakRun) instance() string {
	return s.tgt.baseURLs[s.next.Add(1)%uint64(len(s.tgt.baseURLs))]
}

func (s *soakRun) post(path string, header map[string]string, body string) (int, string) {
	req, _ := http.NewRequest("POST", s.instance()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// drive runs the mixed traffic until load is reached: thread turns streamed and not (each
// recording a new preference, retried by the client on failure), pass-through, and the user's
// admin edits; Postgres is cut as the traffic starts, then every cutEvery.
func (s *soakRun) drive(ctx context.Context, load soakLoad, workers int) {
	var turns, streamed, pass, admin, seq, requests atomic.Int64
	start := time.Now()
	if load.d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, load.d)
		defer cancel()
	}
	ctx, stopCuts := context.WithCancel(ctx)
	// more reports whether another request may go out.
	more := func() bool { return ctx.Err() == nil && (load.requests == 0 || requests.Add(1) <= load.requests) }
	var cuts sync.WaitGroup
	if s.tgt.cutDB != nil {
		cuts.Go(func() {
			for {
				s.tgt.cutDB(time.Second)
				s.sum.DBCuts++
				select {
				case <-ctx.Done():
					return
				case <-time.After(s.tgt.cutEvery):
				}
			}
		})
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for n := 0; more(); n++ {
				thread := fmt.Sprintf("soak-%d-%d", w, n/60) // a fresh thread before the 100-preference limit
				s.threads.Store(thread, true)
				switch x := rand.IntN(10); {
				case x < 7: // a thread turn recording a new preference, retried by the client on failure
					stream := x >= 5
					body := turnBody(fmt.Sprintf("%s pref %d", thread, seq.Add(1)), stream)
					for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
						code, resp := s.post("/v1/chat/completions", map[string]string{"X-Thread-Id": thread}, body)
						if code == 200 && (!stream || strings.HasSuffix(resp, "data: [DONE]\n\n")) {
							break
						}
						s.clientError(fmt.Sprintf("%d", code))
						time.Sleep(50 * time.Millisecond)
					}
					turns.Add(1)
					if stream {
						streamed.Add(1)
					}
				case x < 8:
					s.post("/v1/chat/completions", nil, `{"model":"soak","messages":[{"role":"user","content":"pass-through"}]}`)
					pass.Add(1)
				default: // the user locks the first preference, or adds one of their own
					var code int
					if x == 8 {
						code = s.admin("PATCH", "/admin/v1/threads/"+thread+"/preferences/1", `{"locked":true}`)
					} else {
						code = s.admin("POST", "/admin/v1/threads/"+thread+"/preferences", fmt.Sprintf(`{"title":"user %d"}`, seq.Add(1)))
					}
					if code >= 500 {
						s.clientError(fmt.Sprintf("admin %d", code))
					}
					admin.Add(1)
				}
			}
		})
	}
	wg.Wait()
	stopCuts()
	cuts.Wait()
	s.sum.Duration = time.Since(start)
	s.sum.Turns, s.sum.Streamed, s.sum.Pass, s.sum.Admin = turns.Load(), streamed.Load(), pass.Load(), admin.Load()
}

// checkWrites checks that every preference the loop reported recorded is stored exactly once,
// and no title twice, with contiguous indices.
func (s *soakRun) checkWrites() error {
	stored := map[string]int{}
	var lastErr error
	s.threads.Range(func(k, _ any) bool {
		var d struct {
			Preferences []struct {
				Title string `json:"title"`
				Index int    `json:"index"`
			} `json:"preferences"`
		}
		code, body := s.adminRead("/admin/v1/threads/" + k.(string))
		if code == 404 {
			return true
		}
		if code != 200 || json.Unmarshal(body, &d) != nil {
			lastErr = fmt.Errorf("read thread %s: %d %s", k, code, body)
			return false
		}
		for i, p := range d.Preferences {
			stored[p.Title]++
			if p.Index != i+1 {
				lastErr = fmt.Errorf("thread %s: indices not contiguous", k)
			}
		}
		return true
	})
	if lastErr != nil {
		return lastErr
	}
	reported := s.up.reportedTitles()
	s.sum.Injected = s.up.Injected()
	s.sum.Reported = len(reported)
	for title := range reported {
		switch stored[title] {
		case 0:
			s.sum.Lost++
		case 1:
			s.sum.StoredOnce++
		}
	}
	for _, n := range stored {
		if n > 1 {
			s.sum.Duplicated++
		}
	}
	return nil
}

func (s *soakRun) admin(method, path, body string) int {
	req, _ := http.NewRequest(method, s.instance()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.tgt.adminToken)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// adminRead is adminGet retried as a client retries a read: a 503 (Postgres unavailable: the
// first statement on a pooled connection that a cut closed fails, on a busy machine also just
// after the cuts stop) or no answer is tried again, for up to 30 s.
func (s *soakRun) adminRead(path string) (int, []byte) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := s.adminGet(path)
		if (code != 0 && code != http.StatusServiceUnavailable) || time.Now().After(deadline) {
			return code, body
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *soakRun) adminGet(path string) (int, []byte) {
	req, _ := http.NewRequest("GET", s.instance()+path, nil)
	req.Header.Set("Authorization", "Bearer "+s.tgt.adminToken)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// scrapeMetrics reads the unlabelled samples of /metrics.
func scrapeMetrics(client *http.Client, base string) (map[string]float64, error) {
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out, nil
}

// Soak is the soak of make soak: mixed traffic against wsproxy instances on one Postgres, with
// injected upstream faults and Postgres behind a fault proxy that cuts it now and then; then a
// check of every write, of memory and of goroutines.
type Soak struct {
	Wsproxy     string // the wsproxy binary
	DatabaseURL string
	Duration    time.Duration
	Clients     int
	Instances   int // wsproxy instances on the one Postgres, reached round-robin
}

// Run runs the soak and prints what it found; it fails when it found a problem.
func (sk Soak) Run(ctx context.Context) error {
	dbURL := sk.DatabaseURL
	if dbURL == "" {
		return errors.New("the soak needs a Postgres")
	}
	pgCfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	fault, err := dbfault.New(pgCfg.Host, pgCfg.Port)
	if err != nil {
		return err
	}
	defer fault.Close()
	viaFault, _ := url.Parse(dbURL)
	q := viaFault.Query()
	q.Set("host", "127.0.0.1")
	q.Set("port", strconv.Itoa(fault.Port()))
	viaFault.RawQuery = q.Encode()

	up := newSoakModel(fake.Faults{Status: 0.04, Reset: 0.02, Stall: 0.005, BadJSON: 0.01, StallFor: 5 * time.Second})
	upAddr, err := freeAddr()
	if err != nil {
		return err
	}
	upSrv := newSoakServer(up)
	upSrv.Addr = upAddr
	go func() { _ = upSrv.ListenAndServe() }()
	defer upSrv.Close()
	tgt := soakTarget{adminToken: adminToken, cutEvery: 20 * time.Second, cutDB: func(d time.Duration) {
		fault.Cut()
		time.Sleep(d)
		fault.Restore()
	}}
	for range sk.Instances {
		addr, cmd, err := startWsproxy(sk.Wsproxy, "DATABASE_URL="+viaFault.String(), "UPSTREAM_BASE_URL=http://"+upAddr+"/v1",
			"ADMIN_TOKEN="+adminToken, "LOG_LEVEL=error", "UPSTREAM_TIMEOUT=2s", "DATABASE_TIMEOUT=3s")
		if err != nil {
			return err
		}
		defer stop(cmd)
		tgt.baseURLs = append(tgt.baseURLs, "http://"+addr)
	}
	fmt.Printf("soaking %v for %s with %d clients…\n", tgt.baseURLs, sk.Duration, sk.Clients)
	sum, err := soak(ctx, tgt, up, soakLoad{d: sk.Duration}, sk.Clients)
	if err != nil {
		return err
	}
	fmt.Print(sum)
	if len(sum.problems()) > 0 {
		return errors.New("the soak found lost or duplicated writes, or memory or goroutines that did not come back")
	}
	return nil
}
