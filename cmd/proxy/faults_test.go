package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db"
	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/demo"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

const faultsAdminToken = "faults-admin-token-0123456789"

// wsproxyBinary builds cmd/proxy into the test's temporary folder.
func wsproxyBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "wsproxy")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// replicaProcess is a wsproxy process a test started.
type replicaProcess struct {
	addr string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startReplica starts the wsproxy binary on a free loopback port with env, waits for /readyz,
// and kills it when the test ends.
func startReplica(t *testing.T, bin string, env ...string) *replicaProcess {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	r := &replicaProcess{addr: addr, cmd: exec.Command(bin), out: &syncBuffer{}, done: make(chan struct{})}
	r.cmd.Env = append(os.Environ(), append([]string{"LISTEN_ADDR=" + addr, "ADMIN_TOKEN=" + faultsAdminToken, "LOG_LEVEL=warn"}, env...)...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	require.NoError(t, r.cmd.Start())
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() { _ = r.cmd.Process.Kill(); <-r.done })
	require.Eventually(t, func() bool {
		select {
		case <-r.done:
			return true
		default:
		}
		return ready(addr)
	}, time.Minute, 50*time.Millisecond)
	select {
	case <-r.done:
		t.Fatalf("wsproxy exited:\n%s", r.out.String())
	default:
	}
	return r
}

// threadTurnAt posts a non-streamed chat turn of thread to the replica at addr.
func threadTurnAt(ctx context.Context, addr, thread, text string) (int, string, error) {
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, text)
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Thread-Id", thread)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// adminGetAt reads an admin REST path of the replica at addr into out.
func adminGetAt(t *testing.T, addr, path string, out any) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+faultsAdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, 200, resp.StatusCode, "%s: %s", path, b)
	require.NoError(t, json.Unmarshal(b, out), string(b))
}

// threadRecord is what the admin REST shows of a thread's workspace, its tool calls and events.
type threadRecord struct {
	Preferences []struct {
		ID       int64  `json:"id"`
		Title    string `json:"title"`
		Subtitle string `json:"subtitle"`
	}
	Calls []struct {
		ID   int64  `json:"id"`
		Turn *int   `json:"turn"`
		Tool string `json:"tool"`
		OK   bool   `json:"ok"`
	}
	Events []struct {
		ID         int64  `json:"id"`
		Actor      string `json:"actor"`
		Kind       string `json:"kind"`
		Turn       *int   `json:"turn"`
		ToolCallID *int64 `json:"tool_call_id"`
	}
}

func readThreadRecord(t *testing.T, addr, thread string) threadRecord {
	t.Helper()
	var rec threadRecord
	var ws struct {
		Preferences json.RawMessage `json:"preferences"`
	}
	adminGetAt(t, addr, "/admin/v1/threads/"+thread, &ws)
	require.NoError(t, json.Unmarshal(ws.Preferences, &rec.Preferences))
	var calls struct {
		Data json.RawMessage `json:"data"`
	}
	adminGetAt(t, addr, "/admin/v1/threads/"+thread+"/tool-calls?limit=500", &calls)
	require.NoError(t, json.Unmarshal(calls.Data, &rec.Calls))
	var events struct {
		Data json.RawMessage `json:"data"`
	}
	adminGetAt(t, addr, "/admin/v1/threads/"+thread+"/events?limit=500", &events)
	require.NoError(t, json.Unmarshal(events.Data, &rec.Events))
	return rec
}

// requireNothingPartial: every change a tool call reported is there with its events, and every
// agent event names a recorded call.
func (rec threadRecord) requireNothingPartial(t *testing.T) {
	t.Helper()
	calls := map[int64]bool{}
	for _, c := range rec.Calls {
		calls[c.ID] = true
	}
	withEvents := map[int64]bool{}
	for _, e := range rec.Events {
		if e.Actor != "agent" {
			continue
		}
		require.NotNil(t, e.ToolCallID, "agent event %d names its call", e.ID)
		require.True(t, calls[*e.ToolCallID], "agent event %d's call %d is recorded", e.ID, *e.ToolCallID)
		withEvents[*e.ToolCallID] = true
	}
	for _, c := range rec.Calls {
		if c.OK && c.Tool != "view" {
			require.True(t, withEvents[c.ID], "call %d (%s) has its events", c.ID, c.Tool)
		}
	}
}

// killModel is the model of TestReplicaKilledMidToolRound: "first" records a preference;
// "second" answers one round of two calls — a preference added, then the first one updated;
// any other message, and the round after the tools, a text.
func killModel() http.Handler {
	return fake.New(fake.Options{Script: func(req *fake.Request) fake.Answer {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == "tool" {
			return fake.Answer{Text: "done"}
		}
		switch demo.ClientText(last.Text()) {
		case "first":
			return fake.Answer{Calls: []fake.Call{{ID: "call_first", Name: "add_preferences",
				Arguments: `{"items":[{"title":"first"}],"action_and_reasoning":"kill test"}`}}}
		case "second":
			return fake.Answer{Calls: []fake.Call{
				{ID: "call_add", Name: "add_preferences", Arguments: `{"items":[{"title":"second"}],"action_and_reasoning":"kill test"}`},
				{ID: "call_update", Name: "update_preferences", Arguments: `{"updates":[{"index":1,"subtitle":"never"}],"action_and_reasoning":"kill test"}`},
			}}
		}
		return fake.Answer{Text: "ok"}
	}})
}

// TestReplicaKilledMidToolRound: two wsproxy processes on one Postgres serve the same thread.
// Replica A runs a round of two calls; the first commits; the second, inside its transaction
// (the thread's row lock held), waits on a preference row the test holds — the deterministic
// point — and A is killed with SIGKILL there. The thread's next turn on replica B succeeds
// within idle_in_transaction_session_timeout (db.IdleTimeout) plus a second of the kill; the
// killed round's committed call is there with its events, the one cut off left nothing.
func TestReplicaKilledMidToolRound(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(killModel())
	defer up.Close()
	dbURL := dbtest.SchemaURL(t)
	env := []string{"DATABASE_URL=" + dbURL, "UPSTREAM_BASE_URL=" + up.URL + "/v1"}
	bin := wsproxyBinary(t)
	a, b := startReplica(t, bin, env...), startReplica(t, bin, env...)
	const thread = "killed-mid-round"
	ctx := context.Background()

	code, body, err := threadTurnAt(ctx, a.addr, thread, "first")
	require.NoError(t, err)
	require.Equal(t, 200, code, body)

	// The test's own transaction holds preference 1's row: A's update will wait for it after
	// taking the thread's row lock.
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
	var holder int
	require.NoError(t, hold.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holder))
	_, err = hold.Exec(ctx, "SELECT 1 FROM preferences WHERE thread_id = $1 AND id = 1 FOR UPDATE", thread)
	require.NoError(t, err)

	killed := make(chan struct{})
	go func() {
		defer close(killed)
		_, _, _ = threadTurnAt(ctx, a.addr, thread, "second") // cut off by the kill
	}()
	// A is inside the update's transaction once a backend waits on the test's lock.
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", holder).Scan(&n)
		return err == nil && n > 0
	}, time.Minute, 20*time.Millisecond, "replica A's update waits on the test's lock")

	require.NoError(t, a.cmd.Process.Kill())
	<-a.done
	at := time.Now()
	require.NoError(t, hold.Rollback(ctx)) // the test's lock, not A's: A's row lock is what must go
	<-killed

	code, body, err = threadTurnAt(ctx, b.addr, thread, "third")
	took := time.Since(at)
	require.NoError(t, err)
	require.Equal(t, 200, code, body)
	t.Logf("the thread's next turn on the other replica succeeded %v after the kill (bound: %v)", took.Round(time.Millisecond), db.IdleTimeout+time.Second)
	require.LessOrEqual(t, took, db.IdleTimeout+time.Second)

	rec := readThreadRecord(t, b.addr, thread)
	var titles []string
	for _, p := range rec.Preferences {
		titles = append(titles, p.Title)
		require.Empty(t, p.Subtitle, "the cut-off update changed nothing")
	}
	require.Equal(t, []string{"first", "second"}, titles, "the killed round's committed call is there")
	var tools []string
	for _, c := range rec.Calls {
		tools = append(tools, c.Tool)
	}
	require.Equal(t, []string{"add_preferences", "add_preferences"}, tools, "the cut-off call left no record")
	var kinds []string
	for _, e := range rec.Events {
		kinds = append(kinds, e.Kind)
	}
	require.Equal(t, []string{"preference_added", "preference_added"}, kinds)
	rec.requireNothingPartial(t)
}

// usageModel is a fake model whose turns record one preference (the user's message) in a tool
// round, and that counts the prompt tokens it reported per thread (the thread's name is the
// user message's first word): every round it answered, counted once.
type usageModel struct {
	http.Handler
	mu     sync.Mutex
	prompt map[string]int64
}

func newUsageModel() *usageModel {
	m := &usageModel{prompt: map[string]int64{}}
	m.Handler = fake.New(fake.Options{Script: func(req *fake.Request) fake.Answer {
		var user string
		for i := len(req.Messages) - 1; i >= 0; i-- {
			if req.Messages[i].Role == "user" {
				user = demo.ClientText(req.Messages[i].Text())
				break
			}
		}
		if !req.Stream || req.StreamOptions.IncludeUsage {
			thread, _, _ := strings.Cut(user, " ")
			m.mu.Lock()
			m.prompt[thread] += 300 // fake's fixed usage
			m.mu.Unlock()
		}
		if req.Messages[len(req.Messages)-1].Role == "tool" {
			return fake.Answer{Text: "noted"}
		}
		a, _ := json.Marshal(map[string]any{"items": []map[string]string{{"title": user}}, "action_and_reasoning": "bouncer test"})
		return fake.Answer{Calls: []fake.Call{{ID: "call_rec", Name: "add_preferences", Arguments: string(a)}}}
	}})
	return m
}

func (m *usageModel) promptTokens(thread string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.prompt[thread]
}

// pgBouncer is a PgBouncer of the test's own (scripts/pg.sh bouncer-start) in front of the test
// cluster, in transaction mode, which the test stops and starts again at the same place.
type pgBouncer struct {
	t   *testing.T
	dir string
	url string
}

func startPgBouncer(t *testing.T) *pgBouncer {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "wsproxy-bouncer-test.")
	require.NoError(t, err)
	b := &pgBouncer{t: t, dir: dir}
	b.start()
	t.Cleanup(func() { b.stop(); _ = os.RemoveAll(dir) })
	return b
}

func (b *pgBouncer) pgsh(args ...string) string {
	b.t.Helper()
	cmd := exec.Command("../../scripts/pg.sh", args...)
	cmd.Env = append(os.Environ(), "TEST_DATABASE_URL="+dbtest.URL(b.t))
	out, err := cmd.Output()
	var stderr []byte
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	require.NoError(b.t, err, "pg.sh %v: %s", args, stderr)
	return strings.TrimSpace(string(out))
}

func (b *pgBouncer) start() { b.url = b.pgsh("bouncer-start", b.dir) }
func (b *pgBouncer) stop()  { b.pgsh("bouncer-stop", b.dir, "immediate") }

// TestPgBouncerRestartedUnderLoad: wsproxy on a PgBouncer in transaction mode (its own, so
// that the test may restart it: the one of `pg.sh bouncer` is shared by the PGBOUNCER_TESTS),
// turns with a tool round streamed and not from several clients, and PgBouncer stopped at once
// (every connection closed) and started again on the same socket while they run. Every turn
// succeeds or fails cleanly — 503 workspace_unavailable, or a stream's error event — none is
// counted twice (every turn number is one turn's; a thread's usage is that of the rounds the
// model answered, once), every success's write is stored once, and turns succeed again after
// the restart on every client (pgx's statements of the new connections work).
func TestPgBouncerRestartedUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bouncer := startPgBouncer(t)
	// A database of its own: PgBouncer passes on no search_path.
	admin, err := pgxpool.New(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer admin.Close()
	name := fmt.Sprintf("bouncer_restart_%d", time.Now().UnixNano())
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)") })
	withDB := func(raw string) string {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		u.Path = "/" + name
		return u.String()
	}
	up := newUsageModel()
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	m, _ := MustRunMain(t, func(c *Config) {
		c.DatabaseURL = withDB(bouncer.url)
		c.UpstreamBaseURL = upSrv.URL + "/v1"
		c.AdminToken = faultsAdminToken
		c.LogLevel = "error"
	})
	addr := strings.TrimPrefix(m.URL, "http://")

	const clients = 6
	type tally struct {
		ok, failed     int
		okAfterRestart int
		titles         []string // the successes' messages
	}
	var (
		mu        sync.Mutex
		tallies   [clients]tally
		restarted = make(chan struct{})
		stop      = make(chan struct{})
		unclean   []string
	)
	totalOK := func() (n int) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range tallies {
			n += c.ok
		}
		return n
	}
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			thread := fmt.Sprintf("bouncer-%d", w)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				after := false
				select {
				case <-restarted:
					after = true
				default:
				}
				stream := n%2 == 1
				text := fmt.Sprintf("%s turn %d", thread, n)
				ok, clean, what := bouncerTurn(ctx, addr, thread, text, stream)
				mu.Lock()
				c := &tallies[w]
				switch {
				case ok:
					c.ok++
					c.titles = append(c.titles, text)
					if after {
						c.okAfterRestart++
					}
				case clean:
					c.failed++
				default:
					unclean = append(unclean, what)
				}
				mu.Unlock()
				if !ok {
					time.Sleep(20 * time.Millisecond) // a client's backoff before its next turn
				}
			}
		})
	}
	require.Eventually(t, func() bool { return totalOK() >= 2*clients }, 2*time.Minute, 10*time.Millisecond, "turns succeed through PgBouncer")
	before := totalOK()
	downAt := time.Now()
	bouncer.stop()
	bouncer.start()
	close(restarted)
	t.Logf("PgBouncer stopped at once and started again in %v, after %d good turns", time.Since(downAt).Round(time.Millisecond), before)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range tallies {
			if c.okAfterRestart < 2 {
				return false
			}
		}
		return true
	}, 2*time.Minute, 10*time.Millisecond, "every client's turns succeed again after the restart")
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, unclean, "every turn succeeded or failed cleanly")
	var ok, failed int
	for w, c := range tallies {
		ok, failed = ok+c.ok, failed+c.failed
		thread := fmt.Sprintf("bouncer-%d", w)
		rec := readThreadRecord(t, addr, thread)
		stored := map[string]int{}
		for _, p := range rec.Preferences {
			stored[p.Title]++
		}
		for title, n := range stored {
			require.Equal(t, 1, n, "%s stored once", title)
		}
		for _, title := range c.titles {
			require.Equal(t, 1, stored[title], "the write of the good turn %q is stored", title)
		}
		turns := map[int]bool{}
		for _, call := range rec.Calls {
			require.NotNil(t, call.Turn)
			require.False(t, turns[*call.Turn], "turn %d of %s is one turn's", *call.Turn, thread)
			turns[*call.Turn] = true
		}
		rec.requireNothingPartial(t)
		// The usage writer retries what failed; it must come to the model's count, not past it.
		want := up.promptTokens(thread)
		var got int64
		require.Eventually(t, func() bool {
			var d struct {
				Usage struct {
					PromptTokens int64 `json:"prompt_tokens"`
				} `json:"usage"`
			}
			adminGetAt(t, addr, "/admin/v1/threads/"+thread, &d)
			got = d.Usage.PromptTokens
			require.LessOrEqual(t, got, want, "%s: usage counted once", thread)
			return got == want
		}, time.Minute, 50*time.Millisecond, "%s: usage %d of the model's %d", thread, got, want)
	}
	t.Logf("%d turns succeeded, %d failed cleanly (503 workspace_unavailable or a stream's error event) around the restart", ok, failed)
}

// bouncerTurn runs one turn; ok when it succeeded, clean when it failed as a turn may while
// Postgres is out of reach (503 workspace_unavailable, or a stream's error event), else what
// it got.
func bouncerTurn(ctx context.Context, addr, thread, text string, stream bool) (ok, clean bool, what string) {
	body := fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":%q}]}`, stream, text)
	if stream {
		body = fmt.Sprintf(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":%q}]}`, text)
	}
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return false, false, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Thread-Id", thread)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, false, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	s := string(b)
	switch {
	case resp.StatusCode == 200 && !stream:
		return true, false, ""
	case resp.StatusCode == 200 && strings.HasSuffix(s, "data: [DONE]\n\n") && !strings.Contains(s, `"error"`):
		return true, false, ""
	case resp.StatusCode == 200 && stream && strings.Contains(s, `data: {"error"`):
		return false, true, ""
	case resp.StatusCode == 503 && strings.Contains(s, `"workspace_unavailable"`):
		return false, true, ""
	}
	return false, false, fmt.Sprintf("%d %s", resp.StatusCode, s)
}
