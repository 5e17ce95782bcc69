package taskrun

// Konflux's series (multi_platform_controller_*, package konfluxmetrics) as the task lifecycle
// moves them, read from the registry /metrics serves.

import (
	"errors"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/provision/provisionfake"
	"github.com/berth-ci/berth/internal/remote"
)

// konflux is the value of a multi_platform_controller_* series of s390x (a histogram's count
// of observations), in namespace tenant for the task gauges; present is false when there is no
// such series.
func konflux(t *testing.T, name string) (value float64, present bool) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "multi_platform_controller_"+name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, "platform", "linux-s390x") || (f.GetType() == dto.MetricType_GAUGE && name != "platform_pool_size" && !hasLabels(m, "taskrun_namespace", tenantNS)) {
				continue
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), true
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), true
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// konfluxCounts reads the counters and histograms of s390x, for deltas: they are the
// process's, shared by every test of the package.
func konfluxCounts(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, name := range []string{"provisioning_successes", "provisioning_failures", "host_allocation_failures",
		"cleanup_failures", "host_allocation_time", "wait_time", "task_run_time"} {
		out[name], _ = konflux(t, name)
	}
	return out
}

// grew checks how much each series grew since before; a series not named must not have moved.
func grew(t *testing.T, before map[string]float64, want map[string]float64) {
	t.Helper()
	for name, now := range konfluxCounts(t) {
		if got := now - before[name]; got != want[name] {
			t.Errorf("multi_platform_controller_%s grew by %v, want %v", name, got, want[name])
		}
	}
}

// gauges checks the task gauges of s390x in namespace tenant; 0 means no series at all.
func gauges(t *testing.T, running, waiting float64) {
	t.Helper()
	for name, want := range map[string]float64{"running_tasks": running, "waiting_tasks": waiting} {
		got, present := konflux(t, name)
		switch {
		case want == 0 && present:
			t.Errorf("multi_platform_controller_%s is %v, want no series: the namespace has no such task", name, got)
		case want != 0 && got != want:
			t.Errorf("multi_platform_controller_%s is %v (present %v), want %v", name, got, present, want)
		}
	}
}

// TestKonfluxSeriesFollowTheTaskLifecycle: a provisioning that fails on one host and succeeds on
// the next counts one failure and one success; every reservation is a wait observed, every
// hand-over an allocation time, every completed task a run time, every failed clean a cleanup
// failure. The task gauges count the tasks holding and waiting for slots (a slot held for a
// clean still owed is no task's) and have no series once the namespace has none.
func TestKonfluxSeriesFollowTheTaskLifecycle(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, hostsConfig(1, "h1", "h2"), func(r *Reconciler) { r.now = clock.now })
	h.r.Capacity.Publish()
	t.Cleanup(func() { capacity.New().Publish() })
	failedOnce, cleanFails := false, false
	h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		switch {
		case kind == provisionfake.Provision && j.Login.Host == "h1" && !failedOnce:
			failedOnce = true
			return provision.Outcome{Err: &remote.RemoteError{Host: "h1", Command: "creating user " + j.User, ExitCode: 1, Stderr: "useradd: cannot lock /etc/passwd"}}, true
		case kind == provisionfake.Clean && cleanFails:
			return provision.Outcome{Err: &remote.RemoteError{Host: j.Login.Host, Command: "removing user " + j.User, ExitCode: 1, Stderr: "userdel: user is currently used by process 4242"}}, true
		}
		return provision.Outcome{}, true
	}
	gauges(t, 0, 0)

	before := konfluxCounts(t)
	h.create(userTaskRun("first", s390x))
	h.settle()
	// Reserved twice (h1, then h2 after h1 failed), handed over once.
	grew(t, before, map[string]float64{"provisioning_failures": 1, "provisioning_successes": 1, "wait_time": 2, "host_allocation_time": 1})
	gauges(t, 1, 0)

	before = konfluxCounts(t)
	h.create(userTaskRun("second", s390x))
	h.create(userTaskRun("third", s390x))
	h.settle()
	h.waiting("third")
	grew(t, before, map[string]float64{"provisioning_successes": 1, "wait_time": 1, "host_allocation_time": 1})
	gauges(t, 2, 1)

	before = konfluxCounts(t)
	cleanFails = true
	h.finish("first")
	h.settle()
	h.waiting("third") // first's slot is held until its build user is gone
	grew(t, before, map[string]float64{"task_run_time": 1, "cleanup_failures": 1})
	gauges(t, 1, 1)

	before = konfluxCounts(t)
	cleanFails = false
	clock.advance(maxCleanBackoff)
	h.enqueue("first") // the clean's backoff
	h.settle()
	grew(t, before, map[string]float64{"provisioning_successes": 1, "wait_time": 1, "host_allocation_time": 1})
	gauges(t, 2, 0)

	before = konfluxCounts(t)
	h.finish("second")
	h.finish("third")
	h.settle()
	grew(t, before, map[string]float64{"task_run_time": 2})
	gauges(t, 0, 0)
}

// TestAllHostsFailingIsAHostAllocationFailure: a task answered with an error because no host of
// its platform could be provisioned counts each host's failure and one failed allocation, once,
// however often it is reconciled afterwards.
func TestAllHostsFailingIsAHostAllocationFailure(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1", "h2"), nil)
	h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		return provision.Outcome{Err: &remote.UnreachableError{Host: j.Login.Host, Err: errors.New("connection refused")}}, true
	}
	before := konfluxCounts(t)
	h.create(userTaskRun("stranded", s390x))
	h.settle()
	h.enqueue("stranded")
	h.settle()
	grew(t, before, map[string]float64{"provisioning_failures": 2, "host_allocation_failures": 1, "wait_time": 2})
}
