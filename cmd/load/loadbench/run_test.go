package loadbench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLoadThreads: with Threads, each client's requests go to its own threads in turn
// (PREFIX-N-K), so every thread gets about as many turns; without, each client names one thread
// (PREFIX-N), and with no prefix, none.
func TestLoadThreads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		prefix  string
		threads int
		want    []string
	}{
		{"one thread a client", "t", 1, []string{"t-0", "t-1"}},
		{"three threads a client", "t", 3, []string{"t-0-0", "t-0-1", "t-0-2", "t-1-0", "t-1-1", "t-1-2"}},
		{"no thread", "", 3, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			seen := map[string]int{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen[r.Header.Get("X-Thread-Id")]++
				mu.Unlock()
				_, _ = fmt.Fprint(w, `{"choices":[]}`)
			}))
			defer srv.Close()
			r := Load{URL: srv.URL, Clients: 2, Duration: 300 * time.Millisecond, ThreadPrefix: tc.prefix, Threads: tc.threads,
				Body: RequestBody(256, false)}.Run(context.Background())
			require.Zero(t, r.Errors)
			require.Positive(t, r.Requests)
			mu.Lock()
			defer mu.Unlock()
			got := make([]string, 0, len(seen))
			for id := range seen {
				got = append(got, id)
			}
			require.ElementsMatch(t, tc.want, got)
			for _, id := range tc.want[:len(tc.want)/2] { // one client's threads: turns within one of each other
				require.InDelta(t, seen[tc.want[0]], seen[id], 1, "turns of %s", id)
			}
		})
	}
}

// TestConversationBodies: the suite's two agent conversations are valid requests of about the
// same size, one with 20 tool results and one without any.
func TestConversationBodies(t *testing.T) {
	tainted, clean := ConversationBody(20, true, false), ConversationBody(20, false, false)
	for _, b := range [][]byte{tainted, clean} {
		var req struct {
			Messages []struct{ Role string } `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(b, &req))
		require.Len(t, req.Messages, 42)
	}
	require.Equal(t, 20, strings.Count(string(tainted), `"role":"tool"`))
	require.NotContains(t, string(clean), `"role":"tool"`)
	require.InDelta(t, len(tainted), len(clean), 0.15*float64(len(clean)), "%d against %d bytes", len(tainted), len(clean))
}

// TestLoadKeys: with Keys, client N sends Keys[N mod len(Keys)] as its bearer token (its thread
// PREFIX-N tells which client sent a request); without, every client sends sk-load.
func TestLoadKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		keys []string
		want map[string]string // thread -> the bearer token its requests carried
	}{
		{"two keys, three clients", []string{"key-a", "key-b"}, map[string]string{"t-0": "Bearer key-a", "t-1": "Bearer key-b", "t-2": "Bearer key-a"}},
		{"no keys", nil, map[string]string{"t-0": "Bearer sk-load", "t-1": "Bearer sk-load", "t-2": "Bearer sk-load"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			seen := map[string]map[string]bool{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				id := r.Header.Get("X-Thread-Id")
				if seen[id] == nil {
					seen[id] = map[string]bool{}
				}
				seen[id][r.Header.Get("Authorization")] = true
				mu.Unlock()
				_, _ = fmt.Fprint(w, `{"choices":[]}`)
			}))
			defer srv.Close()
			r := Load{URL: srv.URL, Clients: 3, Duration: 300 * time.Millisecond, ThreadPrefix: "t", Keys: tc.keys,
				Body: RequestBody(256, false)}.Run(context.Background())
			require.Zero(t, r.Errors)
			require.Positive(t, r.Requests)
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, seen, len(tc.want))
			for id, bearer := range tc.want {
				require.Equal(t, map[string]bool{bearer: true}, seen[id], "thread %s", id)
			}
		})
	}
}
