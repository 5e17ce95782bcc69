//go:build stack

package taskrun_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// controllerProcess runs the built controller as its own process under the shipped RBAC, so a
// test can kill it with SIGKILL: no deferred function, no graceful stop, jobs cut mid-flight.
func controllerProcess(t *testing.T, bin string) *exec.Cmd {
	t.Helper()
	kubeconfig, err := stack.ControllerKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	webhook := stack.Webhook // where the stack's apiserver calls the webhook, with the certificate it trusts
	cmd := exec.Command(bin, "controller", "--kubeconfig", kubeconfig, "--namespace", devstack.Namespace,
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--host-check-interval=0", "--wait-timeout=0",
		"--webhook-host", webhook.Host, "--webhook-port", strconv.Itoa(webhook.Port), "--webhook-cert-dir", webhook.CertDir)
	log, err := os.OpenFile(filepath.Join(t.TempDir(), "controller.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func buildBerth(t *testing.T) string {
	t.Helper()
	return stacktest.BuildBerth(t)
}

// recordsIn counts the records of namespace ns by phase.
func recordsIn(ns string) (map[berthv1.Phase]int, error) {
	var list berthv1.AllocationList
	if err := c().List(context.Background(), &list, client.InNamespace(devstack.Namespace)); err != nil {
		return nil, err
	}
	phases := map[berthv1.Phase]int{}
	for _, rec := range list.Items {
		if rec.Spec.TaskRun.Namespace != ns {
			continue
		}
		phases[rec.Status.Phase]++
		if handedOver, err := stacktest.HandedOver(context.Background(), c(), &rec); err != nil {
			return nil, err
		} else if handedOver {
			phases[handedOverPhase]++
		}
		var tr pipelinev1.TaskRun
		err := c().Get(context.Background(), client.ObjectKey{Namespace: ns, Name: rec.Spec.TaskRun.Name}, &tr)
		if client.IgnoreNotFound(err) != nil {
			return nil, err
		}
		if err != nil || tr.UID != rec.Spec.TaskRun.UID || tr.IsDone() {
			phases[owed]++
		}
	}
	return phases, nil
}

// handedOverPhase counts, in recordsIn, the records whose build user was handed over to the task.
const handedOverPhase berthv1.Phase = "(build user handed over)"

// owed counts, in recordsIn, the records of tasks that ended: each owes its build user's clean,
// whether the record says Cleaning or still names the user it held.
const owed berthv1.Phase = "(task ended, clean owed)"

// TestKilledAtEachPhaseRepairsOnRestart kills the controller process with SIGKILL the moment
// a record reaches each phase (a task provisioning, a task ready, a clean owed), starts it
// again each time, and lets a burst run through: no host ever holds more tasks than its
// concurrency, every task is served, and in the end every build user is gone and every slot
// free.
func TestKilledAtEachPhaseRepairsOnRestart(t *testing.T) {
	bin := buildBerth(t)
	applyConfig(t, 1, nil)
	ns := namespace(t)
	chk := watchAssignments(t, ns, 1)
	if err := stack.StopController(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := startController(controllerOptions()); err != nil {
			t.Errorf("restarting the in-process controller: %v", err)
		}
	}()

	const tasks = 8
	proc := controllerProcess(t, bin)
	createBurst(t, ns, 0, tasks)
	for _, phase := range []berthv1.Phase{berthv1.PhaseProvisioning, handedOverPhase, owed, berthv1.PhaseProvisioning} {
		if phase == owed {
			finishAtRandom(t, ns)
		}
		eventually(t, "a record is "+string(phase), func() (bool, error) {
			phases, err := recordsIn(ns)
			return phases[phase] > 0, err
		})
		kill9(t, proc)
		proc = controllerProcess(t, bin)
	}
	allDone(t, ns, tasks)
	settled(t, ns)
	kill9(t, proc)
	chk.verify(t, tasks)
	noBuildUsersLeft(t)
}
