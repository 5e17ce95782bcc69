//go:build linux

// Package tekton proves berth against the real Tekton Pipelines controller and webhook: Tasks
// referenced by name, PipelineRuns with a matrix over PLATFORM, retries, cancellation, timeouts
// and deletion, as Tekton itself carries them out (realtekton: kube-scheduler places its pods,
// kwok plays their kubelet, a gate keeps a pod Pending until its secret exists). berth runs as
// in production, working hosts over SSH itself, on the test ground's sshd hosts and the local
// VM cloud behind the EC2 stand-in. Each test ends with nothing of its tasks left anywhere, and
// no write of berth's refused (read from the apiserver's audit log).
package tekton

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/realtekton"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

var (
	stack *devstack.Stack
	// options are the controller's, as TestMain started it.
	options controller.Options
	// auditLog is the apiserver's record of every write, whoever made it.
	auditLog string
)

// The platforms of the suite's config: one of each way berth serves a task.
const (
	staticPlatform = "linux/s390x"   // the test ground's sshd hosts
	vmPlatform     = "linux/ppc64le" // a VM a task, through the EC2 stand-in
	localPlatform  = "linux/arm64"   // a node of the cluster: kwok's arm64 node
	localNode      = "kwok-arm64"
	// hostSlots is the static hosts' concurrency.
	hostSlots = 1
)

func TestMain(m *testing.M) {
	if code, done := realtekton.IsolateNetwork(); done {
		os.Exit(code)
	}
	dir, err := os.MkdirTemp("", "berth-tekton-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	auditLog = filepath.Join(dir, "audit.log")
	options = stacktest.Options()
	options.VMPlanInterval, options.SweepInterval, options.LeakGrace = 200*time.Millisecond, 300*time.Millisecond, 2*time.Second
	code := stacktest.MainWith(m, &stack, 2, options, func(d *devstack.Options) {
		d.RealTekton, d.VMCloud = true, true
		// Every user's writes: the controller's are told apart by whom it impersonates.
		d.ControlPlane = append(d.ControlPlane, controlplane.WithAuditLog(auditLog))
	})
	os.RemoveAll(dir)
	os.Exit(code)
}

func c() client.Client { return stack.ControlPlane.Client }
