package loadbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Result is one load run's figures.
type Result struct {
	Requests int
	Errors   int
	RPS      float64
	P50, P90 time.Duration
	P99      time.Duration
	TTFB50   time.Duration // time to the first byte of the body
}

func (r Result) String() string {
	return fmt.Sprintf("%8.0f req/s  p50 %7s  p90 %7s  p99 %7s  ttfb50 %7s  (%d requests, %d errors)",
		r.RPS, r.P50.Round(time.Microsecond), r.P90.Round(time.Microsecond), r.P99.Round(time.Microsecond),
		r.TTFB50.Round(time.Microsecond), r.Requests, r.Errors)
}

// Load is one load run's setup.
type Load struct {
	URL      string
	Clients  int
	Duration time.Duration
	Stream   bool
	// ThreadPrefix, when set, names a thread per client (PREFIX-N) with X-Thread-Id; with
	// Threads above 1, each client's requests go to its Threads threads in turn (PREFIX-N-K), so
	// that a thread's turns are as far apart as a service with that many threads would see.
	ThreadPrefix string
	Threads      int
	Body         []byte
	// Keys, when set, are wsproxy client keys (docs/spec.md §20): client N sends Keys[N mod
	// len(Keys)] as its bearer token, in place of the upstream key sk-load.
	Keys []string
}

// RequestBody is a chat request of about size bytes, streamed or not.
func RequestBody(size int, stream bool) []byte {
	var msgs []string
	msgs = append(msgs, `{"role":"system","content":"You are a careful assistant."}`)
	line := "Tell me more about soil carbon and how it is measured in the field. "
	for total := 200; total < size; total += len(line) + 32 {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, line))
	}
	s := ""
	if stream {
		s = `"stream":true,`
	}
	return []byte(`{"model":"bench",` + s + `"messages":[` + strings.Join(msgs, ",") + `]}`)
}

// ConversationBody is an agent's conversation of exchanges rounds under one client tool: with
// tool set, each round is the model's call of read_file and its result (content the user did not
// write: the turn is tainted, docs/spec.md §19); without, the model's words and the user's, of the
// same sizes. The two cost the same to parse, so their difference is what classifying what the
// model read costs.
func ConversationBody(exchanges int, tool, stream bool) []byte {
	msgs := []string{`{"role":"system","content":"You are a careful coding assistant."}`,
		`{"role":"user","content":"Find why the build fails on the release branch and fix it."}`}
	result := "package main // the file's text as the tool read it: imports, a function, a failing test. "
	for i := range exchanges {
		if tool {
			msgs = append(msgs,
				fmt.Sprintf(`{"role":"assistant","content":null,"tool_calls":[{"id":"call_%d","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"cmd/main_%d.go\"}"}}]}`, i, i),
				fmt.Sprintf(`{"role":"tool","tool_call_id":"call_%d","content":%q}`, i, result))
		} else {
			msgs = append(msgs,
				fmt.Sprintf(`{"role":"assistant","content":"Reading cmd/main_%d.go next, as the build log points at it; then the test that fails on the release branch, and the imports it needs."}`, i),
				fmt.Sprintf(`{"role":"user","content":%q}`, result))
		}
	}
	s := ""
	if stream {
		s = `"stream":true,`
	}
	return []byte(`{"model":"bench",` + s + `"tools":[{"type":"function","function":{"name":"read_file","description":"Read a file of the repository.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}],"messages":[` + strings.Join(msgs, ",") + `]}`)
}

// Run drives the load and returns its figures. Clients loop until the duration ends; every
// request's body is read to its end.
func (l Load) Run(ctx context.Context) Result {
	transport := &http.Transport{
		MaxIdleConns: l.Clients * 2, MaxIdleConnsPerHost: l.Clients * 2, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, DisableCompression: true,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: time.Minute}
	ctx, cancel := context.WithTimeout(ctx, l.Duration)
	defer cancel()

	type sample struct{ total, ttfb time.Duration }
	var (
		mu      sync.Mutex
		samples []sample
		errs    int
		wg      sync.WaitGroup
	)
	start := time.Now()
	for c := range l.Clients {
		bearer := "Bearer sk-load"
		if len(l.Keys) > 0 {
			bearer = "Bearer " + l.Keys[c%len(l.Keys)]
		}
		wg.Go(func() {
			var local []sample
			localErrs := 0
			for n := 0; ctx.Err() == nil; n++ {
				req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, l.URL, bytes.NewReader(l.Body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", bearer)
				switch {
				case l.ThreadPrefix == "":
				case l.Threads > 1:
					req.Header.Set("X-Thread-Id", fmt.Sprintf("%s-%d-%d", l.ThreadPrefix, c, n%l.Threads))
				default:
					req.Header.Set("X-Thread-Id", fmt.Sprintf("%s-%d", l.ThreadPrefix, c))
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					localErrs++
					continue
				}
				var ttfb time.Duration
				buf := make([]byte, 1)
				if _, err := io.ReadFull(resp.Body, buf); err == nil {
					ttfb = time.Since(t0)
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					localErrs++
					continue
				}
				local = append(local, sample{time.Since(t0), ttfb})
			}
			mu.Lock()
			samples = append(samples, local...)
			errs += localErrs
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	r := Result{Requests: len(samples), Errors: errs, RPS: float64(len(samples)) / elapsed.Seconds()}
	if len(samples) == 0 {
		return r
	}
	totals := make([]time.Duration, len(samples))
	ttfbs := make([]time.Duration, len(samples))
	for i, s := range samples {
		totals[i], ttfbs[i] = s.total, s.ttfb
	}
	slices.Sort(totals)
	slices.Sort(ttfbs)
	pct := func(d []time.Duration, p float64) time.Duration { return d[min(len(d)-1, int(float64(len(d))*p))] }
	r.P50, r.P90, r.P99 = pct(totals, .50), pct(totals, .90), pct(totals, .99)
	r.TTFB50 = pct(ttfbs, .50)
	return r
}
