package dashboards

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	// What cmd/berth runs: its packages register berth's metrics with controller-runtime's
	// registry, the one /metrics serves — the controller's, the key server's and the build's.
	_ "github.com/berth-ci/berth/internal/cli"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
)

// What issue 57 asks the dashboard to show, by the metric that shows it: queue and ETA,
// hand-over, slots, hosts' health and quarantine, VMs, launches and fallbacks, the key server,
// the config.
var mustShow = []string{
	"berth_waiting_tasks", "berth_wait_seconds", "berth_allocation_seconds",
	"berth_host_slots_used", "berth_host_slots_capacity", "berth_host_quarantined",
	"berth_vms", "berth_vm_launches_total", "berth_vm_launch_fallbacks_total",
	"berth_otp_redemptions_total", "berth_config_valid", "berth_platform_usable",
}

// Labels Prometheus adds to every series it scrapes (the ServiceMonitor's target labels).
var targetLabels = []string{"namespace", "service", "job", "endpoint", "container", "pod", "instance"}

// berthDashboard renders config/grafana as `kubectl apply -k` would and returns its one
// ConfigMap, after checking that a Grafana sidecar selects it.
func berthDashboard(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "config", "grafana"))
	if err != nil {
		t.Fatalf("kustomize build config/grafana: %v", err)
	}
	if n := len(resources.Resources()); n != 1 {
		t.Fatalf("config/grafana renders %d objects, want the dashboard's ConfigMap", n)
	}
	m, err := resources.Resources()[0].Map()
	if err != nil {
		t.Fatal(err)
	}
	cm := &unstructured.Unstructured{Object: m}
	if cm.GetKind() != "ConfigMap" || cm.GetName() != "berth-dashboard" || cm.GetLabels()["grafana_dashboard"] != "true" {
		t.Fatalf("config/grafana renders %s %s labelled %v, want ConfigMap berth-dashboard labelled grafana_dashboard: \"true\"", cm.GetKind(), cm.GetName(), cm.GetLabels())
	}
	if data, _, _ := unstructured.NestedStringMap(cm.Object, "data"); len(data) != 1 || data["berth.json"] == "" {
		t.Fatalf("berth-dashboard holds %d data keys, want berth.json alone", len(data))
	}
	return cm
}

// Every query of berth's dashboard parses with Prometheus' own parser into an instant vector,
// reads only metrics berth registers, matches and groups only by labels those series carry,
// and together they show what an operator must see.
func TestBerthDashboardReadsWhatBerthExports(t *testing.T) {
	cm := berthDashboard(t)
	raw, err := yaml.Marshal(cm.Object)
	if err != nil {
		t.Fatal(err)
	}
	queries, err := Queries(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) == 0 {
		t.Fatal("berth's dashboard has no query")
	}
	exported := exportedMetrics(t)
	shown := map[string]bool{}
	for _, q := range queries {
		expr, err := parser.ParseExpr(q.Expr)
		if err != nil {
			t.Errorf("panel %q: the query does not parse: %v\n%s", q.Panel, err, q.Expr)
			continue
		}
		if expr.Type() != parser.ValueTypeVector {
			t.Errorf("panel %q: the query is a %s, want an instant vector", q.Panel, expr.Type())
		}
		seriesLabels := func(n parser.Node) []string {
			out := slices.Clone(targetLabels)
			parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
				if s, ok := n.(*parser.VectorSelector); ok {
					base, ok := ExportedAs(exported, s.Name)
					if ok {
						out = append(out, exported[base]...)
					}
					if ok && base+"_bucket" == s.Name {
						out = append(out, labels.BucketLabel)
					}
				}
				return nil
			})
			return out
		}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			switch n := n.(type) {
			case *parser.VectorSelector:
				base, ok := ExportedAs(exported, n.Name)
				if !ok {
					t.Errorf("panel %q reads %q, which berth does not export", q.Panel, n.Name)
					return nil
				}
				shown[base] = true
				for _, m := range n.LabelMatchers {
					if m.Name != labels.MetricName && !slices.Contains(seriesLabels(n), m.Name) {
						t.Errorf("panel %q matches %s on %s, which its series do not carry (%v)", q.Panel, n.Name, m.Name, exported[base])
					}
				}
			case *parser.AggregateExpr:
				for _, l := range n.Grouping {
					if !slices.Contains(seriesLabels(n.Expr), l) {
						t.Errorf("panel %q groups %s by %s, which its series do not carry", q.Panel, n.Expr, l)
					}
				}
			case *parser.BinaryExpr:
				if n.VectorMatching == nil {
					return nil
				}
				for _, l := range n.VectorMatching.MatchingLabels {
					if !slices.Contains(seriesLabels(n.LHS), l) || !slices.Contains(seriesLabels(n.RHS), l) {
						t.Errorf("panel %q matches both sides of %s on %s, which one side's series do not carry", q.Panel, n, l)
					}
				}
			}
			return nil
		})
	}
	for _, m := range mustShow {
		if !shown[m] {
			t.Errorf("no panel of berth's dashboard shows %s", m)
		}
	}
	t.Logf("%d queries, %d of berth's metrics shown", len(queries), len(shown))
}

// The dashboard works in any Grafana: every panel and target asks the data source the operator
// picks (the variable datasource, of Prometheus' type), none the uid of one Grafana's.
func TestBerthDashboardAsksTheChosenDataSource(t *testing.T) {
	data, _, _ := unstructured.NestedStringMap(berthDashboard(t).Object, "data")
	var d map[string]any
	if err := json.Unmarshal([]byte(data["berth.json"]), &d); err != nil {
		t.Fatal(err)
	}
	chosen := false
	for _, v := range d["templating"].(map[string]any)["list"].([]any) {
		v := v.(map[string]any)
		if v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus" {
			chosen = true
		}
	}
	if !chosen {
		t.Error("the dashboard has no variable datasource of type datasource choosing among Prometheus data sources")
	}
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where = title
			}
			if ds, ok := v["datasource"].(map[string]any); ok && (ds["uid"] != "${datasource}" || ds["type"] != "prometheus") {
				t.Errorf("%q asks data source %v, want {type: prometheus, uid: ${datasource}}", where, ds)
			}
			for _, child := range v {
				walk(where, child)
			}
		case []any:
			for _, child := range v {
				walk(where, child)
			}
		}
	}
	walk("the dashboard", d["panels"])
	walk("the dashboard's variables", d["templating"])
}

// exportedMetrics are the metrics controller-runtime's registry serves, with their label
// names (Registered).
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	all, ok := ctrlmetrics.Registry.(prometheus.Collector)
	if !ok {
		t.Fatalf("controller-runtime's registry (%T) cannot describe its metrics", ctrlmetrics.Registry)
	}
	out, err := Registered(all)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := out["berth_config_valid"]; !ok {
		t.Fatalf("berth_config_valid is not among the %d metrics registered: are berth's controller packages imported?", len(out))
	}
	return out
}
