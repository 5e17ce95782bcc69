//go:build stack

// Package withoutgc_test runs berth's controller on a control plane without a garbage
// collector, where owner references are never followed: whatever berth must clean up, it has
// to delete itself. The secrets berth writes are owned by their TaskRun, so on a real cluster
// the garbage collector would hide a cleanup berth forgot.
package withoutgc_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// stack has a control plane without kube-controller-manager, the Tekton stand-in and berth's
// controller, and no SSH hosts: the secrets that no finalizer guards are those of local and
// error answers.
var stack *devstack.Stack

const (
	localPlatform   = "linux/amd64"
	unknownPlatform = "linux/riscv64"
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "berth-withoutgc-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	stack, err = devstack.Up(context.Background(), devstack.Options{StateDir: dir, WithoutGarbageCollector: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: bringing up the stack:", err)
		return 1
	}
	defer func() {
		if err := stack.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "tearing the stack down:", err)
		}
	}()
	// Applied before the controller starts, so that its first decision already has it.
	if _, err := stack.ApplyHostConfig(context.Background(), map[string]string{"local-platforms": localPlatform}); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: applying the host config:", err)
		return 1
	}
	if err := stack.StartController(stacktest.Options()); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: starting the controller:", err)
		return 1
	}
	return m.Run()
}

func c() client.Client { return stack.ControlPlane.Client }

func namespace(t *testing.T, name string) string {
	t.Helper()
	if stack.ControlPlane.CollectsGarbage() {
		t.Fatal("the control plane runs a garbage collector: these tests would prove nothing")
	}
	if err := stack.ControlPlane.EnsureNamespace(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return name
}

// userTaskRun is a TaskRun as buildah-remote makes them: PLATFORM and the secret volume. No
// script: the stand-in resolves it and leaves it running.
func userTaskRun(ns, name, platform string) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Steps: []pipelinev1.Step{{Name: "build", Image: "buildah",
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name}}}},
			},
		},
	}
}

func create(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	if err := c().Create(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

// answered waits for the task's secret to hold key and returns it.
func answered(t *testing.T, tr *pipelinev1.TaskRun, key string) *corev1.Secret {
	t.Helper()
	s := stacktest.SecretOf(t, c(), tr)
	if _, ok := s.Data[key]; !ok {
		t.Fatalf("the secret of %s has keys %v, want %q", tr.Name, keys(s), key)
	}
	return s
}

func keys(s *corev1.Secret) []string {
	var out []string
	for k := range s.Data {
		out = append(out, k)
	}
	return out
}

func secretGone(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	stacktest.Eventually(t, "the secret of the deleted TaskRun "+tr.Name+" is gone", func() (bool, error) {
		err := c().Get(context.Background(), client.ObjectKey{Namespace: tr.Namespace, Name: contract.SecretPrefix + tr.Name}, &corev1.Secret{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

func deleteTaskRun(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	if err := c().Delete(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, "TaskRun "+tr.Name+" is gone", func() (bool, error) {
		err := c().Get(context.Background(), client.ObjectKeyFromObject(tr), &pipelinev1.TaskRun{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// A local or error answer holds no finalizer, so deleting the TaskRun is over at once and berth
// learns of it only afterwards.
func TestSecretOfADeletedTaskRunWithoutFinalizerGoes(t *testing.T) {
	ns := namespace(t, "no-finalizer")
	for _, tc := range []struct{ name, platform, key string }{
		{"local", localPlatform, "host"},
		{"error", unknownPlatform, "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := create(t, userTaskRun(ns, tc.name, tc.platform))
			secret := answered(t, tr, tc.key)
			// Owned like berth's secret: if anything but berth removed that, this would go too.
			witness := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "witness-" + tc.name, Namespace: ns,
				OwnerReferences: secret.OwnerReferences}}
			if err := c().Create(context.Background(), witness); err != nil {
				t.Fatal(err)
			}
			if f := stacktest.Get(t, c(), tr).Finalizers; len(f) > 0 {
				t.Fatalf("the TaskRun carries finalizers %v: this case is the one without", f)
			}
			deleteTaskRun(t, tr)
			secretGone(t, tr)
			if err := c().Get(context.Background(), client.ObjectKeyFromObject(witness), witness); err != nil {
				t.Fatalf("the witness owned by the same TaskRun went too (%v): something collects garbage here", err)
			}
		})
	}
}

// A TaskRun deleted while berth is down leaves berth no event to act on; its secret must still
// go once berth is back.
func TestSecretOfATaskRunDeletedWhileBerthWasDownGoes(t *testing.T) {
	ns := namespace(t, "deleted-while-down")
	tr := create(t, userTaskRun(ns, "build", localPlatform))
	answered(t, tr, "host")
	if err := stack.StopController(); err != nil {
		t.Fatal(err)
	}
	// No finalizer: the TaskRun is gone as soon as the delete returns.
	deleted := c().Delete(context.Background(), tr)
	gone := c().Get(context.Background(), client.ObjectKeyFromObject(tr), &pipelinev1.TaskRun{})
	if err := stack.StartController(stacktest.Options()); err != nil {
		t.Fatal(err)
	}
	if deleted != nil || !apierrors.IsNotFound(gone) {
		t.Fatalf("deleting the TaskRun while berth was down: %v; reading it back: %v", deleted, gone)
	}
	secretGone(t, tr)
}

// A TaskRun deleted and created again under its name is another task: it gets its own answer,
// not a conflict with the secret of the one before.
func TestReusedNameGetsItsOwnAnswer(t *testing.T) {
	ns := namespace(t, "reused-name")
	first := create(t, userTaskRun(ns, "build", localPlatform))
	answered(t, first, "host")
	deleteTaskRun(t, first)
	second := create(t, userTaskRun(ns, "build", unknownPlatform))
	stacktest.Eventually(t, "the second TaskRun has its own answer", func() (bool, error) {
		var s corev1.Secret
		err := c().Get(context.Background(), client.ObjectKey{Namespace: ns, Name: contract.SecretPrefix + "build"}, &s)
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		owned := len(s.OwnerReferences) == 1 && s.OwnerReferences[0].UID == second.UID
		if !owned {
			return false, fmt.Errorf("the secret is owned by %+v, not the second TaskRun %s", s.OwnerReferences, second.UID)
		}
		if _, ok := s.Data["error"]; !ok {
			return false, fmt.Errorf("the secret has keys %v, want the error of an unknown platform", keys(&s))
		}
		return true, nil
	})
}
