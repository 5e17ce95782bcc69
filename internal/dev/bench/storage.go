package bench

import (
	"bytes"
	"context"
	"fmt"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// storageCounters reads kube-apiserver's count of requests to etcd by operation and resource
// (etcd_request_duration_seconds_count, e.g. "update taskruns.tekton.dev"). Each try of an
// update is one: a write the apiserver had to retry on a conflict (the object changed
// between its read and its write) counts twice, where its audit log shows one request.
func storageCounters(ctx context.Context, get getter) (map[string]float64, error) {
	body, err := get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver's metrics: %w", err)
	}
	counts := map[string]float64{}
	f, ok := families["etcd_request_duration_seconds"]
	if !ok {
		return counts, nil
	}
	for _, m := range f.GetMetric() {
		var op, group, resource string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "operation":
				op = l.GetValue()
			case "group":
				group = l.GetValue()
			case "resource":
				resource = l.GetValue()
			}
		}
		if group != "" {
			resource += "." + group
		}
		if h := m.GetHistogram(); h != nil {
			counts[op+" "+resource] += float64(h.GetSampleCount())
		}
	}
	return counts, nil
}

// grown is what each count grew by from before to after (CPU seconds, requests), leaving out
// those that did not grow.
func grown(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}
