package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

// afterToolCall runs hook once, when the first tool call that commits after it was armed has
// committed.
type afterToolCall struct {
	armed  atomic.Bool
	record atomic.Bool // the batch under way records a tool call
	hook   func()
}

func (a *afterToolCall) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (a *afterToolCall) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (a *afterToolCall) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (a *afterToolCall) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, "INSERT INTO tool_calls") {
		a.record.Store(true)
	}
}
func (a *afterToolCall) TraceBatchEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	if a.record.Swap(false) && d.Err == nil && a.armed.CompareAndSwap(true, false) {
		a.hook()
	}
}

// leavingClient sends a turn to e's proxy and leaves once the turn's first tool call has
// committed: the proxy has seen it go (its request's context is done) before the next call
// runs. It returns once the proxy's handler has returned.
func leavingClient(t *testing.T, e *env, tracer *afterToolCall, path, body string) {
	t.Helper()
	requests := make(chan context.Context, 1)
	handled := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handled)
		requests <- r.Context()
		e.proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ctx, leave := context.WithCancel(context.Background())
	var noticed atomic.Bool
	tracer.hook = func() {
		leave()
		select {
		case <-(<-requests).Done():
			noticed.Store(true)
		case <-time.After(time.Minute):
		}
	}
	tracer.armed.Store(true)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Thread-Id", "leave")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	<-handled
	require.True(t, noticed.Load(), "the proxy saw the client leave mid-round")
}

// TestAClientLeavingMidRoundLeavesTheRoundWhole: once a round's workspace calls have started, a
// client that leaves does not cut them short: "remove #1" and "add its new wording" both happen.
func TestAClientLeavingMidRoundLeavesTheRoundWhole(t *testing.T) {
	t.Parallel()
	tracer := &afterToolCall{}
	e := setupWithPool(t, dbtest.NewPool(t, &dbtest.Options{Tracer: tracer}))
	e.preferencesOf("leave", "By train")
	e.up.Script(reply(cmpl("",
		call{ID: "r", Name: "remove_preferences", Arguments: `{"indices":[1]}`},
		call{ID: "a", Name: "add_preferences", Arguments: `{"items":[{"title":"By night train"}]}`})))
	e.up.Fallback = reply(cmpl("Done."))
	leavingClient(t, e, tracer, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"the night train, rather"}]}`)
	require.Equal(t, []string{"By night train"}, e.titles("leave"))
}

// TestAClientLeavingMidRoundGetsItsTurnRecorded: a Responses turn whose round also called the
// client's tool is recorded as it ends, though its client left while the workspace's call ran:
// a continuation from it gets the call's output.
func TestAClientLeavingMidRoundGetsItsTurnRecorded(t *testing.T) {
	t.Parallel()
	tracer := &afterToolCall{}
	e := setupWithPool(t, dbtest.NewPool(t, &dbtest.Options{Tracer: tracer}))
	obj := args(map[string]any{"text": "Pack for Lisbon", "action_and_reasoning": "r"})
	e.up.Script(rspec{ID: "resp_a", Items: []upstreamtest.Item{callItem("fc_o", "call_o", "set_objective", obj),
		callItem("fc_w", "call_w", "get_weather", `{"city":"Lisbon"}`)}}.Reply())
	tool := `[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":false}]`
	leavingClient(t, e, tracer, "/v1/responses", `{"model":"gpt-test","input":"What should I pack?","tools":`+tool+`}`)
	c, err := e.store.Workspace(workspace.ThreadID{Name: "leave"}).Continuation(context.Background(), "resp_a")
	require.NoError(t, err, "the turn's end is recorded")
	require.Equal(t, "resp_a", c.LastResponseID)
	require.Equal(t, []workspace.OwedOutput{{CallID: "call_o", Output: `{"ok":true,"result":"objective set: Pack for Lisbon"}`}}, c.Owed)
}
