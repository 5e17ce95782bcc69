package konfluxmetrics_test

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
)

// series is what Konflux's operations expect of one multi_platform_controller_* series.
type series struct {
	kind    dto.MetricType
	buckets []float64 // a histogram's upper bounds, +Inf left out
	labels  []string  // the labels of its samples, sorted (le left out)
}

// federated are labels the monitoring stack adds to every series on its way to the dashboard
// (Konflux's federation adds source_cluster), and le the histograms' own.
var federated = []string{"source_cluster", "le"}

// readmeSeries reads the series ../shared/real/README.md lists under "What Konflux's operations
// read": names in backquotes, each run of them followed by a parenthesis that says their type
// (counters, gauges) or their buckets in seconds (histograms).
func readmeSeries(t *testing.T) map[string]*series {
	t.Helper()
	raw, err := realdata.File("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(raw)), " ")
	start := strings.Index(text, "The dashboard and the alerts query")
	end := strings.Index(text, "`MultiPlatformControllerPlatformUnhealthy`")
	if start < 0 || end < start {
		t.Fatal("README.md no longer describes the series the dashboard and alerts query")
	}
	text = text[start:end]
	if i := strings.Index(text, "): "); i >= 0 {
		text = text[i+3:] // past "by `platform` (and `source_cluster`, `le`)"
	}
	token := regexp.MustCompile("`([a-z_]+)`|\\(([^()]*)\\)")
	carry := regexp.MustCompile("the last two also carry `([a-z_]+)`")
	out := map[string]*series{}
	var pending []string
	for _, m := range token.FindAllStringSubmatch(text, -1) {
		if m[1] != "" {
			pending = append(pending, konfluxmetrics.Subsystem+"_"+m[1])
			continue
		}
		group := m[2]
		s := series{labels: []string{konfluxmetrics.PlatformLabel}}
		switch {
		case strings.HasPrefix(group, "counters"):
			s.kind = dto.MetricType_COUNTER
		case strings.HasPrefix(group, "gauges"):
			s.kind = dto.MetricType_GAUGE
		default:
			s.kind = dto.MetricType_HISTOGRAM
			for _, f := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(group, "buckets "), " s"), ", ") {
				b, err := strconv.ParseFloat(f, 64)
				if err != nil {
					t.Fatalf("README.md: bucket %q of %v: %v", f, pending, err)
				}
				s.buckets = append(s.buckets, b)
			}
		}
		for i, name := range pending {
			c := s
			c.labels = slices.Clone(s.labels)
			if extra := carry.FindStringSubmatch(group); extra != nil && i >= len(pending)-2 {
				c.labels = append(c.labels, extra[1])
			}
			sort.Strings(c.labels)
			out[name] = &c
		}
		pending = nil
	}
	if len(out) < 10 {
		t.Fatalf("README.md lists %d series, want the ten of the upstream controller: %v", len(out), out)
	}
	return out
}

// queried reads every PromQL expression of the real dashboard and alert rules, and returns the
// multi_platform_controller_* series they read (a histogram's _bucket, _sum and _count under
// its own name, marked) with the labels they match on or group by.
func queried(t *testing.T) (names map[string][]string, histograms map[string]bool) {
	t.Helper()
	var exprs []string
	raw, err := realdata.File("o11y/prometheus.multi_platform_alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Expr string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	raw, err = realdata.File("o11y/grafana-dashboard-mpc.configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	for file, body := range cm.Data {
		var dashboard any
		if err := json.Unmarshal([]byte(body), &dashboard); err != nil {
			t.Fatalf("dashboard %s: %v", file, err)
		}
		exprs = append(exprs, exprsOf(dashboard)...)
	}
	names, histograms = map[string][]string{}, map[string]bool{}
	for _, e := range exprs {
		expr, err := parser.ParseExpr(e)
		if err != nil {
			t.Fatalf("a real expression does not parse: %v\n%s", err, e)
		}
		var grouping []string
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if a, ok := n.(*parser.AggregateExpr); ok && !a.Without {
				grouping = append(grouping, a.Grouping...)
			}
			return nil
		})
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			s, ok := n.(*parser.VectorSelector)
			if !ok || !strings.HasPrefix(s.Name, konfluxmetrics.Subsystem+"_") {
				return nil
			}
			name := s.Name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, cut := strings.CutSuffix(name, suffix); cut {
					name = base
					histograms[name] = true
				}
			}
			used := slices.Clone(grouping)
			for _, m := range s.LabelMatchers {
				if m.Name != labels.MetricName {
					used = append(used, m.Name)
				}
			}
			names[name] = append(names[name], used...)
			return nil
		})
	}
	if len(names) == 0 {
		t.Fatal("the real dashboard and alerts query no multi_platform_controller_* series")
	}
	return names, histograms
}

// exprsOf finds every "expr" of a Grafana dashboard, at any depth (panels, rows, targets).
func exprsOf(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "expr" && s != "" {
				out = append(out, s)
			}
			out = append(out, exprsOf(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, exprsOf(x)...)
		}
	}
	return out
}

// TestTheSeriesKonfluxReadsAreExported: every series the real dashboard and alert rules query
// is registered in controller-runtime's registry (the one /metrics serves) with the type,
// labels and buckets ../shared/real/README.md gives, the platform written as upstream wrote it,
// and no other multi_platform_controller_* series beside them.
func TestTheSeriesKonfluxReadsAreExported(t *testing.T) {
	want := readmeSeries(t)
	names, histograms := queried(t)
	for name, used := range names {
		w := want[name]
		if w == nil {
			t.Errorf("the real files query %s, which README.md does not list", name)
			continue
		}
		if histograms[name] && w.kind != dto.MetricType_HISTOGRAM {
			t.Errorf("the real files read %s as a histogram; README.md says %s", name, w.kind)
		}
		for _, l := range used {
			if !slices.Contains(w.labels, l) && !slices.Contains(federated, l) {
				t.Errorf("the real files read %s by label %s, which README.md does not give it", name, l)
			}
		}
	}
	for name := range want {
		if _, ok := names[name]; !ok {
			t.Errorf("README.md lists %s, which no real query reads", name)
		}
	}

	// Every series with a sample: a platform in force, a task holding its slot, one waiting.
	konfluxmetrics.ServePlatforms(map[string]int{"linux/s390x": 1})
	c := capacity.New()
	c.SetHosts([]allocation.Host{{Name: "h1", Platform: "linux/s390x", Capacity: 1}})
	c.Acquire(allocation.Request{Task: allocation.Task{Namespace: "team-a", Name: "runs"}, Platform: "linux/s390x", Created: time.Now()})
	c.Acquire(allocation.Request{Task: allocation.Task{Namespace: "team-b", Name: "waits"}, Platform: "linux/s390x", Created: time.Now()})
	c.Publish()
	t.Cleanup(func() { capacity.New().Publish() })

	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), konfluxmetrics.Subsystem+"_") {
			got[f.GetName()] = f
		}
	}
	for name, w := range want {
		f := got[name]
		if f == nil {
			t.Errorf("%s is not exported", name)
			continue
		}
		if f.GetType() != w.kind {
			t.Errorf("%s is a %s, want a %s", name, f.GetType(), w.kind)
		}
		if len(f.GetMetric()) == 0 {
			t.Errorf("%s has no sample", name)
		}
		for _, m := range f.GetMetric() {
			var have []string
			for _, l := range m.GetLabel() {
				have = append(have, l.GetName())
				if l.GetName() == konfluxmetrics.PlatformLabel && l.GetValue() != "linux-s390x" {
					t.Errorf("%s has platform %q, want linux-s390x as upstream writes linux/s390x", name, l.GetValue())
				}
			}
			sort.Strings(have)
			if !slices.Equal(have, w.labels) {
				t.Errorf("%s has labels %v, want %v", name, have, w.labels)
			}
			if w.kind == dto.MetricType_HISTOGRAM {
				var bounds []float64
				for _, b := range m.GetHistogram().GetBucket() {
					bounds = append(bounds, b.GetUpperBound())
				}
				if !slices.Equal(bounds, w.buckets) {
					t.Errorf("%s has buckets %v, want %v", name, bounds, w.buckets)
				}
			}
		}
	}
	for name := range got {
		if want[name] == nil {
			t.Errorf("%s is exported, but is none of the upstream controller's series", name)
		}
	}
}

// poolSizes reads multi_platform_controller_platform_pool_size by platform.
func poolSizes(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != konfluxmetrics.Subsystem+"_platform_pool_size" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == konfluxmetrics.PlatformLabel {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// TestThePoolSizeIsWhatTheConfigRuns: a static platform's pool is its hosts' slots, a
// single-use VM platform's its max-instances, a pool's max-instances times the VMs'
// concurrency; a broken platform's is 0 and a local platform has none. A config that drops a
// platform drops its series.
func TestThePoolSizeIsWhatTheConfigRuns(t *testing.T) {
	data := map[string]string{
		"local-platforms":        "linux/x86_64",
		"dynamic-platforms":      "linux/arm64,linux/riscv64",
		"dynamic-pool-platforms": "linux/ppc64le",

		"host.s390x-1.address": "198.18.1.2", "host.s390x-1.user": "root", "host.s390x-1.platform": "linux/s390x",
		"host.s390x-1.secret": "s390x-admin", "host.s390x-1.concurrency": "4",
		"host.s390x-2.address": "198.18.1.3", "host.s390x-2.user": "root", "host.s390x-2.platform": "linux/s390x",
		"host.s390x-2.secret": "s390x-admin", "host.s390x-2.concurrency": "2",

		"dynamic.linux-arm64.type": "aws", "dynamic.linux-arm64.max-instances": "10", "dynamic.linux-arm64.ssh-secret": "aws-ssh",
		"dynamic.linux-arm64.region": "us-east-1", "dynamic.linux-arm64.ami": "ami-0123", "dynamic.linux-arm64.instance-type": "m6g.large",
		"dynamic.linux-arm64.key-name": "builders", "dynamic.linux-arm64.aws-secret": "aws-account",

		"dynamic.linux-ppc64le.type": "ibmp", "dynamic.linux-ppc64le.max-instances": "3", "dynamic.linux-ppc64le.ssh-secret": "ibm-ssh",
		"dynamic.linux-ppc64le.concurrency": "4", "dynamic.linux-ppc64le.key": "builders", "dynamic.linux-ppc64le.image": "rhel-9",
		"dynamic.linux-ppc64le.secret": "ibm-api", "dynamic.linux-ppc64le.url": "https://us-south.power-iaas.cloud.ibm.com",
		"dynamic.linux-ppc64le.crn": "crn:v1:bluemix:public:power-iaas:dal10:a/1::", "dynamic.linux-ppc64le.network": "net-1",
		"dynamic.linux-ppc64le.cores": "0.25", "dynamic.linux-ppc64le.max-age": "120",
		// linux/riscv64 is listed with no settings: unusable.
	}
	cfg, problems := config.Parse(data)
	if fatal := cfg.Fatal(); len(fatal) > 0 {
		t.Fatalf("test config: %v", problems)
	}
	konfluxmetrics.ServePlatforms(konfluxmetrics.PoolSizes(cfg.Report()))
	want := map[string]float64{"linux-s390x": 6, "linux-arm64": 10, "linux-ppc64le": 12, "linux-riscv64": 0}
	if got := poolSizes(t); !maps.Equal(got, want) {
		t.Errorf("pool sizes %v, want %v (problems: %v)", got, want, problems)
	}

	konfluxmetrics.ServePlatforms(map[string]int{"linux/s390x": 6})
	if got := poolSizes(t); !maps.Equal(got, map[string]float64{"linux-s390x": 6}) {
		t.Errorf("after the config dropped platforms, pool sizes %v, want only linux-s390x", got)
	}
}
