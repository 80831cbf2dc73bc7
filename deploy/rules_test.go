package deploy

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// promtool is the path of promtool; the rules' tests fail without it (Debian's package
// prometheus has it; .ci/run installs it).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: the alert rules cannot be checked (Debian/Ubuntu: apt-get install prometheus)")
	}
	return p
}

// TestAlertRulesPromtool: promtool accepts the rule file (promtool check rules) and its unit
// tests pass (promtool test rules): each alert fires on the traffic it is for, once its `for`
// has passed, and stays quiet on traffic that is not.
func TestAlertRulesPromtool(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", filepath.Base(rulesFile)}, {"test", "rules", filepath.Base(rulesTestFile)}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = filepath.Dir(rulesFile)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// ruleTests is promtool's unit test file, as far as this test reads it.
type ruleTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertRulesComplete: every alert has a `for`, a severity, a summary and a runbook_url that
// names a heading of docs/operations.md, and unit tests that see it fire and see it quiet.
func TestAlertRulesComplete(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests ruleTests
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	if !slices.Equal(tests.RuleFiles, []string{filepath.Base(rulesFile)}) {
		t.Errorf("%s tests %v, not %s", rulesTestFile, tests.RuleFiles, filepath.Base(rulesFile))
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, g := range tests.Tests {
		for _, a := range g.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	anchors := headingAnchors(t, filepath.Join("..", "docs", "operations.md"))
	alerts := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if d, err := model.ParseDuration(r.For); err != nil || time.Duration(d) <= 0 {
				t.Errorf("%s: for %q: an alert waits before it fires", r.Alert, r.For)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: no summary or description", r.Alert)
			}
			u, err := url.Parse(r.Annotations["runbook_url"])
			if err != nil || !strings.HasSuffix(u.Path, "/docs/operations.md") || !anchors[u.Fragment] {
				t.Errorf("%s: runbook_url %q names no heading of docs/operations.md", r.Alert, r.Annotations["runbook_url"])
			}
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: %s has no test where it fires (%v) or none where it stays quiet (%v)", r.Alert, rulesTestFile, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	if alerts == 0 {
		t.Fatalf("%s has no alert", rulesFile)
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown file: lower case,
// spaces as hyphens, other punctuation dropped.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	anchors := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
	}
	return anchors
}
