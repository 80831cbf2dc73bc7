package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wsproxy/wsproxy/db/dbfault"
	"github.com/wsproxy/wsproxy/proxy/demo"
)

// soakUpstream is a model for the soak: a turn's first call records the user's message as a
// preference; the call after the tools reads the tool's result and notes every title the proxy
// reported as recorded. It injects faults at the given rates.
type soakUpstream struct {
	faults   faultRates
	mu       sync.Mutex
	reported map[string]bool // titles the proxy reported recorded
	injected map[string]int
}

type faultRates struct {
	status, reset, stall, badJSON float64
	stallFor                      time.Duration
}

func newSoakUpstream(f faultRates) *soakUpstream {
	return &soakUpstream{faults: f, reported: map[string]bool{}, injected: map[string]int{}}
}

func (u *soakUpstream) count(fault string) {
	u.mu.Lock()
	u.injected[fault]++
	u.mu.Unlock()
}

func (u *soakUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Stream   bool `json:"stream"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	switch x := rand.Float64(); {
	case x < u.faults.status:
		u.count("upstream 503")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"overloaded","type":"server_error"}}`)
		return
	case x < u.faults.status+u.faults.reset:
		u.count("connection reset")
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	case x < u.faults.status+u.faults.reset+u.faults.stall:
		u.count("stall past UPSTREAM_TIMEOUT")
		select {
		case <-r.Context().Done():
		case <-time.After(u.faults.stallFor):
		}
		return
	case x < u.faults.status+u.faults.reset+u.faults.stall+u.faults.badJSON:
		u.count("invalid JSON")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":`)
		return
	}
	last := req.Messages[len(req.Messages)-1]
	var content string
	var calls []map[string]any
	if last.Role == "tool" {
		var env struct {
			OK     bool   `json:"ok"`
			Result string `json:"result"`
		}
		_ = json.Unmarshal([]byte(last.Content), &env)
		if env.OK && strings.HasPrefix(env.Result, "recorded 1 preference") {
			// The user's message (the title) is the last user message.
			for i := len(req.Messages) - 1; i >= 0; i-- {
				if req.Messages[i].Role == "user" {
					u.mu.Lock()
					u.reported[demo.ClientText(req.Messages[i].Content)] = true
					u.mu.Unlock()
					break
				}
			}
		}
		content = "Noted: " + env.Result
	} else {
		title := demo.ClientText(last.Content)
		a, _ := json.Marshal(map[string]any{"items": []map[string]string{{"title": title}}, "action_and_reasoning": "soak"})
		calls = []map[string]any{{"id": "call_soak", "type": "function", "function": map[string]any{"name": "add_preferences", "arguments": string(a)}}}
	}
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(delta map[string]any, finish any) {
			b, _ := json.Marshal(map[string]any{"id": "chatcmpl-soak", "object": "chat.completion.chunk", "created": 1, "model": "soak",
				"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}})
			fmt.Fprintf(w, "data: %s\n\n", b)
		}
		if calls != nil {
			chunk(map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"index": 0, "id": "call_soak", "type": "function",
				"function": calls[0]["function"]}}}, nil)
			chunk(map[string]any{}, "tool_calls")
		} else {
			chunk(map[string]any{"role": "assistant", "content": content}, nil)
			chunk(map[string]any{}, "stop")
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	msg := map[string]any{"role": "assistant", "content": content}
	finish := "stop"
	if calls != nil {
		msg["content"], msg["tool_calls"], finish = nil, calls, "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": "chatcmpl-soak", "object": "chat.completion", "created": 1, "model": "soak",
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}})
}

// soakTarget is the wsproxy under soak.
type soakTarget struct {
	baseURL, adminToken string
	// cutDB, when set, cuts Postgres off for a moment (the soak's database fault) every cutEvery.
	cutDB    func(d time.Duration)
	cutEvery time.Duration
}

// soakSummary is what a soak found.
type soakSummary struct {
	Duration                        time.Duration
	Turns, Streamed, Pass, Admin    int64
	ClientErrors                    map[string]int64
	Injected                        map[string]int
	DBCuts                          int
	Reported, StoredOnce            int
	Lost, Duplicated                int
	GoroutinesBefore, GoroutinesAft float64
	HeapBefore, HeapAfter           float64
}

func (s soakSummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak: %s of mixed traffic: %d thread turns (%d streamed), %d pass-through, %d admin edits\n",
		s.Duration.Round(time.Second), s.Turns, s.Streamed, s.Pass, s.Admin)
	fmt.Fprintf(&b, "  faults injected: %v; Postgres cut %d times\n", s.Injected, s.DBCuts)
	fmt.Fprintf(&b, "  errors the clients saw (then retried): %v\n", s.ClientErrors)
	fmt.Fprintf(&b, "  preferences the loop reported recorded: %d; stored exactly once: %d; lost: %d; duplicated: %d\n",
		s.Reported, s.StoredOnce, s.Lost, s.Duplicated)
	fmt.Fprintf(&b, "  goroutines: %.0f before, %.0f after; heap in use: %.1f MB before, %.1f MB after\n",
		s.GoroutinesBefore, s.GoroutinesAft, s.HeapBefore/(1<<20), s.HeapAfter/(1<<20))
	return b.String()
}

// ok reports whether the soak found nothing wrong.
func (s soakSummary) ok() bool {
	return s.Lost == 0 && s.Duplicated == 0 && s.Reported > 0 && s.GoroutinesAft <= s.GoroutinesBefore+5 &&
		s.HeapAfter <= 2*s.HeapBefore+8<<20
}

// soak drives mixed traffic at the target for d with workers clients, then checks every write.
func soak(ctx context.Context, tgt soakTarget, up *soakUpstream, d time.Duration, workers int) (soakSummary, error) {
	client := &http.Client{Timeout: time.Minute}
	sum := soakSummary{Duration: d, ClientErrors: map[string]int64{}}
	var mu sync.Mutex
	clientError := func(what string) {
		mu.Lock()
		sum.ClientErrors[what]++
		mu.Unlock()
	}
	threads := sync.Map{} // every thread used, to check at the end
	// The baseline: after a warm-up with as many clients, so that the proxy's pools of idle
	// connections are already as full as they will be.
	var warm sync.WaitGroup
	for w := range workers {
		thread := fmt.Sprintf("warm-up-%d", w)
		threads.Store(thread, true)
		warm.Go(func() {
			for i := range 20 {
				post := fmt.Sprintf(`{"model":"soak","messages":[{"role":"user","content":"%s pref %d"}]}`, thread, i)
				req, _ := http.NewRequest("POST", tgt.baseURL+"/v1/chat/completions", strings.NewReader(post))
				req.Header.Set("X-Thread-Id", thread)
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}
	warm.Wait()
	client.CloseIdleConnections()
	time.Sleep(2 * time.Second)
	before, err := scrapeMetrics(client, tgt.baseURL)
	if err != nil {
		return sum, err
	}
	sum.GoroutinesBefore, sum.HeapBefore = before["go_goroutines"], before["go_memstats_heap_inuse_bytes"]

	var turns, streamed, pass, admin, seq atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	if tgt.cutDB != nil {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(tgt.cutEvery):
					tgt.cutDB(time.Second)
					sum.DBCuts++
				}
			}
		})
	}
	post := func(path string, header map[string]string, body string) (int, string) {
		req, _ := http.NewRequest("POST", tgt.baseURL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for w := range workers {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				thread := fmt.Sprintf("soak-%d-%d", w, n/60) // a fresh thread before the 100-preference limit
				threads.Store(thread, true)
				switch x := rand.IntN(10); {
				case x < 7: // a thread turn recording a new preference, retried by the client on failure
					stream := x >= 5
					title := fmt.Sprintf("%s pref %d", thread, seq.Add(1))
					body := fmt.Sprintf(`{"model":"soak","stream":%t,"messages":[{"role":"user","content":%q}]}`, stream, title)
					for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
						code, resp := post("/v1/chat/completions", map[string]string{"X-Thread-Id": thread}, body)
						if code == 200 && (!stream || strings.HasSuffix(resp, "data: [DONE]\n\n")) {
							break
						}
						clientError(fmt.Sprintf("%d", code))
						time.Sleep(50 * time.Millisecond)
					}
					turns.Add(1)
					if stream {
						streamed.Add(1)
					}
				case x < 8:
					post("/v1/chat/completions", nil, `{"model":"soak","messages":[{"role":"user","content":"pass-through"}]}`)
					pass.Add(1)
				default: // the user locks the first preference, or adds one of their own
					var code int
					if x == 8 {
						code = adminCall(client, tgt, "PATCH", "/admin/v1/threads/"+thread+"/preferences/1", `{"locked":true}`)
					} else {
						code = adminCall(client, tgt, "POST", "/admin/v1/threads/"+thread+"/preferences",
							fmt.Sprintf(`{"title":"user %d"}`, seq.Add(1)))
					}
					if code >= 500 {
						clientError(fmt.Sprintf("admin %d", code))
					}
					admin.Add(1)
				}
			}
		})
	}
	wg.Wait()
	sum.Turns, sum.Streamed, sum.Pass, sum.Admin = turns.Load(), streamed.Load(), pass.Load(), admin.Load()

	// Every preference the loop reported recorded is stored exactly once; no title twice.
	stored := map[string]int{}
	var lastErr error
	threads.Range(func(k, _ any) bool {
		var d struct {
			Preferences []struct {
				Title string `json:"title"`
				Index int    `json:"index"`
			} `json:"preferences"`
		}
		code, body := adminGet(client, tgt, "/admin/v1/threads/"+k.(string))
		if code == 404 {
			return true
		}
		if code != 200 || json.Unmarshal(body, &d) != nil {
			lastErr = fmt.Errorf("read thread %s: %d", k, code)
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
		return sum, lastErr
	}
	up.mu.Lock()
	sum.Injected = up.injected
	sum.Reported = len(up.reported)
	for title := range up.reported {
		switch stored[title] {
		case 0:
			sum.Lost++
		case 1:
			sum.StoredOnce++
		}
	}
	up.mu.Unlock()
	for _, n := range stored {
		if n > 1 {
			sum.Duplicated++
		}
	}

	// Back to the baseline: wait for idle connections and timers to wind down.
	time.Sleep(5 * time.Second)
	client.CloseIdleConnections()
	after, err := scrapeMetrics(client, tgt.baseURL)
	if err != nil {
		return sum, err
	}
	sum.GoroutinesAft, sum.HeapAfter = after["go_goroutines"], after["go_memstats_heap_inuse_bytes"]
	return sum, nil
}

func adminCall(client *http.Client, tgt soakTarget, method, path, body string) int {
	req, _ := http.NewRequest(method, tgt.baseURL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tgt.adminToken)
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func adminGet(client *http.Client, tgt soakTarget, path string) (int, []byte) {
	req, _ := http.NewRequest("GET", tgt.baseURL+path, nil)
	req.Header.Set("Authorization", "Bearer "+tgt.adminToken)
	resp, err := client.Do(req)
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

// soakCmd runs the soak against the wsproxy binary, with Postgres behind a fault proxy.
func soakCmd(args []string) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	bin := fs.String("wsproxy", "bin/wsproxy", "the wsproxy binary")
	d := fs.Duration("d", 10*time.Minute, "duration")
	workers := fs.Int("c", 16, "concurrent clients")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("DATABASE_URL is required (make soak provides one)")
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

	up := newSoakUpstream(faultRates{status: 0.04, reset: 0.02, stall: 0.005, badJSON: 0.01, stallFor: 5 * time.Second})
	upAddr, err := freeAddr()
	if err != nil {
		return err
	}
	go func() { _ = http.ListenAndServe(upAddr, up) }()
	addr, cmd, err := startWsproxy(*bin, "DATABASE_URL="+viaFault.String(), "UPSTREAM_BASE_URL=http://"+upAddr+"/v1",
		"ADMIN_TOKEN=soak", "LOG_LEVEL=error", "UPSTREAM_TIMEOUT=2s", "DATABASE_TIMEOUT=3s")
	if err != nil {
		return err
	}
	defer stop(cmd)
	tgt := soakTarget{baseURL: "http://" + addr, adminToken: "soak", cutEvery: 20 * time.Second, cutDB: func(d time.Duration) {
		fault.Cut()
		time.Sleep(d)
		fault.Restore()
	}}
	fmt.Printf("soaking %s for %s with %d clients…\n", tgt.baseURL, *d, *workers)
	sum, err := soak(context.Background(), tgt, up, *d, *workers)
	if err != nil {
		return err
	}
	fmt.Print(sum)
	if !sum.ok() {
		return errors.New("the soak found lost or duplicated writes, or memory or goroutines that did not come back")
	}
	return nil
}
