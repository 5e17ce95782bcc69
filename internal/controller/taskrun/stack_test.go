//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// The package's tests share one stack: a real control plane with berth's RBAC and Tasks, three
// real sshd hosts, the Tekton stand-in executing the provision/clean/update TaskRuns with
// berth's own `berth host` code, and berth's controller running as its ServiceAccount.
var stack *devstack.Stack

const (
	platform     = "linux/s390x"
	runScriptKey = stacktest.RunScriptKey
	stackHosts   = 3
)

func TestMain(m *testing.M) { os.Exit(stacktest.Main(m, &stack, stackHosts, controllerOptions())) }

func controllerOptions() controller.Options { return stacktest.Options() }

func startController(o controller.Options) error { return stack.StartController(o) }

// restartController replaces the running controller, as a crash and restart would.
func restartController(t *testing.T, o controller.Options) {
	t.Helper()
	stacktest.RestartController(t, stack, o)
}

func c() client.Client { return stack.ControlPlane.Client }

func applyConfig(t *testing.T, concurrency int, extra map[string]string) {
	t.Helper()
	data := stack.StaticHostConfig(platform, concurrency, "linux/amd64")
	for k, v := range extra {
		data[k] = v
	}
	stacktest.ApplyConfig(t, stack, data)
}

func namespace(t *testing.T) string { return stacktest.Namespace(t, stack) }

// userTaskRun is a TaskRun as buildah-remote makes them: PLATFORM and the secret volume.
func userTaskRun(ns, name, platformParam, script string) *pipelinev1.TaskRun {
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{}},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platformParam)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Results: []pipelinev1.TaskResult{{Name: "out"}},
				Steps: []pipelinev1.Step{{Name: "build", Image: "buildah", Script: script,
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name, Optional: ptr(false)}}}},
			},
		},
	}
	if script != "" {
		tr.Labels[runScriptKey] = "true"
	}
	return tr
}

func ptr[T any](v T) *T { return &v }

func create(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	if err := c().Create(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

// servedAndWaiting waits until n of trs hold a host and the rest wait in the queue, and
// returns both in trs's order. Which tasks are served first is not the order they were created
// in: berth meets a TaskRun only once Tekton has resolved its spec, and Tekton resolves them
// in no set order, so a later one can take a free slot first. Among waiters, the order holds.
func servedAndWaiting(t *testing.T, trs []*pipelinev1.TaskRun, n int) (served, waiting []*pipelinev1.TaskRun) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d of %d tasks hold a host and the rest wait", n, len(trs)), func() (bool, error) {
		served, waiting = nil, nil
		for _, tr := range trs {
			handedOver, isWaiting, err := stacktest.StateOf(context.Background(), c(), tr)
			switch {
			case err != nil:
				return false, err
			case handedOver:
				served = append(served, tr)
			case isWaiting:
				waiting = append(waiting, tr)
			}
		}
		return len(served) == n && len(waiting) == len(trs)-n, fmt.Errorf("%d ready, %d waiting", len(served), len(waiting))
	})
	return served, waiting
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	stacktest.Eventually(t, what, cond)
}

func secretOf(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Secret {
	t.Helper()
	return stacktest.SecretOf(t, c(), tr)
}

func get(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	return stacktest.Get(t, c(), tr)
}

// settled waits until berth has nothing left to do for the namespace: no finalizers or
// assigned hosts on its TaskRuns, no secrets but those of ended tasks, no records, and no internal TaskRuns for them.
func settled(t *testing.T, ns string) {
	t.Helper()
	eventually(t, "everything of "+ns+" is cleaned up", func() (bool, error) {
		var trs pipelinev1.TaskRunList
		if err := c().List(context.Background(), &trs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, tr := range trs.Items {
			if len(tr.Finalizers) > 0 || tr.Labels[contract.AssignedHostLabel] != "" && tr.Labels[contract.AssignedHostLabel] != contract.Localhost {
				return false, fmt.Errorf("%s still has finalizers %v / host %q", tr.Name, tr.Finalizers, tr.Labels[contract.AssignedHostLabel])
			}
		}
		if live, err := stacktest.SecretsOfLiveTasks(context.Background(), c(), ns); err != nil || len(live) > 0 {
			return false, fmt.Errorf("secrets of tasks still running: %v (%v)", live, err)
		}
		var records berthv1.AllocationList
		if err := c().List(context.Background(), &records, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, rec := range records.Items {
			if rec.Spec.TaskRun.Namespace == ns {
				return false, fmt.Errorf("record %s of %s is left: phase %s, debts %+v, message %q",
					rec.Name, rec.Spec.TaskRun.Key(), rec.Status.Phase, rec.Status.Debts, rec.Status.Message)
			}
		}
		var internal pipelinev1.TaskRunList
		if err := c().List(context.Background(), &internal, client.InNamespace(devstack.Namespace),
			client.MatchingLabels{contract.UserTaskNamespaceLabel: ns}); err != nil {
			return false, err
		}
		if len(internal.Items) > 0 {
			it := internal.Items[0]
			return false, fmt.Errorf("%d internal TaskRuns left, e.g. %s labels=%v spec.status=%q conditions=%+v",
				len(internal.Items), it.Name, it.Labels, it.Spec.Status, it.Status.Conditions)
		}
		return true, nil
	})
}

// noBuildUsersLeft asserts that no host has a berth build user any more.
func noBuildUsersLeft(t *testing.T) {
	t.Helper()
	for _, h := range stack.Fleet.Hosts {
		users, err := h.BuildUsers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(users) > 0 {
			t.Errorf("host %s still has build users: %s", h.Name, users)
		}
	}
}
