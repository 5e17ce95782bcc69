//go:build linux

package realtekton

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

var (
	cp     *controlplane.ControlPlane
	tekton *Tekton
)

func TestMain(m *testing.M) { os.Exit(RunTests(m, &cp, &tekton)) }

const (
	stepImage = "testground.invalid/step"
	runWait   = 2 * time.Minute
)

// A Task referenced by name, with the ssh secret volume of berth's contract: Tekton resolves it
// into status.taskSpec, and its pod waits for the secret berth would write, then runs with it.
func TestPodWaitsForItsSecretThenRuns(t *testing.T) {
	ctx, c, ns := setup(t, "gate")
	task := &pipelinev1.Task{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "build-", Namespace: ns},
		Spec: pipelinev1.TaskSpec{
			Params: []pipelinev1.ParamSpec{{Name: "PLATFORM", Type: pipelinev1.ParamTypeString}},
			Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: "multi-platform-ssh-$(context.taskRun.name)"},
			}}},
			Steps: []pipelinev1.Step{{
				Name:         "build",
				Image:        stepImage,
				Script:       "ssh -i /ssh/id_rsa \"$(cat /ssh/host)\" make",
				VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh"}},
			}},
		},
	}
	create(t, ctx, c, task)
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "gated-", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			TaskRef: &pipelinev1.TaskRef{Name: task.Name},
			Params:  pipelinev1.Params{{Name: "PLATFORM", Value: *pipelinev1.NewStructuredValues("linux/arm64")}},
		},
	}
	create(t, ctx, c, tr)
	secretName := "multi-platform-ssh-" + tr.Name

	waitFor(t, ctx, "the TaskRun to have its Task's spec and a pod", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(tr), tr)
		return tr.Status.TaskSpec != nil && tr.Status.PodName != "", err
	})
	if !slices.ContainsFunc(tr.Status.TaskSpec.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == secretName
	}) {
		t.Fatalf("status.taskSpec.volumes = %+v, want the secret %s", tr.Status.TaskSpec.Volumes, secretName)
	}
	pod := &corev1.Pod{}
	waitFor(t, ctx, "the pod to be scheduled", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tr.Status.PodName}, pod)
		return pod.Spec.NodeName != "", client.IgnoreNotFound(err)
	})

	// No wait proves a pod never starts; a pod scheduled after it that mounts an existing
	// Secret does start, so the gate and kwok have had their turn at this one.
	barrier(t, ctx, c, ns)
	if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending || pod.Annotations[SecretsMountedAnnotation] != "" {
		t.Fatalf("pod %s without its secret: phase %s, annotations %v; want it Pending and unmarked", pod.Name, pod.Status.Phase, pod.Annotations)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(tr), tr); err != nil {
		t.Fatal(err)
	}
	if cond := tr.Status.GetCondition(apis.ConditionSucceeded); cond == nil || cond.Status != corev1.ConditionUnknown {
		t.Fatalf("TaskRun without its secret: condition %+v, want it still running", cond)
	}

	create(t, ctx, c, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: ns},
		Data:       map[string][]byte{"id_rsa": []byte("the build user's key"), "host": []byte("u-1@198.18.0.2")},
	})
	cond := waitDone(t, ctx, c, tr)
	if cond.Status != corev1.ConditionTrue {
		t.Fatalf("TaskRun ended %s (%s: %s), want it Succeeded", cond.Status, cond.Reason, cond.Message)
	}
	mounted := tekton.MountedSecrets(ns, pod.Name)[secretName]
	if string(mounted["id_rsa"]) != "the build user's key" || string(mounted["host"]) != "u-1@198.18.0.2" {
		t.Fatalf("the step read %q from its secret, want what was written", mounted)
	}
}

// FailStepAnnotation fails the step it names, and Tekton fails the TaskRun for it.
func TestStepFailsOnDemand(t *testing.T) {
	ctx, c, ns := setup(t, "fail")
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "failing-", Namespace: ns, Annotations: map[string]string{FailStepAnnotation: "build"}},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{
			{Name: "prepare", Image: stepImage, Script: "true"},
			{Name: "build", Image: stepImage, Script: "make"},
		}}},
	}
	create(t, ctx, c, tr)
	cond := waitDone(t, ctx, c, tr)
	if cond.Status != corev1.ConditionFalse || cond.Reason != string(pipelinev1.TaskRunReasonStepFailed) {
		t.Fatalf("TaskRun ended %s (%s: %s), want it Failed for its step", cond.Status, cond.Reason, cond.Message)
	}
	exits := map[string]int32{}
	for _, s := range tr.Status.Steps {
		if s.Terminated != nil {
			exits[s.Name] = s.Terminated.ExitCode
		}
	}
	if exits["prepare"] != 0 || exits["build"] != 1 {
		t.Fatalf("step exit codes %v, want prepare 0 and build 1", exits)
	}
}

// RunForAnnotation keeps the steps running, so that a test can act on a running TaskRun: here
// cancel it, which Tekton does by deleting its pod.
func TestRunningTaskRunCancels(t *testing.T) {
	ctx, c, ns := setup(t, "cancel")
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "long-", Namespace: ns, Annotations: map[string]string{RunForAnnotation: "1h"}},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{
			{Name: "build", Image: stepImage, Script: "make"},
		}}},
	}
	create(t, ctx, c, tr)
	pod := &corev1.Pod{}
	waitFor(t, ctx, "the steps to run", func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(tr), tr); err != nil || tr.Status.PodName == "" {
			return false, err
		}
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tr.Status.PodName}, pod)
		return pod.Status.Phase == corev1.PodRunning && pod.Annotations["tekton.dev/ready"] == "READY", client.IgnoreNotFound(err)
	})
	patch := client.MergeFrom(tr.DeepCopy())
	tr.Spec.Status = pipelinev1.TaskRunSpecStatusCancelled
	if err := c.Patch(ctx, tr, patch); err != nil {
		t.Fatal(err)
	}
	cond := waitDone(t, ctx, c, tr)
	if cond.Status != corev1.ConditionFalse || cond.Reason != string(pipelinev1.TaskRunReasonCancelled) {
		t.Fatalf("TaskRun ended %s (%s: %s), want it Cancelled", cond.Status, cond.Reason, cond.Message)
	}
	waitFor(t, ctx, "the cancelled TaskRun's pod to be gone", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// Tekton's webhook is in the loop: it refuses a TaskRun Tekton's validation refuses, with its
// message, and fills in its defaults.
func TestWebhookValidatesAndDefaults(t *testing.T) {
	ctx, c, ns := setup(t, "webhook")
	invalid := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "no-steps", Namespace: ns},
		Spec:       pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{}},
	}
	err := c.Create(ctx, invalid)
	if err == nil || !strings.Contains(err.Error(), `admission webhook "validation.webhook.pipeline.tekton.dev" denied the request`) {
		t.Fatalf("creating a TaskRun without steps: %v, want the webhook's refusal", err)
	}
	valid := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "defaulted-", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{
			{Name: "build", Image: stepImage, Script: "true"},
		}}},
	}
	create(t, ctx, c, valid)
	if valid.Spec.Timeout == nil || valid.Spec.Timeout.Duration != time.Hour || valid.Spec.ServiceAccountName != "default" {
		t.Fatalf("created TaskRun has timeout %v and service account %q, want Tekton's defaults 1h and default", valid.Spec.Timeout, valid.Spec.ServiceAccountName)
	}
}

// setup gives a test a context, the client and a namespace of its own, and logs the end of
// Tekton's logs if it fails.
func setup(t *testing.T, ns string) (context.Context, client.Client, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*runWait)
	t.Cleanup(cancel)
	if err := tekton.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range binaries {
				t.Logf("end of %s's log:\n%s", name, tekton.LogTail(name, 15))
			}
		}
	})
	return ctx, cp.Client, ns
}

func create(t *testing.T, ctx context.Context, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(ctx, obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName()+obj.GetGenerateName(), err)
	}
}

func waitFor(t *testing.T, ctx context.Context, what string, done func() (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, runWait, true, func(context.Context) (bool, error) {
		return done()
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitDone waits until the TaskRun has ended and returns its Succeeded condition.
func waitDone(t *testing.T, ctx context.Context, c client.Client, tr *pipelinev1.TaskRun) *apis.Condition {
	t.Helper()
	var cond *apis.Condition
	waitFor(t, ctx, fmt.Sprintf("TaskRun %s to end", tr.Name), func() (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(tr), tr)
		cond = tr.Status.GetCondition(apis.ConditionSucceeded)
		return cond != nil && cond.Status != corev1.ConditionUnknown, err
	})
	return cond
}

// barrier waits until the gate and kwok have handled every pod made before it (Barrier).
func barrier(t *testing.T, ctx context.Context, _ client.Client, ns string) {
	t.Helper()
	if err := tekton.Barrier(ctx, ns); err != nil {
		t.Fatal(err)
	}
}
