package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/demo"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// replicaModel is the model of the replicas test: "add X" records X, "remove N" removes #N;
// after the tool's result it answers. Streamed requests get streams, with a pause in the middle
// of the tool call (time for a replica to be told to stop), told on midStream.
func replicaModel(midStream chan<- struct{}) upstreamtest.Reply {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Stream   bool `json:"stream"`
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(body, &req)
		last := req.Messages[len(req.Messages)-1]
		var call upstreamtest.Call
		switch text := demo.ClientText(last.Content); {
		case last.Role == "tool":
			if req.Stream {
				upstreamtest.Stream(upstreamtest.ContentChunks("r", "ok")...)(w, r)
			} else {
				upstreamtest.JSON(200, upstreamtest.Completion("ok"))(w, r)
			}
			return
		case strings.HasPrefix(text, "add "):
			call = upstreamtest.Call{ID: "c", Name: "add_preferences", Arguments: upstreamtest.Args(map[string]any{
				"items": []map[string]string{{"title": strings.TrimPrefix(text, "add ")}}, "action_and_reasoning": "asked"})}
		default:
			call = upstreamtest.Call{ID: "c", Name: "remove_preferences", Arguments: `{"indices":[1],"action_and_reasoning":"asked"}`}
		}
		if !req.Stream {
			upstreamtest.JSON(200, upstreamtest.Completion("", call))(w, r)
			return
		}
		chunks := upstreamtest.ToolCallChunks("r", 8, call)
		upstreamtest.StreamRaw(upstreamtest.Events(chunks[:2]...))(w, r)
		select {
		case midStream <- struct{}{}:
		default:
		}
		time.Sleep(100 * time.Millisecond)
		upstreamtest.WriteRaw(w, upstreamtest.Events(append(chunks[2:], "[DONE]")...)...)
	}
}

// TestThreeReplicas runs three wsproxy instances (the real Main) on one Postgres: 60 turns on one
// thread at once, spread across two of them, while a user adds and locks preferences through the
// third; one of the two is stopped (as on SIGTERM) while its streams are mid-way, and its clients
// go on with the other. The result is the one a serial run gives: turns 1..60, every write once, the locked
// preference untouched.
func TestThreeReplicas(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	midStream := make(chan struct{}, 100)
	up.Fallback = replicaModel(midStream)
	dbURL := dbtest.SchemaURL(t)
	var replicas [3]*Main
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { // they start, and migrate, at once
			replicas[i], _ = MustRunMain(t, func(c *Config) {
				c.DatabaseURL, c.UpstreamBaseURL, c.AdminToken = dbURL, up.URL, "test-admin-token-0123456789"
				c.ShutdownTimeout = 20 * time.Second
			})
		})
	}
	wg.Wait()
	a, b, admin := replicas[0], replicas[1], replicas[2]
	require.Equal(t, 201, adminCall(t, admin, "POST", "/admin/v1/threads/shared/preferences", `{"title":"The user's own","locked":true}`, nil))

	var stopped atomic.Bool
	turn := func(i int, text string) {
		body := fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":%q}]}`, i%2 == 0, text)
		for attempt := 0; ; attempt++ {
			m := a
			if i%2 == 0 && !stopped.Load() {
				m = b // a load balancer sends the streamed turns to b until it stops
			}
			req, _ := http.NewRequest("POST", m.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("X-Thread-Id", "shared")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				require.Less(t, attempt, 3, "turn %d: %v", i, err)
				continue // b is gone: the next attempt goes to a
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(out), `"shutting_down"`) {
				// b took the request but stopped before its turn began (docs/spec.md: 503
				// shutting_down, Retry-After): nothing was written, so it goes to a
				require.Less(t, attempt, 3, "turn %d: %s", i, out)
				require.Equal(t, "1", resp.Header.Get("Retry-After"))
				t.Logf("turn %d: b stopped before its turn began; retried on a", i)
				continue
			}
			require.Equal(t, 200, resp.StatusCode, "turn %d: %s", i, out)
			if i%2 == 0 {
				require.True(t, strings.HasSuffix(string(out), "data: [DONE]\n\n"), "turn %d ended: %s", i, out)
			}
			return
		}
	}
	for i := range 60 {
		text := fmt.Sprintf("add Agent %02d", i)
		if i%6 == 5 {
			text = "remove 1"
		}
		wg.Go(func() { turn(i, text) })
	}
	for i := range 10 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"title":"User %02d","locked":%t}`, i, i%2 == 0)
			require.Equal(t, 201, adminCall(t, admin, "POST", "/admin/v1/threads/shared/preferences", body, nil))
		})
	}
	<-midStream // streams of b are in the middle of a tool call
	stopped.Store(true)
	require.NoError(t, b.Close(), "b finishes what it serves, then stops")
	wg.Wait()

	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, admin, "GET", "/admin/v1/threads/shared", "", &ws))
	var titles []string
	for i, p := range ws.Preferences {
		require.Equal(t, i+1, p.Index)
		titles = append(titles, p.Title)
	}
	require.Equal(t, "The user's own", titles[0], "the locked preference was never removed")
	var want []string
	for i := range 60 {
		if i%6 != 5 {
			want = append(want, fmt.Sprintf("Agent %02d", i))
		}
	}
	for i := range 10 {
		want = append(want, fmt.Sprintf("User %02d", i))
	}
	got := titles[1:]
	sort.Strings(got)
	require.Equal(t, want, got, "every write exactly once")

	var threads struct {
		Data []struct {
			ID    string `json:"id"`
			Turns int    `json:"turns"`
		} `json:"data"`
	}
	require.Equal(t, 200, adminCall(t, a, "GET", "/admin/v1/threads", "", &threads))
	require.Equal(t, 60, threads.Data[0].Turns)
	var calls struct {
		Data []struct {
			Turn   int             `json:"turn"`
			Result json.RawMessage `json:"result"`
		} `json:"data"`
	}
	require.Equal(t, 200, adminCall(t, a, "GET", "/admin/v1/threads/shared/tool-calls?limit=500", "", &calls))
	require.Len(t, calls.Data, 60)
	seen := map[int]bool{}
	for _, c := range calls.Data {
		require.False(t, seen[c.Turn], "turn %d ran twice", c.Turn)
		seen[c.Turn] = true
	}
}
