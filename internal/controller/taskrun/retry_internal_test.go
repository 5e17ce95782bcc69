package taskrun

import (
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
)

// TestARetriedTaskKeepsItsUserAndSaysSo: Tekton retries a failed attempt in place, and the new
// pod mounts the same secret. berth keeps the secret, the host and the build user, counts the
// attempt on its record and tells the owner once per attempt; the user goes when the last
// attempt ends.
func TestARetriedTaskKeepsItsUserAndSaysSo(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	tr := h.create(userTaskRun("build", s390x))
	h.settle()
	user, _ := h.handedOver(tr)
	handed := h.secret("build")

	for attempt := 2; attempt <= 3; attempt++ {
		h.retry("build")
		h.settle()
		rec := h.record(tr)
		if rec == nil || rec.Status.TaskRunAttempt != attempt || rec.Status.BuildUser != user {
			t.Fatalf("after retry to attempt %d, record %+v; want attempt %d, build user %s", attempt, rec, attempt, user)
		}
		if now := h.secret("build"); now == nil || now.ResourceVersion != handed.ResourceVersion {
			t.Fatalf("the secret was rewritten on attempt %d: every attempt's pod mounts the one handed over", attempt)
		}
		if users := h.prov.Users("h1"); !slices.Equal(users, []string{user}) {
			t.Fatalf("build users on h1 at attempt %d: %v, want only %s", attempt, users, user)
		}
		told := h.events.on("TaskRun", tenantNS, "build", "Retried")
		if len(told) != attempt-1 || !strings.Contains(told[attempt-2].note, user) || strings.Contains(told[attempt-2].note, "one-time") {
			t.Fatalf("Retried Events at attempt %d: %+v, want %d, the last naming %s and no one-time token (there is none)", attempt, told, attempt-1, user)
		}
	}
	h.settle() // nothing more to say about an attempt already told
	if told := h.events.on("TaskRun", tenantNS, "build", "Retried"); len(told) != 2 {
		t.Fatalf("Retried Events: %+v, want one per retry", told)
	}

	h.finish("build")
	h.settle()
	h.noBuildUsersLeft()
	if rec := h.record(tr); rec != nil {
		t.Fatalf("record left after the last attempt ended: %+v", rec.Status)
	}
}

// The cache keeps the count of Tekton's retries and the first attempt's start, never the
// attempts themselves, and never a status annotation of the TaskRun's own.
func TestTheCacheKeepsTheAttemptNotTheAttempts(t *testing.T) {
	first := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	tr := userTaskRun("build", s390x)
	tr.Status.Annotations = map[string]string{cachedAttemptKey: "9"}
	got, _ := stripTaskRun(tr.DeepCopy())
	if n := attemptOf(got.(*pipelinev1.TaskRun)); n != 1 {
		t.Fatalf("a TaskRun never retried, whose status claims attempt 9: attempt %d, want 1", n)
	}
	for range 3 {
		failed := pipelinev1.TaskRunStatus{}
		failed.StartTime = &first
		failed.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionFalse, Reason: "Failed"})
		tr.Status.RetriesStatus = append(tr.Status.RetriesStatus, failed)
	}
	got, _ = stripTaskRun(tr.DeepCopy())
	kept := got.(*pipelinev1.TaskRun)
	if n := attemptOf(kept); n != 4 || len(kept.Status.RetriesStatus) != 0 {
		t.Fatalf("after 3 failed attempts: attempt %d with %d attempts kept, want attempt 4 and none kept", n, len(kept.Status.RetriesStatus))
	}
	if kept.Status.StartTime == nil || !kept.Status.StartTime.Equal(&first) {
		t.Fatalf("start %v, want the first attempt's %v", kept.Status.StartTime, first)
	}
}

// retry fails the TaskRun's attempt and starts the next, as Tekton's retryTaskRun does: the
// status goes to retriesStatus, the condition back to Unknown (ToBeRetried), start and pod
// cleared.
func (h *harness) retry(name string) {
	h.t.Helper()
	tr := h.get(name)
	failed := tr.Status.DeepCopy()
	failed.RetriesStatus = nil
	failed.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionFalse, Reason: "Failed"})
	tr.Status.RetriesStatus = append(tr.Status.RetriesStatus, *failed)
	tr.Status.StartTime, tr.Status.CompletionTime, tr.Status.PodName = nil, nil, ""
	tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionUnknown, Reason: "ToBeRetried"})
	if err := h.api.Status().Update(h.ctx, tr); err != nil {
		h.t.Fatal(err)
	}
	h.enqueue(name)
}
