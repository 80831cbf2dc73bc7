package deploy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// targetLabels are the labels Prometheus adds to what it scrapes (the job, the instance, and a
// Kubernetes target's, as the Prometheus Operator's ServiceMonitor sets them): an expression may
// name them beside those wsproxy serves.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

// served is what a running wsproxy's /metrics holds: for each name a query can select (a
// histogram's _bucket, _sum and _count, a summary's _sum and _count and itself), the labels its
// series carry and the values each label took.
type served map[string]map[string]map[string]bool

// scrapeServed reads a /metrics text.
func scrapeServed(t *testing.T, text string) served {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	s := served{}
	add := func(name string, m *dto.Metric, extra ...string) {
		if s[name] == nil {
			s[name] = map[string]map[string]bool{}
		}
		for _, l := range m.GetLabel() {
			if s[name][l.GetName()] == nil {
				s[name][l.GetName()] = map[string]bool{}
			}
			s[name][l.GetName()][l.GetValue()] = true
		}
		for _, l := range extra {
			if s[name][l] == nil {
				s[name][l] = map[string]bool{}
			}
		}
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				add(name+"_bucket", m, "le")
				add(name+"_sum", m)
				add(name+"_count", m)
			case dto.MetricType_SUMMARY:
				add(name, m, "quantile")
				add(name+"_sum", m)
				add(name+"_count", m)
			default:
				add(name, m)
			}
		}
	}
	return s
}

// checkExpr parses expr with Prometheus's parser and checks that every metric it selects is one
// wsproxy serves, every label it matches, groups or joins on is one of those metrics' (or a
// target's), and every route it matches is a route wsproxy served.
func checkExpr(s served, expr string) error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	var errs []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			if n.Name == "" {
				errs = append(errs, fmt.Sprintf("%s names no metric", n))
				return nil
			}
			labelsOf, ok := s[n.Name]
			if !ok {
				errs = append(errs, fmt.Sprintf("wsproxy serves no metric %s", n.Name))
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name == labels.MetricName {
					continue
				}
				if err := checkMatcher(n.Name, labelsOf, m); err != nil {
					errs = append(errs, err.Error())
				}
			}
		case *parser.AggregateExpr:
			for _, l := range n.Grouping {
				if !labelOfAny(s, n.Expr, l) {
					errs = append(errs, fmt.Sprintf("%s groups by %s, a label of none of its metrics", n.Op, l))
				}
			}
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				for _, l := range append(slices.Clone(n.VectorMatching.MatchingLabels), n.VectorMatching.Include...) {
					if !labelOfAny(s, n, l) {
						errs = append(errs, fmt.Sprintf("%s matches on %s, a label of none of its metrics", n.Op, l))
					}
				}
			}
		}
		return nil
	})
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// checkMatcher checks a label matcher of a selector of metric, whose served labels are labelsOf.
func checkMatcher(metric string, labelsOf map[string]map[string]bool, m *labels.Matcher) error {
	values, ok := labelsOf[m.Name]
	if !ok {
		if slices.Contains(targetLabels, m.Name) {
			return nil
		}
		return fmt.Errorf("%s has no label %s", metric, m.Name)
	}
	// The routes are wsproxy's own (each one the test drove was served): a matcher that selects
	// none of them is a route that was renamed or misspelt.
	if m.Name == "route" && (m.Type == labels.MatchEqual || m.Type == labels.MatchRegexp) {
		for v := range values {
			if m.Matches(v) {
				return nil
			}
		}
		return fmt.Errorf("%s{%s} matches no route wsproxy served (%s)", metric, m, strings.Join(slices.Sorted(func(yield func(string) bool) {
			for v := range values {
				if !yield(v) {
					return
				}
			}
		}), ", "))
	}
	return nil
}

// labelOfAny reports whether label is one of the labels of a metric n selects, or a target's.
func labelOfAny(s served, n parser.Node, label string) bool {
	if slices.Contains(targetLabels, label) {
		return true
	}
	found := false
	parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if _, ok := s[vs.Name][label]; ok {
				found = true
			}
		}
		return nil
	})
	return found
}

// grafanaVariables are what Grafana substitutes in a query before Prometheus sees it, as the
// dashboard's template variables and Grafana's own would be.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", "$job", ".*", "$instance", ".*")

// labelValues is a template variable's query: label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// dashboardExprs returns every PromQL expression of the dashboard, each named by where it is,
// with Grafana's variables substituted; a template variable's label_values(selector, label) is
// checked as `count by (label) (selector)`.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	exprs := map[string]string{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			exprs[fmt.Sprintf("panel %q, query %s", p.Title, q.RefID)] = grafanaVariables.Replace(q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		query, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(grafanaVariables.Replace(query))
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, query)
			continue
		}
		exprs["variable "+v.Name] = fmt.Sprintf("count by (%s) (%s)", m[2], m[1])
	}
	for where, e := range exprs {
		if strings.Contains(e, "$") {
			t.Errorf("%s: a variable the test does not know: %s", where, e)
		}
	}
	return exprs
}

// ruleFile is a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return f
}

// TestQueriesNameServedMetrics: every expression of the dashboard and the alert rules parses,
// and every metric and label it names is one a running wsproxy serves at /metrics — after a
// thread turn in each wire API, a pass-through, admin calls, an event stream and failed
// authentications, so that the series with labels exist. A metric renamed in wsproxy breaks
// this test, not the dashboard.
func TestQueriesNameServedMetrics(t *testing.T) {
	t.Parallel()
	w := startWsproxy(t)
	thread := "deploy-" + rand.Text()[:8]
	for _, r := range []struct {
		method, path, body string
		header             map[string]string
		status             int
	}{
		{"POST", "/v1/chat/completions", `{"model":"wsproxy-demo","messages":[{"role":"user","content":"My goal is to plan a trip. I prefer small hotels."}]}`, map[string]string{"X-Thread-Id": thread}, 200},
		{"POST", "/threads/" + thread + "/v1/chat/completions", `{"model":"wsproxy-demo","stream":true,"messages":[{"role":"user","content":"What are my preferences?"}]}`, nil, 200},
		{"POST", "/threads/" + thread + "/v1/responses", `{"model":"wsproxy-demo","input":"It must be by train."}`, nil, 200},
		{"POST", "/threads/" + thread + "/v1/messages", `{"model":"wsproxy-demo","max_tokens":256,"messages":[{"role":"user","content":"I prefer window seats."}]}`, nil, 200},
		{"POST", "/threads/" + thread + "/v1beta/models/wsproxy-demo:generateContent", `{"contents":[{"role":"user","parts":[{"text":"I prefer quiet carriages."}]}]}`, nil, 200},
		{"POST", "/v1/chat/completions", `{"model":"wsproxy-demo","messages":[{"role":"user","content":"Hello"}]}`, nil, 200}, // no thread: forwarded as it came
		{"GET", "/v1/models", "", nil, 0},     // a pass-through route, whatever the demo model answers
		{"GET", "/v1beta/models", "", nil, 0}, // the Gemini API's
		{"GET", "/admin/v1/threads/" + thread, "", map[string]string{"Authorization": "Bearer " + w.adminToken}, 200},
		{"GET", "/admin/v1/threads", "", map[string]string{"Authorization": "Bearer not-the-token"}, 401},
		{"POST", "/mcp", `{}`, nil, 401},
	} {
		w.do(t, r.method, r.path, r.body, r.header, r.status)
	}
	// An event stream, open while /metrics is read.
	req, err := http.NewRequest("GET", w.url+"/admin/v1/threads/"+thread+"/events/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+w.adminToken)
	stream, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if stream.StatusCode != 200 {
		t.Fatalf("event stream: %d", stream.StatusCode)
	}

	s := scrapeServed(t, w.do(t, "GET", "/metrics", "", nil, 200))
	for _, name := range []string{"wsproxy_http_requests_total", "wsproxy_tool_rounds_bucket", "go_goroutines"} {
		if _, ok := s[name]; !ok {
			t.Fatalf("/metrics has no %s: %v", name, s)
		}
	}
	exprs := dashboardExprs(t)
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			exprs[fmt.Sprintf("rule %s%s", r.Alert, r.Record)] = r.Expr
		}
	}
	for _, where := range slices.Sorted(func(yield func(string) bool) {
		for k := range exprs {
			if !yield(k) {
				return
			}
		}
	}) {
		if err := checkExpr(s, exprs[where]); err != nil {
			t.Errorf("%s: %v\n\t%s", where, err, exprs[where])
		}
	}
	t.Logf("%d expressions checked against %d served names", len(exprs), len(s))
}

// wsproxy is a running wsproxy process.
type wsproxy struct {
	url, adminToken string
}

// startWsproxy builds wsproxy from this repository and starts it with the demo model, on a free
// loopback port and a fresh schema of the test database (TEST_DATABASE_URL, as `scripts/pg.sh
// exec` sets it); it is stopped when the test ends.
func startWsproxy(t *testing.T) *wsproxy {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "wsproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/proxy")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/proxy: %v\n%s", err, out)
	}
	w := &wsproxy{adminToken: rand.Text()}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+schemaURL(t), "UPSTREAM_BASE_URL=demo", "LISTEN_ADDR=127.0.0.1:0",
		"ADMIN_TOKEN="+w.adminToken, "LOG_FORMAT=json", "LOG_LEVEL=info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	// The start line names the address it listens on; the rest of the log is drained.
	lines := bufio.NewScanner(stderr)
	var log []string
	for lines.Scan() {
		log = append(log, lines.Text())
		var line struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "wsproxy serving" {
			w.url = line.URL
			break
		}
	}
	if w.url == "" {
		t.Fatalf("wsproxy did not start:\n%s", strings.Join(log, "\n"))
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	return w
}

// do sends a request and returns its body, failing unless its status is status (0: any).
func (w *wsproxy) do(t *testing.T, method, path, body string, header map[string]string, status int) string {
	t.Helper()
	req, err := http.NewRequest(method, w.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if status != 0 && resp.StatusCode != status {
		t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, status, b)
	}
	return string(b)
}

// schemaURL returns a URL of the test database (TEST_DATABASE_URL, else DATABASE_URL) whose
// search_path is a fresh schema, dropped when the test ends.
func schemaURL(t *testing.T) string {
	t.Helper()
	base := os.Getenv("TEST_DATABASE_URL")
	if base == "" {
		base = os.Getenv("DATABASE_URL")
	}
	if base == "" {
		t.Fatal("no Postgres: set TEST_DATABASE_URL, or run the test under scripts/pg.sh exec (make test does)")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect to the test database: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "deploy_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		// After wsproxy has stopped (cleanups run last-registered first).
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		_ = conn.Close(ctx)
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse the test database's URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
