package loadbench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
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
