package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	labelsk8s "k8s.io/apimachinery/pkg/labels"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/berth-ci/berth/internal/dev/testground/dashboards"

	// The controller's packages register berth's metrics with controller-runtime's registry.
	_ "github.com/berth-ci/berth/internal/controller"
)

// runbooks is where each alert's runbook_url points, at the alert's heading.
const runbooks = "https://github.com/berth-ci/berth/blob/main/docs/alerts.md"

// What operators must hear about; each metric must be watched by some alert.
var mustWatch = []string{
	"berth_config_valid",
	"berth_platform_usable",
	"berth_host_quarantined",
	"berth_wait_seconds",
	"berth_clean_failures_total",
	"berth_vm_lost_total",
	"berth_vm_leaks_terminated_total",
	"berth_local_affinity_missing_total",
}

// Labels Prometheus gives every series it scrapes through config/prometheus's ServiceMonitor
// (pod and instance are too, but the alerts aggregate them away).
var targetLabels = []string{"namespace", "service", "job", "endpoint", "container"}

// A PrometheusRule of monitoring.coreos.com/v1, as much as berth writes of it.
type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name     string `json:"name"`
			Interval string `json:"interval,omitempty"`
			Rules    []rule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// alertRules renders config/prometheus and returns its alerting rules, decoded strictly: a
// misspelt field is an error, not an alert Prometheus silently lacks.
func alertRules(t *testing.T, objs []*unstructured.Unstructured) []rule {
	t.Helper()
	var out []rule
	for _, o := range objs {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		var pr prometheusRule
		if err := dec.Decode(&pr); err != nil {
			t.Fatalf("PrometheusRule %s: %v", o.GetName(), err)
		}
		if pr.APIVersion != "monitoring.coreos.com/v1" {
			t.Errorf("PrometheusRule %s is %s, want monitoring.coreos.com/v1", o.GetName(), pr.APIVersion)
		}
		for _, g := range pr.Spec.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					out = append(out, r)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no alerting rule", prometheusDir)
	}
	return out
}

// Every alert parses with Prometheus' own parser into an instant vector, names only metrics
// the controller exports (or the up series of its scrape job), uses only labels those series
// carry, and tells the person paged what happened and where its runbook is.
func TestAlertsWatchMetricsBerthExports(t *testing.T) {
	objs := render(t, prometheusDir)
	rules := alertRules(t, objs)
	exported := exportedMetrics(t)
	job := scrapeJob(t, objs)
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "alerts.md"))
	if err != nil {
		t.Fatal(err)
	}
	watched := map[string]bool{}
	names := map[string]bool{}
	for _, r := range rules {
		t.Run(r.Alert, func(t *testing.T) {
			if names[r.Alert] {
				t.Errorf("two alerts named %s", r.Alert)
			}
			names[r.Alert] = true
			expr, err := parser.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("expr does not parse: %v\n%s", err, r.Expr)
			}
			if expr.Type() != parser.ValueTypeVector {
				t.Errorf("expr is a %s, want an instant vector", expr.Type())
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("for: %v", err)
				}
			}
			seriesLabels := slices.Clone(targetLabels)
			for _, s := range selectors(expr) {
				name := metricName(s)
				switch base, ok := dashboards.ExportedAs(exported, name); {
				case name == "":
					t.Errorf("selector %s names no single metric; it cannot be checked", s)
				case name == "up":
					// Prometheus' own series of a scrape: berth's only under its job.
					if !matches(s, "job", job) {
						t.Errorf("%s is not the scrape of berth's metrics: select up{job=%q}", s, job)
					}
				case !ok:
					t.Errorf("%s is not a metric berth exports", name)
				default:
					watched[base] = true
					seriesLabels = append(seriesLabels, exported[base]...)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("severity %q, want critical or warning", s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("no %s annotation", a)
				}
			}
			for a, text := range r.Annotations {
				checkTemplate(t, a, text, seriesLabels)
			}
			if want := runbooks + "#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("runbook_url %q, want %q", r.Annotations["runbook_url"], want)
			}
			if !regexp.MustCompile(`(?m)^#+ ` + regexp.QuoteMeta(r.Alert) + `$`).Match(doc) {
				t.Errorf("docs/alerts.md has no heading %s for the runbook", r.Alert)
			}
		})
	}
	for _, m := range mustWatch {
		if !watched[m] {
			t.Errorf("no alert watches %s", m)
		}
	}
}

// The ServiceMonitor scrapes the controller's metrics Service of config/default.
func TestServiceMonitorScrapesTheController(t *testing.T) {
	scrapeJob(t, render(t, prometheusDir))
}

// scrapeJob is the job label of berth's series: the name of the Service config/prometheus's
// ServiceMonitor selects in config/default, after checking it selects exactly that one and
// scrapes a port it has.
func scrapeJob(t *testing.T, prom []*unstructured.Unstructured) string {
	t.Helper()
	var monitors []*unstructured.Unstructured
	for _, o := range prom {
		if o.GetKind() == "ServiceMonitor" {
			monitors = append(monitors, o)
		}
	}
	if len(monitors) != 1 {
		t.Fatalf("%s has %d ServiceMonitors, want one", prometheusDir, len(monitors))
	}
	m := monitors[0]
	selector, _, _ := unstructured.NestedStringMap(m.Object, "spec", "selector", "matchLabels")
	endpoints, _, _ := unstructured.NestedSlice(m.Object, "spec", "endpoints")
	if len(selector) == 0 || len(endpoints) == 0 {
		t.Fatalf("ServiceMonitor %s selects %v and scrapes %v", m.GetName(), selector, endpoints)
	}
	var selected []corev1.Service
	for _, s := range ofKind[corev1.Service](t, render(t, defaultDir), "Service") {
		if s.Namespace == m.GetNamespace() && labelsk8s.SelectorFromSet(selector).Matches(labelsk8s.Set(s.Labels)) {
			selected = append(selected, s)
		}
	}
	if len(selected) != 1 {
		t.Fatalf("ServiceMonitor %s/%s selects %d Services of config/default, want the controller's metrics Service", m.GetNamespace(), m.GetName(), len(selected))
	}
	for _, e := range endpoints {
		port, _ := e.(map[string]any)["port"].(string)
		if !slices.ContainsFunc(selected[0].Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == port }) {
			t.Errorf("ServiceMonitor %s scrapes port %q, which Service %s does not have", m.GetName(), port, selected[0].Name)
		}
	}
	return selected[0].Name // the operator's job label, unless the monitor sets jobLabel
}

// exportedMetrics are the metrics controller-runtime's registry serves, with their label
// names (dashboards.Registered).
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	all, ok := ctrlmetrics.Registry.(prometheus.Collector)
	if !ok {
		t.Fatalf("controller-runtime's registry (%T) cannot describe its metrics", ctrlmetrics.Registry)
	}
	out, err := dashboards.Registered(all)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := out["berth_config_valid"]; !ok {
		t.Fatalf("berth_config_valid is not among the %d metrics registered: are berth's controller packages imported?", len(out))
	}
	return out
}

// selectors are the series selectors of an expression, those in range vectors included.
func selectors(expr parser.Expr) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if s, ok := n.(*parser.VectorSelector); ok {
			out = append(out, s)
		}
		return nil
	})
	return out
}

// metricName is the one metric a selector selects, or "" if it may select several.
func metricName(s *parser.VectorSelector) string {
	if s.Name != "" {
		return s.Name
	}
	for _, m := range s.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

// matches tells whether a selector requires label name to equal value.
func matches(s *parser.VectorSelector, name, value string) bool {
	return slices.ContainsFunc(s.LabelMatchers, func(m *labels.Matcher) bool {
		return m.Name == name && m.Type == labels.MatchEqual && m.Value == value
	})
}

// checkTemplate parses an annotation as Prometheus expands it (its variables and template
// functions) and checks that every $labels.<name> it prints is a label of the series the
// expression reads: a misspelt label prints nothing when the alert fires.
func checkTemplate(t *testing.T, annotation, text string, seriesLabels []string) {
	t.Helper()
	// The variables Prometheus defines before expanding an annotation (rules/alerting.go).
	const defs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
	funcs := template.FuncMap{}
	// Prometheus' template functions (template/template.go); only their names matter here.
	for _, f := range []string{"query", "first", "label", "value", "strvalue", "args", "reReplaceAll", "safeHtml",
		"match", "title", "toUpper", "toLower", "graphLink", "tableLink", "sortByLabel", "humanize", "humanize1024",
		"humanizeDuration", "humanizePercentage", "humanizeTimestamp", "toTime", "toDuration", "pathPrefix",
		"externalURL", "parseDuration", "stripPort", "stripDomain", "urlQueryEscape"} {
		funcs[f] = func(...any) (any, error) { return nil, nil }
	}
	if _, err := template.New(annotation).Funcs(funcs).Parse(defs + text); err != nil {
		t.Errorf("annotation %s is not a valid template: %v", annotation, err)
	}
	for _, m := range regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`).FindAllStringSubmatch(text, -1) {
		if !slices.Contains(seriesLabels, m[1]) {
			t.Errorf("annotation %s prints $labels.%s, but the series have only %v", annotation, m[1], seriesLabels)
		}
	}
}
