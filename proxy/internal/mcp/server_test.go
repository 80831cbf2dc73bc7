package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestMCPStatelessRoundRobin: two replicas behind a round-robin balancer answer one client's
// session, request by request, over both protocol versions.
func TestMCPStatelessRoundRobin(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, nil)
	replicas := []*env{setupWithPool(t, pool), setupWithPool(t, pool)}
	var next atomic.Int64
	var served [2]atomic.Int64
	balancer := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			i := next.Add(1) % 2
			served[i].Add(1)
			u, _ := url.Parse(replicas[i].srv.URL)
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: -1,
	})
	t.Cleanup(balancer.Close)
	for _, protocol := range []string{testkit.MCPLatest, testkit.MCPLegacy} {
		t.Run(protocol, func(t *testing.T) {
			thread := "rr-" + protocol
			cs := testkit.MCPConnect(t, balancer.URL, adminToken, protocol, nil)
			for i := range 6 {
				text, isError := testkit.MCPCall(t, cs, "add_preferences", map[string]any{"thread": thread,
					"items": []any{map[string]any{"title": fmt.Sprintf("Item %d", i)}}, "action_and_reasoning": "stated"})
				require.False(t, isError, text)
				require.Equal(t, "recorded 1 preference", text)
			}
			text, _ := testkit.MCPCall(t, cs, "list_preferences", map[string]any{"thread": thread})
			require.Equal(t, 6, strings.Count(untilAsOf(t, text), "\n")+1, text)
			_, err := cs.ListTools(context.Background(), nil)
			require.NoError(t, err)
		})
	}
	require.Positive(t, served[0].Load())
	require.Positive(t, served[1].Load())
}

// mcpBatch is a POST of a JSON-RPC batch of n set_objective calls (texts prefix 1…n, each a
// change) to /mcp with token, in MCP 2025-03-26 (the last version with batches).
func mcpBatch(t *testing.T, e *env, token, prefix string, n int) *http.Request {
	t.Helper()
	calls := make([]json.RawMessage, n)
	for i := range calls {
		calls[i] = json.RawMessage(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"set_objective",`+
			`"arguments":{"text":"%s %d","action_and_reasoning":"One of a batch."}}}`, i+1, prefix, i+1))
	}
	b, err := json.Marshal(calls)
	require.NoError(t, err)
	req, err := http.NewRequest("POST", e.srv.URL+"/mcp", bytes.NewReader(b))
	require.NoError(t, err)
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Mcp-Protocol-Version": "2025-03-26", "Authorization": "Bearer " + token} {
		req.Header.Set(k, v)
	}
	return req
}

// send sends req and returns its status and body.
func send(req *http.Request) (int, []byte, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// TestMCPBatchBounded: a JSON-RPC batch (MCP 2025-03-26) carries at most as many messages as a
// round runs workspace calls (MAX_TOOL_CALLS_PER_ROUND): one more is refused whole — 413 with a
// JSON-RPC error, no call run — and one at the bound runs every call, one at a time: while the
// thread's row is held, at most one of its calls waits on Postgres.
func TestMCPBatchBounded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setObjective("batch", "Batches")
	token, _, _ := mintMCPToken(t, e, "batch", 0)
	bound := maxBatch
	ws := e.store.Workspace(workspace.ThreadID{Name: "batch"})
	before, err := ws.LastEventID(context.Background())
	require.NoError(t, err)

	status, body, err := send(mcpBatch(t, e, token, "Over", bound+1))
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestEntityTooLarge, status, "%s", body)
	var refused struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(body, &refused), "%s", body)
	require.Equal(t, "2.0", refused.JSONRPC)
	require.Equal(t, "null", string(refused.ID), "a response to a batch refused whole has id null")
	require.Equal(t, -32600, refused.Error.Code)
	require.Contains(t, refused.Error.Message, strconv.Itoa(bound))
	last, err := ws.LastEventID(context.Background())
	require.NoError(t, err)
	require.Equal(t, before, last, "nothing of a refused batch runs")

	// At the bound, with the thread's row held: its calls wait one at a time.
	side, err := pgxpool.NewWithConfig(context.Background(), e.pool.Config().Copy()) // not the proxy's pool
	require.NoError(t, err)
	defer side.Close()
	tx, err := side.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	var holder int32
	require.NoError(t, tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&holder))
	_, err = tx.Exec(context.Background(), `SELECT 1 FROM threads WHERE id = 'batch' FOR UPDATE`)
	require.NoError(t, err)
	type answer struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan answer, 1)
	req := mcpBatch(t, e, token, "At", bound)
	go func() {
		status, body, err := send(req)
		done <- answer{status, body, err}
	}()
	// The sessions the holder blocks, directly or behind another waiter.
	waiting := func() int {
		var n int
		require.NoError(t, side.QueryRow(context.Background(), `WITH RECURSIVE w(pid) AS (SELECT $1::int
			UNION SELECT a.pid FROM pg_stat_activity a, w WHERE w.pid = ANY(pg_blocking_pids(a.pid)))
			SELECT count(*) - 1 FROM w`, holder).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return waiting() > 0 }, time.Minute, 20*time.Millisecond)
	require.Never(t, func() bool { return waiting() > 1 }, time.Second, 20*time.Millisecond, "one request's calls wait one at a time")
	require.NoError(t, tx.Rollback(context.Background()))

	a := <-done
	require.NoError(t, a.err)
	require.Equal(t, 200, a.status, "%s", a.body)
	var results []struct {
		Result struct{ IsError bool } `json:"result"`
		Error  *json.RawMessage       `json:"error"`
	}
	require.NoError(t, json.Unmarshal(a.body, &results), "%s", a.body)
	require.Len(t, results, bound)
	for _, r := range results {
		require.Nil(t, r.Error)
		require.False(t, r.Result.IsError)
	}
	last, err = ws.LastEventID(context.Background())
	require.NoError(t, err)
	require.Equal(t, before+int64(bound), last, "every call of a batch at the bound runs")
}
