package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"helm.sh/helm/v4/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir         = "helm/wsproxy"
	productionValues = "helm/wsproxy/ci/production-values.yaml"
	rulesFile        = "helm/wsproxy/files/wsproxy-rules.yaml"
	rulesTestFile    = "helm/wsproxy/files/wsproxy-rules.test.yaml"
	dashboardFile    = "helm/wsproxy/files/wsproxy-dashboard.json"
)

// secretSettings are wsproxy's settings that hold a secret: the chart takes each from a key of
// an existing Secret, never from a value.
var secretSettings = []string{"DATABASE_URL", "ADMIN_TOKEN", "UPSTREAM_API_KEY", "ANTHROPIC_UPSTREAM_API_KEY",
	"GEMINI_UPSTREAM_API_KEY", "CLIENT_KEYS", "METRICS_TOKEN"}

// newObject returns the Kubernetes API type of a rendered object's apiVersion and kind: every
// kind the chart may render has one, and a kind without one fails the test.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, true
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, true
	case "networking.k8s.io/v1 Ingress":
		return &networkingv1.Ingress{}, true
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, true
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &monitoringv1.PrometheusRule{}, true
	}
	return nil, false
}

// rendered is a chart's objects as decoded, by kind.
type rendered map[string][]any

// render renders the chart as `helm template` does (the values of valuesFile over the chart's
// own, checked against values.schema.json), and decodes every object strictly into its API type:
// a field the type does not have fails.
func render(t *testing.T, valuesFile string) rendered {
	t.Helper()
	objects, err := renderValues(readValues(t, valuesFile))
	if err != nil {
		t.Fatal(err)
	}
	return objects
}

// readValues reads a values file; "" is none.
func readValues(t *testing.T, valuesFile string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	if valuesFile == "" {
		return vals
	}
	b, err := os.ReadFile(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &vals); err != nil {
		t.Fatalf("%s: %v", valuesFile, err)
	}
	return vals
}

// renderValues renders the chart with vals over its values, and decodes each object strictly.
func renderValues(vals map[string]any) (rendered, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load the chart: %w", err)
	}
	opts := common.ReleaseOptions{Name: "wsproxy", Namespace: "ai", Revision: 1, IsInstall: true}
	top, err := util.ToRenderValuesWithSchemaValidation(chrt, vals, opts, common.DefaultCapabilities.Copy(), false)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(chrt, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	objects := rendered{}
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range files {
			if !yield(name) {
				return
			}
		}
	})
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, _helpers.tpl
		}
		for _, doc := range releaseutil.SplitManifests(files[name]) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", name, err, doc)
			}
			obj, ok := newObject(meta.APIVersion, meta.Kind)
			if !ok {
				return nil, fmt.Errorf("%s: no API type known for %s %s", name, meta.APIVersion, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				return nil, fmt.Errorf("%s: %s %s does not decode strictly: %w\n%s", name, meta.APIVersion, meta.Kind, err, doc)
			}
			objects[meta.Kind] = append(objects[meta.Kind], obj)
		}
	}
	return objects, nil
}

// only returns the one object of kind, failing unless there is exactly one.
func only[T any](t *testing.T, objects rendered, kind string) T {
	t.Helper()
	if len(objects[kind]) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(objects[kind]), kind)
	}
	return objects[kind][0].(T)
}

func kinds(objects rendered) []string {
	var ks []string
	for k := range objects {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestChartLint: Helm's lint (what `helm lint` runs: Chart.yaml, the values against the schema,
// the templates rendered and parsed) finds no warning or error, with the default values and the
// production example.
func TestChartLint(t *testing.T) {
	t.Parallel()
	for _, valuesFile := range []string{"", productionValues} {
		vals := readValues(t, valuesFile)
		result := lint.RunAll(chartDir, vals, "ai")
		for _, m := range result.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint (values %q): %s", valuesFile, m)
			} else {
				t.Logf("helm lint (values %q): %s", valuesFile, m)
			}
		}
	}
}

// TestChartDefaults: the default values render the Deployment, its Service, ServiceAccount and
// PodDisruptionBudget, and nothing that needs the Prometheus Operator or an ingress controller.
func TestChartDefaults(t *testing.T) {
	t.Parallel()
	objects := render(t, "")
	if got, want := kinds(objects), []string{"Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"}; !slices.Equal(got, want) {
		t.Fatalf("kinds rendered: %v, want %v", got, want)
	}
	d := only[*appsv1.Deployment](t, objects, "Deployment")
	checkDeployment(t, d)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas: %v, want 2", d.Spec.Replicas)
	}
}

// TestChartProduction: the production example renders every object the chart has, each as an
// SRE expects it: the HPA owns the replicas, the ServiceMonitor scrapes with the metrics token
// from the Secret, the PrometheusRule holds the rules file's groups and the dashboard's
// ConfigMap the dashboard, labelled for Grafana's sidecar.
func TestChartProduction(t *testing.T) {
	t.Parallel()
	objects := render(t, productionValues)
	want := []string{"ConfigMap", "Deployment", "HorizontalPodAutoscaler", "Ingress", "PodDisruptionBudget", "PrometheusRule", "Service", "ServiceAccount", "ServiceMonitor"}
	if got := kinds(objects); !slices.Equal(got, want) {
		t.Fatalf("kinds rendered: %v, want %v", got, want)
	}
	d := only[*appsv1.Deployment](t, objects, "Deployment")
	checkDeployment(t, d)
	if d.Spec.Replicas != nil {
		t.Errorf("replicas %d set beside the HPA: each upgrade would reset what it scaled to", *d.Spec.Replicas)
	}
	hpa := only[*autoscalingv2.HorizontalPodAutoscaler](t, objects, "HorizontalPodAutoscaler")
	if hpa.Spec.ScaleTargetRef.Name != d.Name || hpa.Spec.ScaleTargetRef.Kind != "Deployment" {
		t.Errorf("the HPA scales %+v, not the Deployment %s", hpa.Spec.ScaleTargetRef, d.Name)
	}

	sm := only[*monitoringv1.ServiceMonitor](t, objects, "ServiceMonitor")
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Path != "/metrics" || sm.Spec.Endpoints[0].Port != "http" {
		t.Fatalf("ServiceMonitor endpoints: %+v", sm.Spec.Endpoints)
	}
	if a := sm.Spec.Endpoints[0].Authorization; a == nil || a.Credentials == nil || a.Credentials.Name != "wsproxy" || a.Credentials.Key != "metrics-token" {
		t.Errorf("the ServiceMonitor does not send METRICS_TOKEN from the Secret: %+v", a)
	}
	svc := only[*corev1.Service](t, objects, "Service")
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, which the Service does not carry", k, v)
		}
	}

	rule := only[*monitoringv1.PrometheusRule](t, objects, "PrometheusRule")
	var file monitoringv1.PrometheusRuleSpec
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &file); err != nil {
		t.Fatalf("%s is not a PrometheusRule's spec: %v", rulesFile, err)
	}
	if got, want := mustJSON(t, rule.Spec), mustJSON(t, file); !bytes.Equal(got, want) {
		t.Errorf("the PrometheusRule's spec is not %s", rulesFile)
	}
	if rule.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels: %v", rule.Labels)
	}

	cm := only[*corev1.ConfigMap](t, objects, "ConfigMap")
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard's ConfigMap lacks the sidecar's label grafana_dashboard: \"1\": %v", cm.Labels)
	}
	dash, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Data["wsproxy-dashboard.json"]; got != strings.TrimSuffix(string(dash), "\n") {
		t.Errorf("the ConfigMap's dashboard is not %s", dashboardFile)
	}
	ing := only[*networkingv1.Ingress](t, objects, "Ingress")
	if b := ing.Spec.Rules[0].HTTP.Paths[0].Backend.Service; b == nil || b.Name != svc.Name {
		t.Errorf("the Ingress routes to %+v, not the Service %s", b, svc.Name)
	}
}

// checkDeployment checks what every rendering's Deployment must be: wsproxy as a non-root user
// on a read-only root filesystem with nothing to escalate, probed on /healthz and /readyz, with
// resources, and every secret setting from a Secret's key, never a literal.
func checkDeployment(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Error("the pod may run as root")
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the root filesystem is writable")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Error("the container may escalate or keeps capabilities")
	}
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name {
			t.Errorf("no probe on %s: %+v", name, p)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources: %+v", c.Resources)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if env["LISTEN_ADDR"].Value != ":8080" {
		t.Errorf("LISTEN_ADDR: %q", env["LISTEN_ADDR"].Value)
	}
	for _, name := range secretSettings {
		e, ok := env[name]
		if !ok {
			if name == "DATABASE_URL" {
				t.Error("DATABASE_URL is not set")
			}
			continue
		}
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name == "" || e.ValueFrom.SecretKeyRef.Key == "" {
			t.Errorf("%s is not taken from a Secret's key: %+v", name, e)
		}
	}
}

// TestChartRefusesSecretLiterals: a secret setting given as a value, a key of the values that
// does not exist (a typo), or a Secret without a name are refused by values.schema.json before
// anything renders.
func TestChartRefusesSecretLiterals(t *testing.T) {
	t.Parallel()
	for name, vals := range map[string]map[string]any{
		"a secret in config":     {"config": map[string]any{"DATABASE_URL": "postgres://wsproxy:secret@db/wsproxy"}},
		"an unknown secret key":  {"secretKeys": map[string]any{"DATABASE_URL": "database-url", "OPENAI_API_KEY": "key"}},
		"a misspelt value":       {"replicaCout": 3},
		"no Secret":              {"existingSecret": ""},
		"no DATABASE_URL's key":  {"secretKeys": map[string]any{"DATABASE_URL": ""}},
		"LISTEN_ADDR in config":  {"config": map[string]any{"LISTEN_ADDR": ":9090"}},
		"a lowercase config key": {"config": map[string]any{"log_format": "json"}},
	} {
		if _, err := renderValues(vals); err == nil || !strings.Contains(err.Error(), "values") {
			t.Errorf("%s: rendered (err %v)", name, err)
		}
	}
}

// TestChartAppVersion: the chart's appVersion is the version wsproxy builds (VERSION).
func TestChartAppVersion(t *testing.T) {
	t.Parallel()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := os.ReadFile(filepath.Join("..", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := chrt.Metadata.AppVersion, strings.TrimSpace(string(v)); got != want {
		t.Errorf("Chart.yaml appVersion %q, VERSION %q", got, want)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestChartInstallAsDocumented: each `helm install` and `helm upgrade --install` of
// docs/operations.md's Kubernetes section, with its --set flags, renders and decodes strictly,
// and the Deployment it renders takes every secret from a key the section's `kubectl create
// secret` before it creates, in the Secret of that name, and runs the image its `podman push`
// pushed: the commands work as printed (no cluster here to run them on).
func TestChartInstallAsDocumented(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Kubernetes\n")
	if !ok {
		t.Fatal("docs/operations.md has no section Kubernetes")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	// The commands of the section's shell examples, continuations joined.
	var commands []string
	fenced := false
	for _, line := range strings.Split(strings.ReplaceAll(section, "\\\n", " "), "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			fenced = strings.TrimPrefix(line, "```") == "shell"
		case fenced:
			commands = append(commands, line)
		}
	}
	version, err := os.ReadFile(filepath.Join("..", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	pushed, secretName, secretKeys, installs := "", "", map[string]bool{}, 0
	for _, c := range commands {
		f := strings.Fields(strings.ReplaceAll(c, "$(cat VERSION)", strings.TrimSpace(string(version))))
		switch {
		case slices.Contains(f, "push"):
			pushed = f[len(f)-1]
		case slices.Contains(f, "secret") && slices.Contains(f, "generic"):
			secretName, secretKeys = f[slices.Index(f, "generic")+1], map[string]bool{}
			for _, a := range f {
				if lit, ok := strings.CutPrefix(a, "--from-literal="); ok {
					secretKeys[lit[:strings.Index(lit, "=")]] = true
				}
			}
		case len(f) > 2 && f[0] == "helm" && (f[1] == "install" || f[1] == "upgrade"):
			installs++
			if !slices.Contains(f, filepath.Join("deploy", chartDir)) {
				t.Errorf("%q installs no chart deploy/%s", c, chartDir)
			}
			vals := map[string]any{}
			for i, a := range f {
				if a == "--set" && i+1 < len(f) {
					if err := strvals.ParseInto(f[i+1], vals); err != nil {
						t.Fatalf("%q: --set %s: %v", c, f[i+1], err)
					}
				}
			}
			objects, err := renderValues(vals)
			if err != nil {
				t.Fatalf("%q: %v", c, err)
			}
			d := only[*appsv1.Deployment](t, objects, "Deployment")
			checkDeployment(t, d)
			if img := d.Spec.Template.Spec.Containers[0].Image; img != pushed {
				t.Errorf("%q runs the image %s, not the one pushed before it (%q)", c, img, pushed)
			}
			if secretName == "" {
				t.Fatalf("%q: no kubectl create secret before it", c)
			}
			for _, e := range d.Spec.Template.Spec.Containers[0].Env {
				if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
					if ref.SecretKeyRef.Name != secretName || !secretKeys[ref.SecretKeyRef.Key] {
						t.Errorf("%q: %s is taken from key %s of Secret %s, which the section's Secret %s (keys %v) does not have",
							c, e.Name, ref.SecretKeyRef.Key, ref.SecretKeyRef.Name, secretName, slices.Sorted(maps.Keys(secretKeys)))
					}
				}
			}
		}
	}
	if installs == 0 {
		t.Fatal("docs/operations.md's Kubernetes section has no helm install")
	}
}
