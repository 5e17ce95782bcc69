// Package memory_test floods a tenant namespace with the largest objects the apiserver takes
// and measures what berth's controller, the real binary in a child process, keeps of them. It
// has a control plane of its own: a gigabyte of tenant objects would slow every test sharing
// one, and the package ends by throwing it away rather than deleting them.
package memory_test

import (
	"os"
	"runtime/debug"
	"testing"
	"time"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var stack *devstack.Stack

const (
	platform = "linux/s390x"
	// One slot each: two for the flood's namespace (its cap), one to serve another tenant.
	hostCount = 3
)

// TestMain runs the stack without kube-controller-manager: its informers would hold every
// 1 MiB Secret of the flood too, and nothing here needs a garbage collector (tenants are bound
// to Roles of their own, and nothing is deleted). The apiserver compacts etcd every minute, so
// etcd keeps a minute of the flood's revisions, not five. The control plane's processes and
// this one (which runs the Tekton stand-in, caching every TaskRun whole) collect garbage at
// half their live heap instead of all of it: the apiserver holds about 5 GiB live at the
// flood's height. The controller under test runs with Go's default (startChild).
func TestMain(m *testing.M) {
	os.Setenv("GOGC", "50")
	debug.SetGCPercent(50)
	os.Exit(stacktest.MainWith(m, &stack, hostCount, stacktest.Options(), func(o *devstack.Options) {
		o.WithoutGarbageCollector = true
		o.ControlPlane = append(o.ControlPlane, controlplane.WithCompaction(time.Minute))
	}))
}

func admin() client.Client { return stack.ControlPlane.Client }

func applyConfig(t *testing.T, concurrency int, extra map[string]string) {
	t.Helper()
	data := stack.StaticHostConfig(platform, concurrency)
	for k, v := range extra {
		data[k] = v
	}
	stacktest.ApplyConfig(t, stack, data, "ConfigApplied", "ConfigRejected")
}

func ready(t *testing.T, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	return stacktest.Ready(t, admin(), tr)
}

func finish(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	if err := stack.StandIn.Finish(t.Context(), client.ObjectKeyFromObject(tr), nil); err != nil {
		t.Fatal(err)
	}
}

func settled(t *testing.T, ns string) {
	t.Helper()
	stacktest.Settled(t, admin(), ns)
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	stacktest.Eventually(t, what, cond)
}
