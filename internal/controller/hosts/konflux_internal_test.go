package hosts

// Konflux's series (multi_platform_controller_*, package konfluxmetrics) as the VM lifecycle
// moves them, read from the registry /metrics serves.

import (
	"errors"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/berth-ci/berth/internal/cloud"
)

// konfluxCounter is a multi_platform_controller_* counter of vmPlatform (0 when absent).
func konfluxCounter(t *testing.T, name string) float64 {
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
			for _, l := range m.GetLabel() {
				if l.GetName() == "platform" && l.GetValue() == "linux-arm64" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestAVMThatNeverComesUpIsAProvisioningFailure: a VM berth cannot log in to within the
// allocation timeout is one provisioning failure of its platform, counted when it is given up
// and not again as its termination is seen through; a VM that comes up is none (its task's
// build user is the success).
func TestAVMThatNeverComesUpIsAProvisioningFailure(t *testing.T) {
	w := newVMWorld(t, false)
	w.prober.fail = errors.New("ssh: handshake failed: connection refused")
	o := w.owner(w.api)
	name := w.plan(o).Name
	before := konfluxCounter(t, "provisioning_failures")

	w.mustReconcile(o, name)
	if got := konfluxCounter(t, "provisioning_failures") - before; got != 0 {
		t.Fatalf("a VM still booting counted %v provisioning failures", got)
	}
	w.clock.advance(allocationTimeout + time.Second)
	w.mustReconcile(o, name)
	w.terminated(o, name, "could not log in within the allocation timeout")
	w.mustReconcile(o, name)
	if got := konfluxCounter(t, "provisioning_failures") - before; got != 1 {
		t.Errorf("provisioning_failures grew by %v, want 1", got)
	}

	w.prober.fail = nil
	before = konfluxCounter(t, "provisioning_failures")
	w.readyVM(o)
	if got := konfluxCounter(t, "provisioning_failures") - before; got != 0 {
		t.Errorf("a VM that came up counted %v provisioning failures", got)
	}
}

// TestAFailedLaunchIsAHostAllocationFailure: each launch call the cloud refuses is a failed host
// allocation of the platform, as berth_vm_launches_total counts it by its kind.
func TestAFailedLaunchIsAHostAllocationFailure(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	name := w.plan(o).Name
	before := konfluxCounter(t, "host_allocation_failures")
	w.cloud.FailNext("launch", &cloud.Error{Kind: cloud.Auth, Op: "launch", Err: errors.New("UnauthorizedOperation")})
	w.mustReconcile(o, name)
	if got := konfluxCounter(t, "host_allocation_failures") - before; got != 1 {
		t.Errorf("host_allocation_failures grew by %v, want 1", got)
	}
}
