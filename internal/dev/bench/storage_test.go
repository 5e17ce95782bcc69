package bench

import (
	"context"
	"maps"
	"strconv"
	"testing"
)

// kube-apiserver's counts of its etcd requests, read from its metrics' text form: by operation
// and resource (group-qualified where there is a group), and only what grew between two reads.
func TestStorageCounters(t *testing.T) {
	page := func(taskRunUpdates, secretCreates int) string {
		return `# HELP etcd_request_duration_seconds [ALPHA] Etcd request latency in seconds for each operation and object type.
# TYPE etcd_request_duration_seconds histogram
etcd_request_duration_seconds_bucket{group="tekton.dev",operation="update",resource="taskruns",le="0.005"} 3
etcd_request_duration_seconds_bucket{group="tekton.dev",operation="update",resource="taskruns",le="+Inf"} ` + strconv.Itoa(taskRunUpdates) + `
etcd_request_duration_seconds_sum{group="tekton.dev",operation="update",resource="taskruns"} 0.5
etcd_request_duration_seconds_count{group="tekton.dev",operation="update",resource="taskruns"} ` + strconv.Itoa(taskRunUpdates) + `
etcd_request_duration_seconds_bucket{group="",operation="create",resource="secrets",le="+Inf"} ` + strconv.Itoa(secretCreates) + `
etcd_request_duration_seconds_sum{group="",operation="create",resource="secrets"} 0.1
etcd_request_duration_seconds_count{group="",operation="create",resource="secrets"} ` + strconv.Itoa(secretCreates) + `
etcd_request_duration_seconds_bucket{group="",operation="get",resource="leases",le="+Inf"} 7
etcd_request_duration_seconds_sum{group="",operation="get",resource="leases"} 0.01
etcd_request_duration_seconds_count{group="",operation="get",resource="leases"} 7
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",verb="PATCH",resource="taskruns"} 99
`
	}
	read := func(body string) map[string]float64 {
		t.Helper()
		got, err := storageCounters(context.Background(), func(_ context.Context, path string) ([]byte, error) {
			if path != "/metrics" {
				t.Errorf("read %s, want /metrics", path)
			}
			return []byte(body), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	before := read(page(10, 4))
	if want := map[string]float64{"update taskruns.tekton.dev": 10, "create secrets": 4, "get leases": 7}; !maps.Equal(before, want) {
		t.Errorf("counters %v, want %v", before, want)
	}
	used := grown(before, read(page(25, 4)))
	if want := map[string]float64{"update taskruns.tekton.dev": 15}; !maps.Equal(used, want) {
		t.Errorf("used %v, want %v", used, want)
	}
	if _, err := storageCounters(context.Background(), func(context.Context, string) ([]byte, error) {
		return []byte("etcd_request_duration_seconds_count{operation=\"update\" 3\n"), nil
	}); err == nil {
		t.Error("a page that is not the text format: no error")
	}
}
