package loadbench

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
	"github.com/wsproxy/wsproxy/workspace"
)

// quickModel is a model upstream whose timing a test does not wait long for.
func quickModel(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(fake.New(fake.Options{Timing: fake.Timing{TTFT: 5 * time.Millisecond, Chunks: 4, Interval: time.Millisecond}}))
	t.Cleanup(srv.Close)
	return srv
}

// TestModelUpstream: a streamed answer in -chunks pieces, the first with the role, then the
// finish chunk, the usage when asked and [DONE]; with the tool-round header a workspace call
// whose arguments come in as many pieces, then the text once the call's result is sent; a
// non-streamed answer whole.
func TestModelUpstream(t *testing.T) {
	t.Parallel()
	srv := quickModel(t)
	post := func(body string, tool bool) string {
		req, _ := http.NewRequest("POST", srv.URL+chatPath, strings.NewReader(body))
		if tool {
			req.Header.Set(fake.ToolRoundHeader, "1")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	type chunk struct {
		Choices []struct {
			Delta struct {
				Role      string  `json:"role"`
				Content   *string `json:"content"`
				ToolCalls []struct {
					Function struct{ Name, Arguments string } `json:"function"`
				} `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	read := func(stream string) (chunks []chunk, text, name, args, finish string, usage bool) {
		events := strings.Split(strings.TrimSuffix(stream, "data: [DONE]\n\n"), "\n\n")
		require.True(t, strings.HasSuffix(stream, "data: [DONE]\n\n"))
		for _, ev := range events[:len(events)-1] {
			var c chunk
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &c), ev)
			chunks = append(chunks, c)
			if c.Usage != nil {
				usage = true
				continue
			}
			d := c.Choices[0].Delta
			if d.Content != nil {
				text += *d.Content
			}
			for _, tc := range d.ToolCalls {
				name += tc.Function.Name
				args += tc.Function.Arguments
			}
			if f := c.Choices[0].FinishReason; f != nil {
				finish = *f
			}
		}
		return
	}
	body := string(RequestBody(300, true))
	chunks, text, _, _, finish, usage := read(post(body, false))
	require.Len(t, chunks, 6, "the role's chunk (written with the first piece), 4 pieces and the finish chunk")
	require.Equal(t, "assistant", chunks[0].Choices[0].Delta.Role)
	require.Equal(t, "Soil word word word", text)
	require.Equal(t, "stop", finish)
	require.False(t, usage)

	withUsage := strings.Replace(body, `"stream":true,`, `"stream":true,"stream_options":{"include_usage":true},`, 1)
	chunks, _, name, args, finish, usage := read(post(withUsage, true))
	require.Len(t, chunks, 8, "the role's and the call's opening chunks (written with its first piece), 4 pieces of the call, the finish chunk, the usage")
	require.Equal(t, "update_preferences", name)
	require.Equal(t, fake.ToolArguments(1), args, "the model's first workspace call")
	require.Equal(t, "tool_calls", finish)
	require.True(t, usage)

	_, text, name, _, finish, _ = read(post(string(withToolResult([]byte(body))), true))
	require.Equal(t, "Soil word word word", text, "the call's result came: the answer")
	require.Empty(t, name)
	require.Equal(t, "stop", finish)

	var answer struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(post(string(RequestBody(300, false)), false)), &answer))
	require.Equal(t, "Soil word word word", answer.Choices[0].Message.Content)
}

// TestOpenLoopRows: the open-loop load of each kind of row runs to the end of every stream,
// straight to the model upstream (the client sending the tool round's second request itself)
// and through wsproxy, whose workspace call updates the thread's preference.
func TestOpenLoopRows(t *testing.T) {
	t.Parallel()
	model := quickModel(t)
	u, _ := url.Parse(model.URL + "/v1")
	pool := dbtest.NewPool(t, nil)
	store := workspace.NewStore(pool, workspace.Options{})
	p := proxy.NewServer(proxy.Options{Store: store, UpstreamURL: u, AdminToken: adminToken, Metrics: proxy.NewMetrics(prometheus.NewRegistry(), proxy.MetricsOptions{})})
	ws := httptest.NewServer(p)
	t.Cleanup(func() {
		ws.Close()
		_ = p.Shutdown(context.Background())
	})
	h := &latencyHarness{timing: fake.Timing{TTFT: 5 * time.Millisecond, Chunks: 4, Interval: time.Millisecond}, size: 300}
	const n = 3
	for i := range threads(n) {
		require.NoError(t, seed(ws.URL, threadName(i)))
	}
	for _, s := range latencyScenarios {
		if s.target == targetBare {
			continue // the bare proxy runs as a process of its own (load bareproxy)
		}
		t.Run(strings.ReplaceAll(s.name, " ", "_"), func(t *testing.T) {
			tgt := target{base: model.URL, kind: s.target}
			if s.target == targetWsproxy {
				tgt.base = ws.URL
			}
			loop := h.openLoop(s, tgt, n)
			loop.duration = 100 * time.Millisecond
			results := loop.run(context.Background())
			require.NotEmpty(t, results)
			for _, r := range results {
				require.Empty(t, r.err)
				require.Positive(t, r.ttft)
				require.GreaterOrEqual(t, r.end, r.start+r.ttft)
			}
		})
	}
	// Every tool round through wsproxy that updated changed the preference (a subtitle of its
	// own): one event a call, on every thread.
	ctx := context.Background()
	rounds := 0
	for i := range threads(n) {
		w := store.Workspace(workspace.ThreadID{Name: threadName(i)})
		d, err := w.Get(ctx)
		require.NoError(t, err)
		calls, err := w.ToolCalls(ctx, 0, 1000)
		require.NoError(t, err)
		events, err := w.Events(ctx, workspace.EventQuery{Limit: 1000})
		require.NoError(t, err)
		updates := 0
		for _, e := range events {
			if e.Actor == workspace.ByAgent && e.Kind == workspace.PreferenceUpdated {
				updates++
			}
		}
		updated := 0 // the calls that updated: a call planned on a list another turn changed since updates nothing
		for _, c := range calls {
			var r struct{ Result string }
			require.NoError(t, json.Unmarshal(c.Result, &r))
			if strings.HasPrefix(r.Result, "updated") {
				updated++
			}
		}
		require.Equal(t, updated, updates, "thread %d: an event per tool round that updated", i)
		if updated > 0 {
			require.Regexp(t, `^measured \d+$`, d.Preferences[0].Subtitle, "the tool round's workspace call ran")
		}
		rounds += updated
	}
	require.Positive(t, rounds)
}

// TestHistogramQuantile: a quantile of the observations between two scrapes, interpolated
// within its bucket.
func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	scrape := func(counts ...float64) histogram {
		m := map[string]float64{}
		for i, le := range []string{"0.001", "0.01", "0.1", "+Inf"} {
			m[`x_bucket{le="`+le+`"}`] = counts[i]
		}
		return histogramOf(m, "x")
	}
	before := scrape(10, 10, 10, 10)
	require.Equal(t, time.Duration(-1), before.quantileSince(before, .99), "nothing observed in between")
	after := scrape(10, 110, 110, 110) // 100 observations between 1 and 10 ms
	require.Equal(t, 5500*time.Microsecond, after.quantileSince(before, .5))
	require.Equal(t, 9910*time.Microsecond, after.quantileSince(before, .99))
	tail := scrape(10, 10, 10, 20) // above the last bound: the bound
	require.Equal(t, 100*time.Millisecond, tail.quantileSince(before, .99))
}
