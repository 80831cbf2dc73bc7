package loadbench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// The floor's thread turn is one statement and one upstream exchange; its tool round adds a
// durable write and a second exchange, whose answer is the client's.
func TestFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t, nil)
	require.NoError(t, FloorSchema(ctx, pool))
	require.NoError(t, FloorSchema(ctx, pool)) // again: it is there

	var upstreamRequests atomic.Int64
	model := fake.New(fake.Options{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamRequests.Add(1)
		model.ServeHTTP(w, r)
	}))
	defer up.Close()
	target, err := url.Parse(up.URL + "/v1/chat/completions")
	require.NoError(t, err)

	// The call's arguments are the body's first 64 bytes: here they end inside an "é".
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 12) + `é"}]}`
	require.Equal(t, "\xc3", body[63:64])
	for _, tt := range []struct {
		name      string
		toolRound bool
		exchanges int64 // upstream requests a turn
	}{
		{"ThreadTurn", false, 1},
		{"ToolRound", true, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(Floor(target, pool, tt.toolRound))
			defer srv.Close()
			thread := "floor-" + tt.name
			before := upstreamRequests.Load()
			for range 2 {
				req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
				require.NoError(t, err)
				req.Header.Set("X-Thread-Id", thread)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				answer, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", answer)
				require.Contains(t, string(answer), `"chat.completion"`)
				require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			}
			require.Equal(t, 2*tt.exchanges, upstreamRequests.Load()-before)
			var turns, calls int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT turns, coalesce((SELECT n FROM load_floor_calls WHERE thread_id = $1), 0)
				FROM load_floor_threads WHERE id = $1`, thread).Scan(&turns, &calls))
			require.Equal(t, int64(2), turns)
			if tt.toolRound {
				require.Equal(t, int64(2), calls)
			} else {
				require.Zero(t, calls)
			}
		})
	}
}
