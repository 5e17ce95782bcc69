//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// secondNamespace makes another tenant namespace for a test.
func secondNamespace(t *testing.T, suffix string) string {
	t.Helper()
	ns := namespace(t) + "-" + suffix
	if err := stack.ControlPlane.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stacktest.FinishAllOnFailure(t, stack, ns) })
	return ns
}

// holding counts the tasks of ns that hold a slot (provisioning or ready).
func holding(t *testing.T, ns string) int {
	t.Helper()
	var list berthv1.AllocationList
	if err := c().List(context.Background(), &list, client.InNamespace(devstack.Namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, rec := range list.Items {
		if rec.Spec.TaskRun.Namespace == ns && (rec.Status.Phase == berthv1.PhaseProvisioning || rec.Status.Phase == berthv1.PhaseReady) {
			n++
		}
	}
	return n
}

// TestAFloodingNamespaceDoesNotStarveAnother: one namespace queues many tasks on a full
// platform, another then asks for one; the next slot that frees goes to the other.
func TestAFloodingNamespaceDoesNotStarveAnother(t *testing.T) {
	applyConfig(t, 1, nil)
	flood := namespace(t)
	quiet := secondNamespace(t, "quiet")
	var floods []*pipelinev1.TaskRun
	for i := range 12 {
		floods = append(floods, create(t, userTaskRun(flood, fmt.Sprintf("f-%02d", i), platform, "")))
	}
	served, _ := servedAndWaiting(t, floods, stackHosts)
	lone := create(t, userTaskRun(quiet, "lone", platform, ""))
	waiting(t, lone)
	finish(t, served[0])
	ready(t, lone)
	if n := holding(t, flood); n != stackHosts-1 {
		t.Fatalf("the flooding namespace holds %d slots after the quiet one was served, want %d", n, stackHosts-1)
	}
	finish(t, lone)
	finishAtRandom(t, flood)
	allDone(t, flood, len(floods))
	settled(t, flood)
	settled(t, quiet)
	noBuildUsersLeft(t)
}

// TestNamespaceCapLeavesSlotsForOthers: with max-tasks-per-namespace, a namespace never holds
// more, even with slots free, and another namespace is served from those slots.
func TestNamespaceCapLeavesSlotsForOthers(t *testing.T) {
	applyConfig(t, 2, map[string]string{"max-tasks-per-namespace": "2"})
	defer applyConfig(t, 2, nil)
	greedy := namespace(t)
	other := secondNamespace(t, "other")
	var greedies []*pipelinev1.TaskRun
	for i := range 5 {
		greedies = append(greedies, create(t, userTaskRun(greedy, fmt.Sprintf("g-%d", i), platform, "")))
	}
	served, waiting := servedAndWaiting(t, greedies, 2)
	o := create(t, userTaskRun(other, "o", platform, ""))
	ready(t, o)
	if n := holding(t, greedy); n != 2 {
		t.Fatalf("the capped namespace holds %d slots, want 2", n)
	}
	finish(t, served[0])
	// The waiters were created in order, so the first of them is served next.
	ready(t, waiting[0])
	if n := holding(t, greedy); n != 2 {
		t.Fatalf("after one task ended the capped namespace holds %d slots, want 2", n)
	}
	finish(t, o)
	finishAtRandom(t, greedy)
	allDone(t, greedy, len(greedies))
	settled(t, greedy)
	settled(t, other)
	noBuildUsersLeft(t)
}

// TestAWaiterRefusedLaterLeavesTheLine: a task waits in line; the config then stops allowing
// its namespace. Its next reconcile answers it with an error secret and takes it out of line,
// so the next freed slot goes to the task behind it instead of being kept for one that will
// never take it.
func TestAWaiterRefusedLaterLeavesTheLine(t *testing.T) {
	applyConfig(t, 1, nil)
	defer applyConfig(t, 1, nil)
	ns := namespace(t)
	gone := secondNamespace(t, "gone")
	var holders []*pipelinev1.TaskRun
	for i := range stackHosts {
		holders = append(holders, create(t, userTaskRun(ns, fmt.Sprintf("h-%02d", i), platform, "")))
	}
	served, _ := servedAndWaiting(t, holders, stackHosts)
	first := create(t, userTaskRun(gone, "first", platform, ""))
	waiting(t, first)
	behind := create(t, userTaskRun(ns, "behind", platform, ""))
	waiting(t, behind)

	applyConfig(t, 1, map[string]string{"allowed-namespaces": regexp.QuoteMeta(ns)})
	// A tenant's edit is enough to have the waiter reconciled under the new config.
	cur := get(t, first)
	cur.Annotations = map[string]string{"touched": "yes"}
	if err := c().Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the refused waiter is answered with an error", func() (bool, error) {
		msg := string(secretOf(t, first).Data["error"])
		return strings.Contains(msg, "allowed-namespaces"), fmt.Errorf("error %q", msg)
	})
	finish(t, served[0])
	ready(t, behind)
	for _, tr := range append(served[1:], behind, first) {
		finish(t, tr)
	}
	settled(t, ns)
	settled(t, gone)
	noBuildUsersLeft(t)
}
