//go:build linux

package tekton

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/hosts"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/realtekton"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// A multi-platform build as Konflux runs it: one PipelineRun whose pipeline task has a matrix
// over PLATFORM. Tekton makes a TaskRun per platform, through berth's admission webhook, and
// berth serves each its own way: a slot on a static host, a VM launched through EC2, the local
// arm64 node. Each step logs in with what its pod mounted.
func TestMatrixPipelineRunServesEachPlatformItsWay(t *testing.T) {
	ns := namespace(t)
	pr := pipelineRun(ns, "multi-arch", 0, held(), staticPlatform, vmPlatform, localPlatform)
	create(t, pr)
	servedEachItsWay(t, ns, pr, taskRunsOf(t, pr, 3))
}

// servedEachItsWay checks that the PipelineRun's TaskRuns, one per platform of the suite, were
// each served their own way: the static one on a static host, the VM one on a VM launched
// through EC2 (both logging in as their build user), the local one with localhost on the arm64
// node. Then it ends their steps and waits until the PipelineRun succeeded and berth left
// nothing behind.
func servedEachItsWay(t *testing.T, ns string, pr *pipelinev1.PipelineRun, runs map[string]*pipelinev1.TaskRun) {
	t.Helper()
	static := runs[staticPlatform]
	rec := recordOf(t, static)
	if !slices.ContainsFunc(stack.Fleet.Hosts, func(h *sshhosts.Host) bool { return h.Name == rec.Status.Login.Host }) {
		t.Errorf("%s holds %s, want one of the static hosts", static.Name, rec.Status.Login.Host)
	}
	vm := runs[vmPlatform]
	vmRec := recordOf(t, vm)
	var vmHost berthv1.BuildHost
	if err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: vmRec.Status.Login.Host}, &vmHost); err != nil ||
		vmHost.Labels[hosts.LabelVM] == "" || vmHost.Spec.Instance.Provider != devstack.ProviderAWS {
		t.Errorf("%s holds %s (%v), want a VM launched through EC2", vm.Name, vmRec.Status.Login.Host, err)
	}
	for _, r := range []struct {
		tr  *pipelinev1.TaskRun
		rec *berthv1.Allocation
	}{{static, rec}, {vm, vmRec}} {
		pod := runningPod(t, r.tr)
		if user := logIn(t, mounted(t, r.tr, pod)); user != r.rec.Status.BuildUser {
			t.Errorf("%s's step logged in as %s, want its build user %s", r.tr.Name, user, r.rec.Status.BuildUser)
		}
		endSteps(t, pod)
	}

	local := runs[localPlatform]
	pod := runningPod(t, local)
	if host := string(mounted(t, local, pod)["host"]); host != contract.Localhost {
		t.Errorf("the local task's secret names host %q, want %s", host, contract.Localhost)
	}
	if node := nodeOf(t, pod); node.Labels["kubernetes.io/arch"] != "arm64" {
		t.Errorf("the local arm64 task's pod runs on %s (%s)", node.Name, node.Labels["kubernetes.io/arch"])
	}
	endSteps(t, pod)

	if cond := ended(t, pr); !cond.IsTrue() {
		t.Fatalf("%s ended %s (%s: %s), want it Succeeded", pr.Name, cond.Status, cond.Reason, cond.Message)
	}
	settled(t, ns)
}

// Tekton retries a failed attempt in place: the same TaskRun, its status moved to
// retriesStatus, a new pod mounting the same secret. berth keeps the host and the build user
// for the task's every attempt, so the retry logs in as the first attempt did: with the key
// itself, and with a one-time token, which the key server honours once per attempt.
func TestRetriedAttemptLogsInAgain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		platform string
		otp      bool
	}{
		{"key on a VM", vmPlatform, false},
		{"one-time token on a static host", staticPlatform, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.otp {
				stacktest.OTPController(t, stack, options)
			}
			ns := namespace(t)
			failFirst := held()
			failFirst[realtekton.FailStepAnnotation], failFirst[realtekton.FailAttemptsAnnotation] = "build", "1"
			pr := pipelineRun(ns, "retried", 2, failFirst, tc.platform)
			create(t, pr)
			tr := taskRunsOf(t, pr, 1)[tc.platform]
			if tr.Spec.Retries != 2 {
				t.Fatalf("Tekton made %s with retries %d, want the pipeline task's 2", tr.Name, tr.Spec.Retries)
			}
			rec := recordOf(t, tr)

			first := runningPod(t, tr)
			firstData := mounted(t, tr, first)
			if user := logIn(t, firstData); user != rec.Status.BuildUser {
				t.Fatalf("attempt 1 logged in as %s, want %s", user, rec.Status.BuildUser)
			}
			endSteps(t, first) // and it fails

			stacktest.Eventually(t, "Tekton retries "+tr.Name, func() (bool, error) {
				err := c().Get(context.Background(), client.ObjectKeyFromObject(tr), tr)
				return len(tr.Status.RetriesStatus) == 1 && tr.Status.PodName != "" && tr.Status.PodName != first.Name, err
			})
			second := runningPod(t, tr)
			secondData := mounted(t, tr, second)
			if user := logIn(t, secondData); user != rec.Status.BuildUser {
				t.Fatalf("attempt 2 logged in as %s, want the task's build user %s", user, rec.Status.BuildUser)
			}
			stacktest.Eventually(t, "berth counts the second attempt", func() (bool, error) {
				return stacktest.Record(t, c(), tr).Status.TaskRunAttempt == 2, nil
			})
			if tc.otp {
				// Once per attempt: the token is spent again.
				if status, body := tryRedeem(t, secondData, secondData["otp"]); status != http.StatusNotFound {
					t.Errorf("a second redemption in attempt 2 was answered %d (%s), want 404", status, body)
				}
			}
			endSteps(t, second)

			if cond := ended(t, pr); !cond.IsTrue() {
				t.Fatalf("%s ended %s (%s: %s), want it Succeeded on its second attempt", pr.Name, cond.Status, cond.Reason, cond.Message)
			}
			settled(t, ns)
		})
	}
}

// Cancelling a PipelineRun mid-build: Tekton cancels its TaskRuns and deletes their pods;
// berth lets go of the static slot and the VM.
func TestCancelledPipelineRunLetsGoOfEverything(t *testing.T) {
	ns := namespace(t)
	pr := pipelineRun(ns, "cancelled", 0, held(), staticPlatform, vmPlatform)
	create(t, pr)
	for _, tr := range taskRunsOf(t, pr, 2) {
		logIn(t, mounted(t, tr, runningPod(t, tr)))
	}
	patch := client.MergeFrom(pr.DeepCopy())
	pr.Spec.Status = pipelinev1.PipelineRunSpecStatusCancelled
	if err := c().Patch(context.Background(), pr, patch); err != nil {
		t.Fatal(err)
	}
	if cond := ended(t, pr); cond.IsTrue() || cond.Reason != pipelinev1.PipelineRunReasonCancelled.String() {
		t.Fatalf("%s ended %s (%s: %s), want it Cancelled", pr.Name, cond.Status, cond.Reason, cond.Message)
	}
	settled(t, ns)
}

// A TaskRun that runs past its timeout: Tekton fails it and deletes its pod; berth cleans up.
func TestTimedOutTaskRunLetsGoOfItsHost(t *testing.T) {
	ns := namespace(t)
	tr := taskRun(ns, "slow", staticPlatform, held())
	tr.Spec.Timeout = &metav1.Duration{Duration: 3 * time.Second}
	create(t, tr)
	stacktest.Eventually(t, tr.Name+" times out", func() (bool, error) {
		err := c().Get(context.Background(), client.ObjectKeyFromObject(tr), tr)
		return tr.IsDone(), err
	})
	if reason := tr.Status.GetCondition("Succeeded").Reason; reason != pipelinev1.TaskRunReasonTimedOut.String() {
		t.Fatalf("%s ended for %s, want %s", tr.Name, reason, pipelinev1.TaskRunReasonTimedOut)
	}
	settled(t, ns)
}

// Deleting a PipelineRun mid-build: the garbage collector deletes its TaskRuns, and berth
// cleans up before they go.
func TestDeletedPipelineRunLetsGoOfEverything(t *testing.T) {
	ns := namespace(t)
	pr := pipelineRun(ns, "deleted", 0, held(), staticPlatform, vmPlatform)
	create(t, pr)
	runs := taskRunsOf(t, pr, 2)
	for _, tr := range runs {
		logIn(t, mounted(t, tr, runningPod(t, tr)))
	}
	if err := c().Delete(context.Background(), pr, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, "the TaskRuns of "+pr.Name+" are gone", func() (bool, error) {
		var list pipelinev1.TaskRunList
		err := c().List(context.Background(), &list, client.InNamespace(ns))
		return len(list.Items) == 0, err
	})
	settled(t, ns)
}

// The contract's only way to make a task wait: its pod mounts a secret that does not exist
// yet. With every static slot taken, a third task's pod stays Pending, its TaskRun says it
// waits; once a slot is free berth writes its secret and the pod starts and logs in.
func TestPodWaitsUntilBerthWritesItsSecret(t *testing.T) {
	ns := namespace(t)
	var holders []*pipelinev1.TaskRun
	for i := range len(stack.Fleet.Hosts) * hostSlots {
		tr := taskRun(ns, "holder-"+string(rune('a'+i)), staticPlatform, held())
		create(t, tr)
		holders = append(holders, tr)
	}
	pods := map[string]*corev1.Pod{}
	for _, tr := range holders {
		pods[tr.Name] = runningPod(t, tr)
	}
	waiting := taskRun(ns, "waiting", staticPlatform, held())
	create(t, waiting)
	stacktest.Waiting(t, c(), waiting)
	var pod corev1.Pod
	stacktest.Eventually(t, "Tekton makes the waiting task's pod", func() (bool, error) {
		if err := c().Get(context.Background(), client.ObjectKeyFromObject(waiting), waiting); err != nil || waiting.Status.PodName == "" {
			return false, err
		}
		err := c().Get(context.Background(), client.ObjectKey{Namespace: ns, Name: waiting.Status.PodName}, &pod)
		return pod.Spec.NodeName != "", client.IgnoreNotFound(err)
	})
	// No wait proves a pod never starts: a pod made after it that mounts an existing secret
	// does start, so the gate and kwok have had their turn at this one.
	if err := stack.Tekton.Barrier(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	if err := c().Get(context.Background(), client.ObjectKeyFromObject(&pod), &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending || pod.Annotations[realtekton.SecretsMountedAnnotation] != "" {
		t.Fatalf("pod %s without its secret is %s (annotations %v), want it Pending and not started", pod.Name, pod.Status.Phase, pod.Annotations)
	}

	endSteps(t, pods[holders[0].Name])
	started := runningPod(t, waiting)
	rec := recordOf(t, waiting)
	if user := logIn(t, mounted(t, waiting, started)); user != rec.Status.BuildUser {
		t.Errorf("the waiting task logged in as %s, want %s", user, rec.Status.BuildUser)
	}
	endSteps(t, started)
	for _, tr := range holders[1:] {
		endSteps(t, pods[tr.Name])
	}
	settled(t, ns)
}

// taskRun is a TaskRun of the Task build, for one platform.
func taskRun(ns, name, platform string, annotations map[string]string) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: pipelinev1.TaskRunSpec{
			TaskRef: &pipelinev1.TaskRef{Name: "build"},
			Params:  pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)}},
		},
	}
}
