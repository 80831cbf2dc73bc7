package loadbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// scenario is one thing measured: a URL, with or without a thread, streamed or not.
type scenario struct {
	name   string
	url    string
	thread string
	stream bool
	body   []byte // the request's body; RequestBody's when nil
	// keys are the client keys the load's clients send (Load.Keys); none: the wsproxy has no
	// clients and every request passes as it would without CLIENT_KEYS.
	keys []string
	// pair runs the scenario at the same time as the next one (runPair), each on a database of
	// its own, its Postgres CPU that of the backends of its database (dbCPU).
	pair bool
}

// Suite is the load comparison of make bench-load: direct, a bare reverse proxy, and wsproxy
// without a thread, with one, with a tool round, with two parents, streamed and not, and the
// floor under a thread turn and a tool round (Floor), and the thread turn and the pass-through
// with a client key and limits (keyedProxy) beside a twin without clients, at 1 and 32 clients,
// interleaved over rounds; then the CPU per request, the targets beside the floor's figures, and
// the memory of one 10 MB streamed turn.
type Suite struct {
	Wsproxy  string        // the wsproxy binary
	Duration time.Duration // of each run
	Rounds   int           // each running every scenario once per concurrency
	Size     int           // request body size in bytes
	// DatabaseURL is a durable Postgres (fsync on); NofsyncDatabaseURL one with fsync off, where
	// the thread turn runs again for comparison.
	DatabaseURL, NofsyncDatabaseURL string
}

// Run runs the suite and prints its figures.
func (s Suite) Run(ctx context.Context) error {
	if s.DatabaseURL == "" || s.NofsyncDatabaseURL == "" {
		return errors.New("the suite needs a durable Postgres and one with fsync off")
	}
	st := &suiteRun{bin: s.Wsproxy, dbURL: s.DatabaseURL, pids: map[string]int{}, postmasters: map[string]int{}, dbs: map[string]string{}}
	defer st.stop()
	scenarios, err := st.start(s.NofsyncDatabaseURL)
	if err != nil {
		return err
	}
	results, cpu, err := st.run(ctx, scenarios, s.Rounds, s.Duration, s.Size)
	if err != nil {
		return err
	}
	st.report(scenarios, s.Rounds, results, cpu)
	err = st.memory(ctx, s.Size)
	// A keyed request that failed is most likely a limit refusing (429), which this run's limits
	// must never do: its figures would be those of refusals, so the run fails.
	if n := keyedErrors(scenarios, results); n > 0 {
		err = errors.Join(err, fmt.Errorf("%d requests with a client key failed (non-200: a 429 is a limit refusing, which the suite's limits must never do)", n))
	}
	return err
}

// keyedErrors counts the failed requests (non-200 or no answer) of the scenarios with client
// keys, over every round and concurrency.
func keyedErrors(scenarios []scenario, results map[string][]Result) int {
	n := 0
	for _, s := range scenarios {
		if len(s.keys) == 0 {
			continue
		}
		for _, c := range suiteConcurrency {
			for _, r := range results[resultKey(s, c)] {
				n += r.Errors
			}
		}
	}
	return n
}

// chatPath is the route the suite loads.
const chatPath = "/v1/chat/completions"

// suiteRun is one run of the load comparison: the processes it started and their addresses.
type suiteRun struct {
	bin, dbURL string
	procs      []*exec.Cmd
	pids       map[string]int // a proxy's address -> its pid, for CPU accounting
	// postmasters: a wsproxy's address -> the postmaster's pid of its Postgres (the durable
	// cluster or the one with fsync off), whose CPU its scenarios are charged with.
	postmasters map[string]int
	// dbs: a paired scenario's wsproxy's address -> the name of its database.
	dbs map[string]string
	up  string // the fast fake upstream
}

func (st *suiteRun) stop() {
	for _, p := range st.procs {
		stop(p)
	}
}

// spawn starts this program with args and returns the address it listens on.
func (st *suiteRun) spawn(args ...string) (string, error) {
	addr, cmd, err := spawnSelf(nil, args...)
	if err != nil {
		return "", err
	}
	st.procs = append(st.procs, cmd)
	return addr, nil
}

// floor starts a Floor (load floor, with args) in front of the fast upstream on the durable
// cluster, its CPU and its Postgres's counted as a proxy's.
func (st *suiteRun) floor(args ...string) (string, error) {
	addr, cmd, err := spawnSelf([]string{"DATABASE_URL=" + st.dbURL}, append([]string{"floor", "-target", "http://" + st.up + chatPath}, args...)...)
	if err != nil {
		return "", err
	}
	return addr, st.counted(addr, cmd, st.dbURL)
}

// counted keeps cmd, serving at addr on dbURL, to stop with the run, and counts its CPU and its
// Postgres's for its scenarios.
func (st *suiteRun) counted(addr string, cmd *exec.Cmd, dbURL string) error {
	st.procs = append(st.procs, cmd)
	st.pids[addr] = cmd.Process.Pid
	var err error
	st.postmasters[addr], err = postmasterPID(dbURL)
	return err
}

// proxy starts a wsproxy in front of upstream on dbURL, with env added. Every one has an
// UPSTREAM_API_KEY, which the keyed one (CLIENT_KEYS) needs, so that the setups compared differ
// by the client keys only.
func (st *suiteRun) proxy(upstream, dbURL string, env ...string) (string, *exec.Cmd, error) {
	addr, cmd, err := startWsproxy(st.bin, append([]string{"DATABASE_URL=" + dbURL, "UPSTREAM_BASE_URL=http://" + upstream + "/v1",
		"UPSTREAM_API_KEY=sk-load-upstream", "ADMIN_TOKEN=" + adminToken, "LOG_LEVEL=warn"}, env...)...)
	if err != nil {
		return "", nil, err
	}
	if err := st.counted(addr, cmd, dbURL); err != nil {
		return "", nil, err
	}
	return addr, cmd, nil
}

// start starts the upstreams, the bare proxy and the wsproxies, and returns the scenarios.
func (st *suiteRun) start(fastURL string) ([]scenario, error) {
	var err error
	if st.up, err = st.spawn("upstream"); err != nil {
		return nil, err
	}
	toolUp, err := st.spawn("upstream", "-tool-round")
	if err != nil {
		return nil, err
	}
	bare, err := st.spawn("bareproxy", "-target", "http://"+st.up)
	if err != nil {
		return nil, err
	}
	st.pids[bare] = st.procs[len(st.procs)-1].Process.Pid
	ws, _, err := st.proxy(st.up, st.dbURL)
	if err != nil {
		return nil, err
	}
	// The thread turns compared across the two clusters each have a process of their own, used
	// for nothing else.
	wsTurn, _, err := st.proxy(st.up, st.dbURL)
	if err != nil {
		return nil, err
	}
	wsFast, _, err := st.proxy(st.up, fastURL)
	if err != nil {
		return nil, err
	}
	wsTool, _, err := st.proxy(toolUp, st.dbURL)
	if err != nil {
		return nil, err
	}
	for c := range 32 {
		if err := seed("http://"+wsTool, fmt.Sprintf("tool-%d", c)); err != nil {
			return nil, err
		}
	}
	if err := seedScopes("http://" + wsTurn); err != nil {
		return nil, err
	}
	wsKey, keys, err := st.keyedProxy()
	if err != nil {
		return nil, err
	}
	// Its twin without clients, on a fresh database of its own too, so that the two compared
	// differ by the keys only (not by the size of their tables).
	plainURL, err := sideDatabase(st.dbURL, plainDatabase)
	if err != nil {
		return nil, err
	}
	wsPlain, _, err := st.proxy(st.up, plainURL)
	if err != nil {
		return nil, err
	}
	st.dbs[wsPlain] = plainDatabase
	floorTurn, err := st.floor()
	if err != nil {
		return nil, err
	}
	floorTool, err := st.floor("-tool-round")
	if err != nil {
		return nil, err
	}
	return []scenario{
		{"direct", "http://" + st.up + chatPath, "", false, nil, nil, false},
		{"bare proxy", "http://" + bare + chatPath, "", false, nil, nil, false},
		{"wsproxy pass-through", "http://" + ws + chatPath, "", false, nil, nil, false},
		{"wsproxy thread turn", "http://" + wsTurn + chatPath, "turn", false, nil, nil, false},
		{"wsproxy thread turn, fsync off", "http://" + wsFast + chatPath, "turn", false, nil, nil, false},
		{"wsproxy one tool round", "http://" + wsTool + chatPath, "tool", false, nil, nil, false},
		{"direct, streamed", "http://" + st.up + chatPath, "", true, nil, nil, false},
		{"bare proxy, streamed", "http://" + bare + chatPath, "", true, nil, nil, false},
		{"wsproxy pass-through, streamed", "http://" + ws + chatPath, "", true, nil, nil, false},
		{"wsproxy thread turn, streamed", "http://" + ws + chatPath, "turn", true, nil, nil, false},
		{"wsproxy thread turn, 2 parents", "http://" + wsTurn + chatPath, "scoped", false, nil, nil, false},
		{"floor thread turn", "http://" + floorTurn + chatPath, "floor-turn", false, nil, nil, false},
		{"floor one tool round", "http://" + floorTool + chatPath, "floor-tool", false, nil, nil, false},
		{"wsproxy turn, 20 tool results", "http://" + wsTurn + chatPath, "tainted", false, ConversationBody(20, true, false), nil, false},
		{"wsproxy turn, 20 user messages", "http://" + wsTurn + chatPath, "untainted", false, ConversationBody(20, false, false), nil, false},
		// The thread turn and the pass-through again, each load client with a key of its own
		// and limits that never refuse (keyedProxy), beside the same on a twin without clients:
		// what clients and limits cost a request. Each pair runs at the same time (runPair).
		{"wsproxy thread turn, no key, own database", "http://" + wsPlain + chatPath, "turn", false, nil, nil, true},
		{"wsproxy thread turn, client key + limits", "http://" + wsKey + chatPath, "turn", false, nil, keys, false},
		{"wsproxy pass-through, no key, own database", "http://" + wsPlain + chatPath, "", false, nil, nil, true},
		{"wsproxy pass-through, client key + limits", "http://" + wsKey + chatPath, "", false, nil, keys, false},
	}, nil
}

// The databases of the keyed wsproxy and of its twin without clients, beside the durable
// cluster's.
const (
	keyedDatabase = "wsproxy_load_keyed"
	plainDatabase = "wsproxy_load_plain"
)

// keyedClients is how many clients the keyed wsproxy has: one for each load client at 32, as an
// organisation gives each developer or service a key of its own (at 1 client, load-0 alone).
const keyedClients = 32

// keyedProxy starts a wsproxy like the others, on a database of its own in the durable cluster
// (once a client exists, every /v1 request of that database's wsproxies needs a key, docs/spec.md
// §20), with CLIENT_KEYS seeding the clients load-0 … load-31, and gives each, over the admin
// REST, a requests_per_minute and a tokens_per_day far above what the run makes: every request
// is counted and checked against them and none is refused. It returns the address and the keys.
func (st *suiteRun) keyedProxy() (string, []string, error) {
	dbURL, err := sideDatabase(st.dbURL, keyedDatabase)
	if err != nil {
		return "", nil, err
	}
	keys := make([]string, keyedClients)
	entries := make([]string, keyedClients)
	for i := range keys {
		keys[i] = fmt.Sprintf("load-client-key-%02d-0123456789", i)
		entries[i] = fmt.Sprintf("load-%d=%s", i, keys[i])
	}
	addr, _, err := st.proxy(st.up, dbURL, "CLIENT_KEYS="+strings.Join(entries, ","))
	if err != nil {
		return "", nil, err
	}
	st.dbs[addr] = keyedDatabase
	for i := range keys {
		req, _ := http.NewRequest("PATCH", fmt.Sprintf("http://%s/admin/v1/clients/load-%d", addr, i),
			strings.NewReader(`{"limits":{"requests_per_minute":1000000000,"tokens_per_day":1000000000000}}`))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", nil, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var got struct {
			Limits struct {
				RequestsPerMinute *int64 `json:"requests_per_minute"`
				TokensPerDay      *int64 `json:"tokens_per_day"`
			} `json:"limits"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &got) != nil || got.Limits.RequestsPerMinute == nil || got.Limits.TokensPerDay == nil {
			return "", nil, fmt.Errorf("set load-%d's limits: %s %s", i, resp.Status, b)
		}
	}
	return addr, keys, nil
}

// sideDatabase creates the database name beside dbURL's, in the same cluster (its Postgres CPU
// is the same postmaster's), when it is missing, and returns its URL.
func sideDatabase(dbURL, name string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("the suite needs DATABASE_URL as a postgres:// URL, to make a database beside it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			return "", err
		}
	}
	u.Path = "/" + name
	return u.String(), nil
}

// suiteConcurrency are the client counts of every scenario.
var suiteConcurrency = []int{1, 32}

func resultKey(s scenario, c int) string { return s.name + "@" + strconv.Itoa(c) }

// pid is the pid of a scenario's proxy (0 for the direct upstream).
func (st *suiteRun) pid(s scenario) int { return st.pids[s.addr()] }

// sample is the CPU time so far of a scenario's proxy and of its Postgres (none for the direct
// upstream and the bare proxy).
func (st *suiteRun) sample(s scenario) cpuSample {
	return cpuSample{proxy: procCPU(st.pid(s)), postgres: postgresCPU(st.postmasters[s.addr()])}
}

// addr is the address of the scenario's server.
func (s scenario) addr() string {
	return strings.TrimSuffix(strings.TrimPrefix(s.url, "http://"), chatPath)
}

// run runs every scenario at every concurrency, interleaved over rounds (the thread turns on the
// durable and the fsync-off cluster in turn first); it returns the results and the CPU per
// request at 32 clients.
func (st *suiteRun) run(ctx context.Context, scenarios []scenario, rounds int, d time.Duration, size int) (map[string][]Result, map[string][]cpuCost, error) {
	results := map[string][]Result{}
	cpu := map[string][]cpuCost{}
	fmt.Printf("%d rounds of %d scenarios x %v clients, %s each, %d-byte requests\n", rounds, len(scenarios), suiteConcurrency, d, size)
	for r := 1; r <= rounds; r++ {
		order := slices.Clone(scenarios)
		if r%2 == 0 { // the thread turns on the two clusters take turns going first
			order[3], order[4] = order[4], order[3]
		}
		// record keeps a scenario's result and, at 32 clients, its CPU a request.
		record := func(s scenario, c int, res Result, cost func() cpuCost) {
			results[resultKey(s, c)] = append(results[resultKey(s, c)], res)
			if c == 32 && res.Requests > 0 {
				cpu[s.name] = append(cpu[s.name], cost())
			}
			fmt.Printf("round %d  %-42s c=%-2d %s\n", r, s.name, c, res)
		}
		for i := 0; i < len(order); i++ {
			s := order[i]
			for _, c := range suiteConcurrency {
				if err := ctx.Err(); err != nil {
					return nil, nil, err
				}
				if s.pair {
					b := order[i+1]
					ra, rb, ca, cb := st.runPair(ctx, s, b, c, d, size)
					record(s, c, ra, func() cpuCost { return ca })
					record(b, c, rb, func() cpuCost { return cb })
					continue
				}
				before := st.sample(s)
				res := s.load(c, d, size).Run(ctx)
				record(s, c, res, func() cpuCost { return st.sample(s).since(before, res.Requests) })
			}
			if s.pair {
				i++
			}
		}
	}
	return results, cpu, nil
}

// load is the scenario's load of c clients for d, its requests of size bytes unless it has a
// body of its own.
func (s scenario) load(c int, d time.Duration, size int) Load {
	body := s.body
	if body == nil {
		body = RequestBody(size, s.stream)
	}
	return Load{URL: s.url, Clients: c, Duration: d, Stream: s.stream, ThreadPrefix: s.thread, Body: body, Keys: s.keys}
}

// runPair runs a and b at the same time, c clients each, and returns their results and CPU per
// request: each wsproxy's own, and its Postgres's as the CPU of the backends of its database
// (dbCPU). Run one after the other, two setups compared drifted apart by more than the few per
// cent compared: the machine's state moves between runs of seconds. At once, they share it.
func (st *suiteRun) runPair(ctx context.Context, a, b scenario, c int, d time.Duration, size int) (ra, rb Result, ca, cb cpuCost) {
	// One connection samples both databases' backends, before and after.
	conn, err := pgx.Connect(ctx, st.dbURL)
	if err != nil {
		conn = nil // no Postgres figure: dbCPU reads none
	} else {
		defer conn.Close(context.WithoutCancel(ctx))
	}
	pa, pb := st.pid(a), st.pid(b)
	ba, bb := dbCPU(ctx, conn, st.dbs[a.addr()]), dbCPU(ctx, conn, st.dbs[b.addr()])
	pba, pbb := procCPU(pa), procCPU(pb)
	done := make(chan Result)
	go func() {
		done <- b.load(c, d, size).Run(ctx)
	}()
	ra = a.load(c, d, size).Run(ctx)
	rb = <-done
	pga, pgb := dbCPUSince(ba, dbCPU(ctx, conn, st.dbs[a.addr()])), dbCPUSince(bb, dbCPU(ctx, conn, st.dbs[b.addr()]))
	if ra.Requests > 0 {
		ca = cpuCost{proxy: (procCPU(pa) - pba) / time.Duration(ra.Requests), postgres: pga / time.Duration(ra.Requests)}
	}
	if rb.Requests > 0 {
		cb = cpuCost{proxy: (procCPU(pb) - pbb) / time.Duration(rb.Requests), postgres: pgb / time.Duration(rb.Requests)}
	}
	return ra, rb, ca, cb
}

// dbCPU is the CPU time so far of each backend connected to database name, by pid, as conn's
// cluster lists them (none without conn).
func dbCPU(ctx context.Context, conn *pgx.Conn, name string) map[int]time.Duration {
	out := map[int]time.Duration{}
	if conn == nil {
		return out
	}
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = $1", name)
	if err != nil {
		return out
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return out
	}
	for _, pid := range pids {
		if ps, ok := readProcStat(int(pid)); ok {
			out[int(pid)] = ps.cpu
		}
	}
	return out
}

// dbCPUSince is the CPU the backends of after used since before: a backend that began meanwhile
// counts whole (a backend that ended meanwhile is lost: a wsproxy's pool keeps its connections).
func dbCPUSince(before, after map[int]time.Duration) time.Duration {
	var total time.Duration
	for pid, cpu := range after {
		total += cpu - before[pid]
	}
	return total
}

// report prints the medians, the CPU per request and the targets.
func (st *suiteRun) report(scenarios []scenario, rounds int, results map[string][]Result, cpu map[string][]cpuCost) {
	med := func(s scenario, c int) Result { return median(results[resultKey(s, c)]) }
	fmt.Printf("\nMedians over %d rounds (ratios: to direct / to the bare proxy)\n", rounds)
	fmt.Printf("%-42s %10s %12s %12s %12s %14s %12s\n", "scenario", "p50 c=1", "added p50", "ttfb50 c=1", "req/s c=32", "% of direct", "% of bare")
	direct := map[bool]scenario{false: scenarios[0], true: scenarios[6]}
	bareS := map[bool]scenario{false: scenarios[1], true: scenarios[7]}
	for _, s := range scenarios {
		m1, m32 := med(s, 1), med(s, 32)
		d1, d32 := med(direct[s.stream], 1), med(direct[s.stream], 32)
		b32 := med(bareS[s.stream], 32)
		fmt.Printf("%-42s %10s %12s %12s %12.0f %13.1f%% %11.1f%%\n", s.name, dur(m1.P50), dur(m1.P50-d1.P50), dur(m1.TTFB50),
			m32.RPS, 100*m32.RPS/d32.RPS, 100*m32.RPS/b32.RPS)
	}

	fmt.Printf("\nCPU per request at 32 clients (medians; the whole machine has 2 cores)\n")
	fmt.Printf("%-42s %14s %14s\n", "scenario", "proxy", "postgres")
	for _, s := range scenarios {
		if c := cpu[s.name]; len(c) > 0 && st.pid(s) != 0 {
			m := medianCPU(c)
			fmt.Printf("%-42s %14s %14s\n", s.name, dur(m.proxy), dur(m.postgres))
		}
	}

	pass, bareN, turn, turnFast := scenarios[2], scenarios[1], scenarios[3], scenarios[4]
	passS, bareSt := scenarios[8], scenarios[7]
	// The floor under a target (Floor) is printed beside it: what the least a Go proxy in front
	// of Postgres does costs on this machine, in this run.
	floorTurn, floorTool := scenarios[11], scenarios[12]
	d1 := med(scenarios[0], 1).P50
	fmt.Println("\nTargets")
	check("pass-through adds no more p50 (c=1) than the bare proxy", med(pass, 1).P50-d1 <= med(bareN, 1).P50-d1,
		fmt.Sprintf("%s vs %s", dur(med(pass, 1).P50-d1), dur(med(bareN, 1).P50-d1)))
	check("pass-through keeps the bare proxy's throughput (c=32)", med(pass, 32).RPS >= med(bareN, 32).RPS,
		fmt.Sprintf("%.0f vs %.0f req/s (%.1f%%)", med(pass, 32).RPS, med(bareN, 32).RPS, 100*med(pass, 32).RPS/med(bareN, 32).RPS))
	check("pass-through first streamed byte no later than the bare proxy's (c=1)", med(passS, 1).TTFB50 <= med(bareSt, 1).TTFB50,
		fmt.Sprintf("%s vs %s", dur(med(passS, 1).TTFB50), dur(med(bareSt, 1).TTFB50)))
	check("a thread turn adds at most 300µs p50 over pass-through (c=1, Postgres with fsync on)", med(turn, 1).P50-med(pass, 1).P50 <= 300*time.Microsecond,
		fmt.Sprintf("%s (the floor's thread turn: %s over the bare proxy)", dur(med(turn, 1).P50-med(pass, 1).P50), dur(med(floorTurn, 1).P50-med(bareN, 1).P50)))
	// The CPU a request costs the proxy and Postgres together (issue 37), and the pass-through's
	// against the bare proxy's: 0.90x in 0.3.0's run (103 vs 114 µs).
	together := func(s scenario) (time.Duration, bool) {
		m := medianCPU(cpu[s.name])
		return m.proxy + m.postgres, len(cpu[s.name]) > 0
	}
	if c, ok := together(turn); ok {
		detail := dur(c)
		if f, ok := together(floorTurn); ok {
			detail += fmt.Sprintf(" (the floor's: %s; %.2fx)", dur(f), float64(c)/float64(f))
		}
		check("a thread turn costs at most 250µs of proxy and Postgres CPU (c=32)", c <= 250*time.Microsecond, detail)
	}
	// A tool round's CPU is printed beside the floor's, without a target: the floor alone
	// measured 520-761 µs against the 650 µs of issue 37's, which #51 retired (BENCHMARKS.md).
	if c, ok := together(scenarios[5]); ok {
		if f, ok := together(floorTool); ok {
			fmt.Printf("  [INFO] a turn with one tool round costs %s of proxy and Postgres CPU (c=32): the floor's %s; %.2fx\n", dur(c), dur(f), float64(c)/float64(f))
		}
	}
	// Classifying what the model read rides the parse a turn already makes (docs/spec.md §19):
	// a conversation of 20 tool results costs what the same conversation in the user's words does.
	if c, ok := together(scenarios[13]); ok {
		if u, ok := together(scenarios[14]); ok {
			check("a thread turn that read 20 tool results costs at most 5% more CPU than the same conversation in the user's words (c=32)",
				float64(c) <= 1.05*float64(u), fmt.Sprintf("%s vs %s (%.3fx)", dur(c), dur(u), float64(c)/float64(u)))
		}
	}
	// A client key is found by its hash in memory and each request counted against its client's
	// limits in memory, the counts written once a second (docs/spec.md §20): the same request
	// with a key and limits, against it without, on otherwise equal wsproxies, each on a
	// database of its own in the same cluster, the two at the same time (runPair). A keyed
	// request that failed (a 429 among them) is a MISS.
	plainTurn, keyTurn, plainPass, keyPass := scenarios[15], scenarios[16], scenarios[17], scenarios[18]
	rt, okT := pairedRatio(cpu[keyTurn.name], cpu[plainTurn.name])
	rp, okP := pairedRatio(cpu[keyPass.name], cpu[plainPass.name])
	const keyedTarget = "a thread turn and a pass-through with a client key and limits cost at most 1.03x the CPU of the same without (c=32)"
	if !okT || !okP {
		check(keyedTarget, false, fmt.Sprintf("no CPU figure in some round (%d keyed requests failed)", keyedErrors(scenarios, results)))
	} else {
		kt, _ := together(keyTurn)
		t, _ := together(plainTurn)
		kp, _ := together(keyPass)
		p, _ := together(plainPass)
		errs := keyedErrors(scenarios, results)
		detail := fmt.Sprintf("thread turn %s vs %s (%.3fx; rounds %s), pass-through %s vs %s (%.3fx; rounds %s): each ratio the median of the rounds', the two run at the same time",
			dur(kt), dur(t), rt, ratios(roundRatios(cpu[keyTurn.name], cpu[plainTurn.name])),
			dur(kp), dur(p), rp, ratios(roundRatios(cpu[keyPass.name], cpu[plainPass.name])))
		if errs > 0 {
			detail += fmt.Sprintf("; %d keyed requests failed (non-200)", errs)
		}
		check(keyedTarget, rt <= 1.03 && rp <= 1.03 && errs == 0, detail)
	}
	if c, ok := together(pass); ok {
		if bare, ok := together(bareN); ok {
			check("pass-through costs at most 0.90x the bare proxy's CPU (c=32)", float64(c) <= 0.9*float64(bare),
				fmt.Sprintf("%s vs %s (%.2fx)", dur(c), dur(bare), float64(c)/float64(bare)))
		}
	}
	check("a thread turn with fsync on keeps at least 90% of its throughput with fsync off (c=32)", med(turn, 32).RPS >= 0.9*med(turnFast, 32).RPS,
		fmt.Sprintf("%.0f vs %.0f req/s (%.1f%%)", med(turn, 32).RPS, med(turnFast, 32).RPS, 100*med(turn, 32).RPS/med(turnFast, 32).RPS))
	check("a thread turn keeps at least 40% of pass-through throughput (c=32)", med(turn, 32).RPS >= 0.4*med(pass, 32).RPS,
		fmt.Sprintf("%.1f%%", 100*med(turn, 32).RPS/med(pass, 32).RPS))
	scoped := scenarios[10]
	check("a thread turn with two parents (five items each) keeps at least 90% of a thread turn's throughput (c=32)",
		med(scoped, 32).RPS >= 0.9*med(turn, 32).RPS,
		fmt.Sprintf("%.0f vs %.0f req/s (%.1f%%)", med(scoped, 32).RPS, med(turn, 32).RPS, 100*med(scoped, 32).RPS/med(turn, 32).RPS))
}

// memory measures a fresh wsproxy, warmed up, through one 10 MB streamed thread turn.
func (st *suiteRun) memory(ctx context.Context, size int) error {
	memProxy, cmd, err := st.proxy(st.up, st.dbURL)
	if err != nil {
		return err
	}
	warm := Load{URL: "http://" + memProxy + chatPath, Clients: 2, Duration: time.Second, Stream: true, ThreadPrefix: "mem", Body: RequestBody(size, true)}
	warm.Run(ctx)
	before, err := peakRSS(cmd.Process.Pid)
	if err != nil {
		return err
	}
	big := Load{URL: "http://" + memProxy + chatPath, Clients: 1, Duration: time.Nanosecond, Stream: true, ThreadPrefix: "mem",
		Body: []byte(`{"model":"bench","stream":true,"big_stream":true,"messages":[{"role":"user","content":"long"}]}`)}
	n, err := oneRequest(big)
	if err != nil {
		return err
	}
	after, err := peakRSS(cmd.Process.Pid)
	if err != nil {
		return err
	}
	check("a 10 MB streamed response raises peak RSS by less than 5 MB", after-before < 5<<20,
		fmt.Sprintf("%.1f MB streamed; peak RSS %.1f MB -> %.1f MB (+%.2f MB)", float64(n)/(1<<20), mb(before), mb(after), mb(after-before)))
	return nil
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

func check(what string, ok bool, figures string) {
	verdict := "MET "
	if !ok {
		verdict = "MISS"
	}
	fmt.Printf("  [%s] %s: %s\n", verdict, what, figures)
}

func dur(d time.Duration) string {
	if d < 0 {
		return "-" + (-d).Round(time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// median takes, per figure, the median over rounds.
func median(rs []Result) Result {
	pick := func(f func(Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return Result{
		RPS:    pick(func(r Result) float64 { return r.RPS }),
		P50:    time.Duration(pick(func(r Result) float64 { return float64(r.P50) })),
		P90:    time.Duration(pick(func(r Result) float64 { return float64(r.P90) })),
		P99:    time.Duration(pick(func(r Result) float64 { return float64(r.P99) })),
		TTFB50: time.Duration(pick(func(r Result) float64 { return float64(r.TTFB50) })),
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func waitReady(url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after 30s", url)
}

// adminToken is the admin token of the wsproxy a load run starts (20 characters at least, as
// every token must be).
const adminToken = "load-admin-token-0123456789"

// seed gives a thread one preference, for the tool round to update.
func seed(base, thread string) error {
	req, _ := http.NewRequest("POST", base+"/admin/v1/threads/"+thread+"/preferences", strings.NewReader(`{"title":"Soil carbon"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 201 && resp.StatusCode != 409 {
		return fmt.Errorf("seed %s: %s", thread, resp.Status)
	}
	return nil
}

// seedScopes gives the threads scoped-0 … scoped-31 two parents, scope-a and scope-b, of five
// preferences each (docs/spec.md §17).
func seedScopes(base string) error {
	admin := func(method, path, body string, ok ...int) error {
		req, _ := http.NewRequest(method, base+"/admin/v1/threads/"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if !slices.Contains(ok, resp.StatusCode) {
			return fmt.Errorf("seed scopes: %s %s: %s", method, path, resp.Status)
		}
		return nil
	}
	for _, scope := range []string{"scope-a", "scope-b"} {
		for i := range 5 {
			if err := admin("POST", scope+"/preferences", fmt.Sprintf(`{"title":"%s rule %d"}`, scope, i), 201, 409); err != nil {
				return err
			}
		}
	}
	for c := range 32 {
		if err := admin("PUT", fmt.Sprintf("scoped-%d/parents", c), `{"parents":["scope-a","scope-b"]}`, 200); err != nil {
			return err
		}
	}
	return nil
}

// oneRequest sends the load's request once and returns the bytes of the response body.
func oneRequest(l Load) (int64, error) {
	req, _ := http.NewRequest("POST", l.URL, strings.NewReader(string(l.Body)))
	req.Header.Set("X-Thread-Id", l.ThreadPrefix+"-big")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return io.Copy(io.Discard, resp.Body)
}

// peakRSS is a process's peak resident set size (VmHWM), in bytes.
func peakRSS(pid int) (int64, error) { return procStatus(pid, "VmHWM:") }

// cpuSample is the CPU time used so far by a scenario's proxy and by its Postgres.
type cpuSample struct{ proxy, postgres time.Duration }

// cpuCost is CPU time per request.
type cpuCost struct{ proxy, postgres time.Duration }

func (s cpuSample) since(before cpuSample, requests int) cpuCost {
	return cpuCost{proxy: (s.proxy - before.proxy) / time.Duration(requests), postgres: (s.postgres - before.postgres) / time.Duration(requests)}
}

// pairedRatio is the median over rounds of a's CPU (proxy and Postgres) a request to b's, round
// by round (roundRatios): two scenarios run side by side in each round share that round's state
// of the machine, which moves more between rounds than a few per cent. ok is false unless both
// have a figure for every round. Of an even count, the mean of the middle two.
func pairedRatio(a, b []cpuCost) (float64, bool) {
	r := roundRatios(a, b)
	if r == nil {
		return 0, false
	}
	r = slices.Sorted(slices.Values(r))
	if n := len(r); n%2 == 0 {
		return (r[n/2-1] + r[n/2]) / 2, true
	}
	return r[len(r)/2], true
}

// roundRatios is each round's ratio of a's CPU a request (proxy and Postgres) to b's; nil
// unless both have a figure for every round.
func roundRatios(a, b []cpuCost) []float64 {
	if len(a) == 0 || len(a) != len(b) {
		return nil
	}
	r := make([]float64, len(a))
	for i := range a {
		den := b[i].proxy + b[i].postgres
		if den <= 0 {
			return nil
		}
		r[i] = float64(a[i].proxy+a[i].postgres) / float64(den)
	}
	return r
}

// ratios prints a few ratios as a list: 1.02, 0.97, 1.05.
func ratios(r []float64) string {
	s := make([]string, len(r))
	for i, v := range r {
		s[i] = fmt.Sprintf("%.2f", v)
	}
	return strings.Join(s, ", ")
}

func medianCPU(cs []cpuCost) cpuCost {
	p := make([]time.Duration, len(cs))
	g := make([]time.Duration, len(cs))
	for i, c := range cs {
		p[i], g[i] = c.proxy, c.postgres
	}
	slices.Sort(p)
	slices.Sort(g)
	return cpuCost{p[len(p)/2], g[len(g)/2]}
}

// startWsproxy starts the wsproxy binary on a free loopback port, with env added to this
// process's environment, and waits until it is ready. The caller stops it.
func startWsproxy(bin string, env ...string) (string, *exec.Cmd, error) {
	addr, err := freeAddr()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), "LISTEN_ADDR="+addr), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	if err := waitReady("http://" + addr + "/readyz"); err != nil {
		stop(cmd)
		return "", nil, err
	}
	return addr, cmd, nil
}

// stop interrupts a process and waits for it, killing it if it has not exited in 10 s.
func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}
