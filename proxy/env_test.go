package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

const adminToken = testkit.AdminToken

// env is a running proxy on a fresh schema in front of a scripted upstream.
type env struct {
	t     testing.TB
	up    *upstreamtest.Server
	srv   *httptest.Server
	proxy *Server
	pool  *pgxpool.Pool
	store *workspace.Store
	reg   *prometheus.Registry
	o     Options
}

func (e *env) opts() Options { return e.o }

func setup(t testing.TB, configure ...func(*Options)) *env {
	t.Helper()
	pool := dbtest.NewPool(t, nil)
	return setupWithPool(t, pool, configure...)
}

func setupWithPool(t testing.TB, pool *pgxpool.Pool, configure ...func(*Options)) *env {
	t.Helper()
	up := upstreamtest.New(t)
	u, err := url.Parse(up.URL)
	require.NoError(t, err)
	root, err := url.Parse(up.Server.URL) // the Messages API's base URL: …/v1/messages follows it
	require.NoError(t, err)
	store := workspace.NewStore(pool, workspace.Options{})
	reg := prometheus.NewRegistry()
	opts := Options{
		Store:           store,
		UpstreamURL:     u,
		Upstreams:       map[API]Upstream{Anthropic: {URL: root}},
		AdminToken:      adminToken,
		Metrics:         watched(NewMetrics(reg, MetricsOptions{}), pool),
		Instructions:    "INSTR",
		UpstreamTimeout: 10 * time.Second,
		RetryBackoff:    time.Millisecond,
		EventsInterval:  20 * time.Millisecond,
	}
	for _, c := range configure {
		c(&opts)
	}
	p := NewServer(opts)
	srv := httptest.NewUnstartedServer(p)
	srv.Listener = Listener(srv.Listener)
	srv.Config.ConnContext = ConnContext
	srv.Start()
	t.Cleanup(func() {
		shut := make(chan error, 1)
		go func() { shut <- p.Shutdown(context.Background()) }() // the event streams end, so srv.Close can finish
		srv.Close()
		<-shut
	})
	return &env{t: t, up: up, srv: srv, proxy: p, pool: pool, store: store, reg: reg, o: opts}
}

// goClient is go-openai pointed at the thread's path form of the base URL ("" for no thread).
func (e *env) goClient(thread string) *goopenai.Client {
	cfg := goopenai.DefaultConfig("sk-client")
	cfg.BaseURL = e.srv.URL + "/v1"
	if thread != "" {
		cfg.BaseURL = e.srv.URL + "/threads/" + thread + "/v1"
	}
	return goopenai.NewClientWithConfig(cfg)
}

// officialClient is openai-go naming the thread with the X-Thread-Id header.
func (e *env) officialClient(thread string) openaigo.Client {
	return openaigo.NewClient(
		option.WithBaseURL(e.srv.URL+"/v1/"),
		option.WithAPIKey("sk-client"),
		option.WithHeader("X-Thread-Id", thread),
		option.WithMaxRetries(0),
	)
}

// post sends a raw request to the proxy.
func (e *env) post(path string, header map[string]string, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// admin calls the admin REST and decodes the JSON answer into out (when not nil).
func (e *env) admin(method, path string, body any, wantStatus int, out any) {
	e.t.Helper()
	testkit.Admin(e.t, e.srv.URL, method, path, body, wantStatus, out)
}

// workspace reads a thread's workspace, named in its stored form (client~thread for a client's).
func (e *env) workspace(thread string) workspace.Detail {
	e.t.Helper()
	return testkit.Workspace(e.t, e.store, thread)
}

// turns is how many turns a thread has had (the admin listing's turns).
func (e *env) turns(thread string) int {
	e.t.Helper()
	var threads page[workspace.Thread]
	e.admin("GET", "/admin/v1/threads?limit=500", nil, 200, &threads)
	for _, th := range threads.Data {
		if th.ID == thread {
			return th.Turns
		}
	}
	e.t.Fatalf("no thread %s", thread)
	return 0
}

// upstreamMessages decodes the messages of the n-th upstream request.
func (e *env) upstreamRequest(n int) map[string]any {
	e.t.Helper()
	reqs := e.up.Requests()
	require.Greater(e.t, len(reqs), n, "upstream requests")
	return reqs[n].JSON(e.t)
}

func toolNames(req map[string]any) []string {
	var names []string
	list, _ := req["tools"].([]any)
	for _, tl := range list {
		fn, _ := tl.(map[string]any)["function"].(map[string]any)
		name, _ := fn["name"].(string)
		names = append(names, name)
	}
	return names
}

func messages(req map[string]any) []map[string]any {
	var out []map[string]any
	for _, m := range req["messages"].([]any) {
		out = append(out, m.(map[string]any))
	}
	return out
}

type call = upstreamtest.Call

var (
	args = upstreamtest.Args
	cmpl = upstreamtest.Completion
)

func reply(body string) upstreamtest.Reply { return upstreamtest.JSON(200, body) }

func pgxpoolNew(cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// page is a list answer of the admin REST.
type page[T any] struct {
	Data    []T  `json:"data"`
	HasMore bool `json:"has_more"`
}

// watched is m reporting pool's state.
func watched(m *Metrics, pool *pgxpool.Pool) *Metrics {
	m.WatchPool(pool)
	return m
}

// setAnthropicKey sets the operator's key toward the Messages API's upstream.
func setAnthropicKey(o *Options, key string) {
	up := o.Upstreams["anthropic"]
	up.APIKey = key
	o.Upstreams["anthropic"] = up
}
