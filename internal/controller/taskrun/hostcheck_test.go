//go:build stack

package taskrun_test

import (
	"context"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
)

func controllerEvent(reason, text string) (bool, error) {
	var events eventsv1.EventList
	if err := c().List(context.Background(), &events, client.InNamespace(devstack.Namespace)); err != nil {
		return false, err
	}
	for _, e := range events.Items {
		if e.Reason == reason && strings.Contains(e.Note, text) {
			return true, nil
		}
	}
	return false, nil
}

// metricValue reads a counter or gauge of the controller running in this process; -1 while it
// has no series with that label (a counter not yet incremented counts as 0 then: see max).
func metricValue(name, label, value string) float64 {
	families, _ := metrics.Registry.Gather()
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue() // a metric is one or the other
				}
			}
		}
	}
	return -1
}

// A quarantine is kept in berth's records: a restarted controller that has not checked the
// host yet (here it checks nothing until the end) still keeps it out of service, though the host
// answers again by then.
func TestFailedHealthCheckQuarantinesTheHostUntilOnePasses(t *testing.T) {
	o := controllerOptions()
	o.HostCheckInterval = time.Second
	restartController(t, o)
	defer restartController(t, controllerOptions())
	applyConfig(t, 2, nil)
	ns := namespace(t)
	sick := hostsByName()[0]
	if err := sick.Cut(); err != nil {
		t.Fatal(err)
	}
	eventually(t, sick.Name+" is quarantined", func() (bool, error) {
		ok, err := controllerEvent("HostQuarantined", "host "+sick.Name+" takes no new builds until a check passes: host "+sick.Address+" is unreachable")
		return ok && metricValue("berth_host_quarantined", "host", sick.Name) == 1, err
	})
	eventually(t, "the record of "+sick.Name+" shows it quarantined for the failed check, not ready", func() (bool, error) {
		q, current := hostCondition(t, sick.Name, berthv1.HostQuarantined)
		ready, _ := hostCondition(t, sick.Name, berthv1.HostReady)
		return current && q.Status == metav1.ConditionTrue && q.Reason == berthv1.QuarantineCheckFailed && strings.Contains(q.Message, "unreachable") &&
			ready.Status == metav1.ConditionFalse && ready.Reason == "Quarantined", nil
	})
	restartController(t, controllerOptions()) // no checks
	if err := sick.Restore(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted controller knows "+sick.Name+" is quarantined", func() (bool, error) {
		return metricValue("berth_host_quarantined", "host", sick.Name) == 1, nil
	})
	if got := metricValue("berth_host_slots_capacity", "host", sick.Name); got != 0 {
		t.Errorf("a quarantined host reports capacity %v, want 0", got)
	}

	tr := create(t, userTaskRun(ns, "avoids-sick-host", platform, ""))
	defer func() {
		if t.Failed() {
			var events eventsv1.EventList
			c().List(context.Background(), &events, client.InNamespace(ns))
			for _, e := range events.Items {
				t.Logf("event %s %s: %s", e.Type, e.Reason, e.Note)
			}
			var sys eventsv1.EventList
			c().List(context.Background(), &sys, client.InNamespace(devstack.Namespace))
			seen := map[string]bool{}
			for _, e := range sys.Items {
				if !seen[e.Reason+e.Note[:min(len(e.Note), 120)]] {
					seen[e.Reason+e.Note[:min(len(e.Note), 120)]] = true
					t.Logf("system event %s %s: %.300s", e.Type, e.Reason, e.Note)
				}
			}
			got := get(t, tr)
			t.Logf("labels %v annotations %v status %+v", got.Labels, got.Annotations, got.Status.Conditions)
		}
	}()
	secret := secretOf(t, tr)
	if strings.HasSuffix(string(secret.Data["host"]), "@"+sick.Address) || len(secret.Data["id_rsa"]) == 0 {
		t.Fatalf("the quarantined host was used: host=%q error=%q", secret.Data["host"], secret.Data["error"])
	}
	if failed := get(t, tr).Annotations[contract.FailedHostsAnnotation]; failed != "" {
		t.Fatalf("the quarantined host was even tried: failed-hosts=%q", failed)
	}
	finish(t, tr)

	restartController(t, o) // checks again
	eventually(t, sick.Name+" is back in service", func() (bool, error) {
		ok, err := controllerEvent("HostHealthy", "host "+sick.Name+" passed its check")
		return ok && metricValue("berth_host_quarantined", "host", sick.Name) == 0, err
	})
	eventually(t, "the record of "+sick.Name+" shows it ready", func() (bool, error) {
		q, current := hostCondition(t, sick.Name, berthv1.HostQuarantined)
		ready, _ := hostCondition(t, sick.Name, berthv1.HostReady)
		return current && q.Status == metav1.ConditionFalse && ready.Status == metav1.ConditionTrue, nil
	})
	settled(t, ns)
}
