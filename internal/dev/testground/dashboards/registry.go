package dashboards

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Registered are the metrics a collector (a registry) describes, with their label names: a
// vector with no series yet (no VM ever lost) counts too. A Desc keeps its name and labels to
// itself, so a sample series of each, gathered by a registry of its own, tells them.
func Registered(c prometheus.Collector) (map[string][]string, error) {
	descs := make(chan *prometheus.Desc)
	go func() {
		c.Describe(descs)
		close(descs)
	}()
	var samples sampleCollector
	var failed error
	for d := range descs {
		if d.Err() != nil || failed != nil {
			continue // drained, so that Describe ends
		}
		var m prometheus.Metric
		var err error
		// A Desc does not tell how many variable labels it has: try up to 16, far more than
		// any metric of berth's has (at most three).
		for n := 0; n <= 16; n++ {
			if m, err = prometheus.NewConstMetric(d, prometheus.UntypedValue, 0, slices.Repeat([]string{"x"}, n)...); err == nil {
				break
			}
		}
		if err != nil {
			failed = fmt.Errorf("no sample of %s: %w", d, err)
			continue
		}
		samples = append(samples, m)
	}
	if failed != nil {
		return nil, failed
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(samples); err != nil {
		return nil, err
	}
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, f := range families {
		var names []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			names = append(names, l.GetName())
		}
		out[f.GetName()] = names
	}
	return out, nil
}

type sampleCollector []prometheus.Metric

func (s sampleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range s {
		ch <- m.Desc()
	}
}

func (s sampleCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range s {
		ch <- m
	}
}

// ExportedAs maps a series name a query selects to the metric of registered that exports it:
// itself, or the histogram or summary whose _bucket, _sum or _count it is.
func ExportedAs(registered map[string][]string, name string) (string, bool) {
	if _, ok := registered[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if _, ok := registered[base]; ok {
				return base, true
			}
		}
	}
	return "", false
}
