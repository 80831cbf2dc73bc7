package proxy

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

// compacting is a chat request taken for a compaction (docs/spec.md §18), as a dialect's
// recognizer would take one: the request left alone, of kind compaction.
type compacting struct{ *turn.ChatRequest }

func (compacting) Kind() string { return turn.KindCompaction }

// compactionServer is a server whose POST /v1/chat/completions is the proxy's route (its intake,
// serveTurn, the request log around it) with every request a compaction: the edge as it serves
// one once a recognizer marks it.
func (e *env) compactionServer() *httptest.Server {
	p := e.proxy
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		r = openAIAPI.mark(r)
		in, req, ok := turnRequest(p, w, r, p.forwardBody, func(b []byte) (turn.Request, error) {
			req, err := turn.ParseChatRequest(b)
			return compacting{req}, err
		})
		defer in.release()
		if ok {
			p.serveTurn(w, r, in, req, p.opts.Store.Workspace(in.thread), p.turnUpstream(r), nil)
		}
	})
	srv := httptest.NewServer(p.observed(mux))
	e.t.Cleanup(srv.Close)
	return srv
}

// compact sends a compaction request of thread to the server at base; it answers the status and
// the body.
func compact(t *testing.T, base, thread, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Thread-Id", thread)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode, testkit.ReadBody(t, resp)
}

// TestCompactionInTheHistory: a compaction request is forwarded as it came and answered as the
// upstream answered, then recorded in its thread's history — a compaction event by the client,
// live on the event stream and in GET …/events; reverting, applying or dismissing it is a 400.
// One the upstream refused compacted nothing and is not recorded. The next turn's block carries
// the locked preference on.
func TestCompactionInTheHistory(t *testing.T) {
	t.Parallel()
	e := setup(t)
	base := e.compactionServer().URL
	e.admin("POST", "/admin/v1/threads/agent/preferences", map[string]any{"title": "Run the tests", "locked": true}, 201, nil)
	s := e.openStream(e.srv.URL, "agent", "", "")

	const body = `{"model":"m","messages":[{"role":"user","content":"Summarize the conversation so far."}]}`
	summary := cmpl("The summary.")
	e.up.Script(reply(summary))
	code, got := compact(t, base, "agent", body)
	require.Equal(t, 200, code, got)
	require.Equal(t, summary, got, "the upstream's answer as it came")
	reqs := e.up.Requests()
	require.Len(t, reqs, 1)
	require.Equal(t, body, string(reqs[0].Body), "forwarded as it came: no block, no tools")

	id, ev := s.Next()
	require.Equal(t, "2", id)
	require.Equal(t, workspace.Compaction, ev.Kind)
	require.Equal(t, workspace.ByClient, ev.Actor)
	require.Equal(t, workspace.ViaProxy, ev.Via)
	require.Equal(t, workspace.Target{Type: workspace.TargetThread}, ev.Target)
	require.Nil(t, ev.Turn)

	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/agent/events?order=desc&limit=1", nil, 200, &evs)
	require.Len(t, evs.Data, 1)
	require.Equal(t, int64(2), evs.Data[0].ID)
	require.Equal(t, "compaction", evs.Data[0].Kind)
	for _, op := range []string{"revert", "apply", "dismiss"} {
		var refused struct{ Error apierr.Error }
		e.admin("POST", "/admin/v1/threads/agent/events/2/"+op, nil, 400, &refused)
		if op == "revert" {
			require.Contains(t, refused.Error.Message, "changed nothing")
		}
	}

	// Refused upstream: nothing recorded (the next event is the objective's, numbered on).
	e.up.Script(upstreamtest.JSON(500, `{"error":{"message":"overloaded","type":"server_error"}}`))
	code, _ = compact(t, base, "agent", body)
	require.Equal(t, 500, code)
	e.admin("PUT", "/admin/v1/threads/agent/objective", map[string]any{"text": "Ship it"}, 200, nil)
	id, ev = s.Next()
	require.Equal(t, "3", id)
	require.Equal(t, workspace.ObjectiveSet, ev.Kind)

	// The next turn: its block carries the workspace on.
	e.up.Script(reply(cmpl("ok")))
	resp := e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "agent"}, body)
	require.Equal(t, 200, resp.StatusCode, testkit.ReadBody(t, resp))
	reqs = e.up.Requests()
	require.Contains(t, string(reqs[len(reqs)-1].Body), "Run the tests")
	var threads page[workspace.Thread]
	e.admin("GET", "/admin/v1/threads?q=agent", nil, 200, &threads)
	require.Len(t, threads.Data, 1)
	require.Equal(t, 1, threads.Data[0].Turns, "a compaction is no turn of the loop")
}

// TestCompactionOfANewThread: a thread's first request a compaction creates the thread, with its
// history and no turn.
func TestCompactionOfANewThread(t *testing.T) {
	t.Parallel()
	e := setup(t)
	base := e.compactionServer().URL
	e.up.Script(upstreamtest.Stream(`{"choices":[{"index":0,"delta":{"content":"The summary."}}]}`))
	code, got := compact(t, base, "fresh", `{"model":"m","stream":true,"messages":[{"role":"user","content":"Summarize."}]}`)
	require.Equal(t, 200, code)
	require.Contains(t, got, "The summary.")
	require.NoError(t, e.proxy.Shutdown(context.Background())) // it waits for the record
	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/fresh/events", nil, 200, &evs)
	require.Len(t, evs.Data, 1)
	require.Equal(t, "compaction", evs.Data[0].Kind)
	var threads page[workspace.Thread]
	e.admin("GET", "/admin/v1/threads?q=fresh", nil, 200, &threads)
	require.Len(t, threads.Data, 1)
	require.Zero(t, threads.Data[0].Turns)
}

// TestCompactionRecordFailsAlone: when Postgres refuses the record, the client has its answer as
// the upstream gave it, and the failure is logged once, at Warn.
func TestCompactionRecordFailsAlone(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	e := setup(t, func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	base := e.compactionServer().URL
	_, err := e.pool.Exec(context.Background(), `DROP FUNCTION thread_compacted(text)`)
	require.NoError(t, err)
	summary := cmpl("The summary.")
	e.up.Script(reply(summary))
	code, got := compact(t, base, "broken", `{"model":"m","messages":[{"role":"user","content":"Summarize."}]}`)
	require.Equal(t, 200, code)
	require.Equal(t, summary, got)
	require.NoError(t, e.proxy.Shutdown(context.Background())) // it waits for the record's attempt

	var warned []map[string]any
	for line := range strings.Lines(logs.String()) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		warned = append(warned, m)
	}
	require.Len(t, warned, 1, "logs: %s", logs)
	require.Equal(t, "WARN", warned[0]["level"])
	require.Equal(t, "a compaction was not recorded in its thread's history", warned[0]["msg"])
	require.Equal(t, "broken", warned[0]["thread"])
	require.Contains(t, warned[0]["err"], "thread_compacted")
}

// TestCompactionWhileShuttingDown: a compaction answered once Shutdown has begun is recorded
// before its handler returns (Shutdown waits for no turn then; the server's shutdown waits for
// the handlers).
func TestCompactionWhileShuttingDown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.compactionServer()
	require.NoError(t, e.proxy.Shutdown(context.Background()))
	e.up.Script(reply(cmpl("The summary.")))
	code, _ := compact(t, srv.URL, "late", `{"model":"m","messages":[{"role":"user","content":"Summarize."}]}`)
	require.Equal(t, 200, code)
	srv.Close() // waits for the handler
	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/late/events", nil, 200, &evs)
	require.Len(t, evs.Data, 1)
	require.Equal(t, "compaction", evs.Data[0].Kind)
}

// TestOpenAPIEventKinds: the OpenAPI document's event kinds are the kinds the database takes
// (events_kind_check): none missing, none it would refuse.
func TestOpenAPIEventKinds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var doc struct {
		Components struct {
			Schemas struct {
				Event struct {
					Properties struct {
						Kind struct{ Enum []string }
					}
				}
			}
		}
	}
	e.admin("GET", "/admin/v1/openapi.json", nil, 200, &doc)
	var check string
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'events_kind_check' AND conrelid = 'events'::regclass`).Scan(&check))
	var stored []string
	for _, m := range regexp.MustCompile(`'([a-z_]+)'`).FindAllStringSubmatch(check, -1) {
		stored = append(stored, m[1])
	}
	documented := doc.Components.Schemas.Event.Properties.Kind.Enum
	require.Contains(t, documented, "compaction")
	slices.Sort(stored)
	slices.Sort(documented)
	require.Equal(t, stored, documented)
}

// TestAgentsOwnRequestsLeftAlone: the requests Claude Code, Codex and Gemini CLI really send for
// their own compaction, titles and model routing (proxy/testdata/agents) reach the upstream byte for byte on their
// thread's routes — no tools, no block — counted by kind, a compaction recorded in the thread's
// history; the agents' ordinary turns stay turns (docs/spec.md §18).
func TestAgentsOwnRequestsLeftAlone(t *testing.T) {
	t.Parallel()
	// The Gemini API's upstream is the scripted upstream's root, as the Messages API's is.
	e := setup(t, func(o *Options) { o.Upstreams["gemini"] = o.Upstreams["anthropic"] })
	// Codex's remote compaction must come back as exactly one compaction item, or Codex aborts
	// its turn: the upstream's answer reaches it as it came.
	const oneCompaction = `{"id":"resp_c","object":"response","status":"completed","output":[{"type":"compaction","id":"cmp_1","encrypted_content":"gAAAA"}],"usage":{"input_tokens":900,"output_tokens":40}}`
	for _, c := range []struct{ fixture, path, kind, answer string }{
		{"claude-code-compact", "/threads/cc/v1/messages?beta=true", turn.KindCompaction, `{"left":"alone"}`},
		{"claude-code-title", "/threads/cc/v1/messages?beta=true", turn.KindSide, `{"left":"alone"}`},
		{"codex-compaction-trigger", "/threads/cx/v1/responses", turn.KindCompaction, oneCompaction},
		{"codex-compact-local", "/threads/cx/v1/responses", turn.KindCompaction, `{"left":"alone"}`},
		{"codex-turn", "/threads/cx/v1/responses/compact", turn.KindCompaction, `{"left":"alone"}`},
		{"gemini-classifier", "/threads/gm/v1beta/models/gemini-3.5-flash-lite:generateContent", turn.KindSide, `{"left":"alone"}`},
	} {
		body, err := os.ReadFile(filepath.Join("testdata", "agents", c.fixture+".body.json"))
		require.NoError(t, err)
		e.up.Script(upstreamtest.JSON(200, c.answer))
		n := len(e.up.Requests())
		resp, got := e.do("POST", c.path, map[string]string{"Content-Type": "application/json"}, string(body))
		require.Equal(t, 200, resp.StatusCode, "%s: %s", c.fixture, got)
		require.Equal(t, c.answer, got, "%s: the upstream's answer as it came", c.fixture)
		reqs := e.up.Requests()
		require.Len(t, reqs, n+1, c.fixture)
		require.Equal(t, string(body), string(reqs[n].Body), "%s: forwarded as it came", c.fixture)
	}
	m := e.opts().Metrics
	require.Equal(t, 4.0, testutil.ToFloat64(m.turns.WithLabelValues(turn.KindCompaction)))
	require.Equal(t, 2.0, testutil.ToFloat64(m.turns.WithLabelValues(turn.KindSide)))
	require.Equal(t, 0.0, testutil.ToFloat64(m.turns.WithLabelValues(turn.KindTurn)))
	require.NoError(t, e.proxy.Shutdown(context.Background())) // it waits for the records
	for thread, want := range map[string]int{"cc": 1, "cx": 3} {
		var evs page[workspace.Event]
		e.admin("GET", "/admin/v1/threads/"+thread+"/events", nil, 200, &evs)
		require.Len(t, evs.Data, want, thread)
		for _, ev := range evs.Data {
			require.Equal(t, workspace.Compaction, ev.Kind)
		}
	}
}
