package dashboards

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"

	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// A dashboard as Grafana exports one: a collapsed row holding its panels, a Loki target beside
// Prometheus' ones, variables in each of Grafana's spellings, and query variables with and
// without a series selector.
const sample = `apiVersion: v1
kind: ConfigMap
metadata:
  name: sample
data:
  a.json: |
    {"title": "A",
     "templating": {"list": [
       {"name": "ds", "type": "datasource", "query": "prometheus"},
       {"name": "platform", "type": "query", "query": {"query": "label_values(berth_platform_usable{job=\"x\"}, platform)"}},
       {"name": "cluster", "type": "query", "query": "label_values(source_cluster)"}]},
     "panels": [
       {"type": "stat", "title": "top", "targets": [{"expr": "sum(berth_vms{platform=~\"$platform\"})"}]},
       {"type": "row", "title": "row", "collapsed": true, "panels": [
         {"type": "timeseries", "title": "nested", "datasource": {"type": "prometheus", "uid": "${ds}"},
          "targets": [
            {"expr": "rate(berth_vm_lost_total{platform=~\"${platform:regex}\"}[$__rate_interval])"},
            {"expr": "{app=\"berth\"}", "datasource": {"type": "loki", "uid": "logs"}},
            {"expr": "label_replace(berth_vms{platform=~\"[[platform]]\"}, \"p\", \"$1\", \"platform\", \"(.*)\")"}]}]},
       {"type": "text", "title": "prose"}]}
`

func TestQueriesReadsEveryPanelAndSeriesVariable(t *testing.T) {
	got, err := Queries([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	want := []Query{
		{Panel: "variable $platform", Expr: `berth_platform_usable{job="x"}`},
		{Panel: "top", Expr: `sum(berth_vms{platform=~".+"})`},
		{Panel: "nested", Expr: `rate(berth_vm_lost_total{platform=~".+"}[5m])`},
		{Panel: "nested", Expr: `label_replace(berth_vms{platform=~".+"}, "p", "$1", "platform", "(.*)")`},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Queries =\n%q\nwant\n%q", got, want)
	}
	for _, q := range got {
		if _, err := parser.ParseExpr(q.Expr); err != nil {
			t.Errorf("%s: %v", q.Expr, err)
		}
	}
}

// A variable the dashboard does not define reaches Prometheus as it is written, and the panel
// stays empty: Queries refuses it rather than guess.
func TestQueriesRefusesAnUndefinedVariable(t *testing.T) {
	misspelt := strings.Replace(sample, `${platform:regex}`, `$platfrom`, 1)
	_, err := Queries([]byte(misspelt))
	if err == nil || !strings.Contains(err.Error(), "$platfrom") || !strings.Contains(err.Error(), `"nested"`) {
		t.Errorf("Queries of a dashboard using $platfrom: %v, want an error naming it and its panel", err)
	}
	if _, err := Queries([]byte("kind: Secret\ndata: {a: b}\n")); err == nil {
		t.Error("a Secret was read as a dashboard ConfigMap")
	}
}

// Konflux's dashboard (../shared/real/o11y), as its monitoring runs it: every query Queries reads
// parses, and all but its three pod-phase panels (kube-state-metrics' series) read the
// multi_platform_controller_* series berth exports beside its own (internal/konfluxmetrics).
func TestKonfluxDashboardQueriesParse(t *testing.T) {
	raw, err := realdata.File("o11y/grafana-dashboard-mpc.configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	queries, err := Queries(raw)
	if err != nil {
		t.Fatal(err)
	}
	// Counted in the file: 26 panel targets; its two variables are label_values(<label>), which
	// select no series.
	if len(queries) != 26 {
		t.Errorf("Queries read %d queries of Konflux's dashboard, want its 26 panel targets", len(queries))
	}
	var elsewhere []string
	for _, q := range queries {
		expr, err := parser.ParseExpr(q.Expr)
		if err != nil {
			t.Errorf("panel %q: %v\n%s", q.Panel, err, q.Expr)
			continue
		}
		konflux := false
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if s, ok := n.(*parser.VectorSelector); ok && strings.HasPrefix(s.Name, "multi_platform_controller_") {
				konflux = true
			}
			return nil
		})
		if !konflux {
			elsewhere = append(elsewhere, q.Panel)
		}
	}
	slices.Sort(elsewhere)
	if want := []string{"Non-Running Controller Pods Per Cluster", "Non-Running OTP Pods Per Cluster", "Task status phase"}; !slices.Equal(elsewhere, want) {
		t.Errorf("panels reading no multi_platform_controller_* series: %q, want the pod-phase panels %q", elsewhere, want)
	}
}
