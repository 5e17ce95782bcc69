package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const installLogTail = `level=info msg="creating the hosted control plane"
level=error msg="the cloud refused the worker nodes: InsufficientInstanceCapacity for m6g.large in us-east-1a"`

// failInstall leaves what the CaaS service leaves after a failed install: the instance in
// ClusterInstallFailed, its Job <name>-install and that Job's Pod with the container
// terminated (exit code 1, the log's tail as its message), a Warning Event on the instance,
// and, as any namespace has, unrelated Events and Secrets.
func failInstall(t *testing.T, space *Space, name string) {
	t.Helper()
	ctx := context.Background()
	makeTemplate(t, "small", 1)
	makeQuota(t, space.Namespace, 5, map[string]int64{"small": 2})
	makeInstance(t, space.Namespace, name, "small")
	inst := newObject(instanceGVK, space.Namespace, name)
	if err := kube.Get(ctx, client.ObjectKeyFromObject(inst), inst); err != nil {
		t.Fatal(err)
	}
	setInstance(t, space, name, "ClusterInstallFailed", "the install job failed", map[string]any{"kubeconfig": map[string]any{"name": name + "-admin-kubeconfig"}},
		condition("InstallSucceeded", "False", "InstallFailed", "the install job failed"))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: space.Namespace, Name: name + "-admin-kubeconfig"},
		Data: map[string][]byte{"kubeconfig": []byte("token: sha256~never-print-this")}}

	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: space.Namespace, Name: name + "-install"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "install", Image: "quay.io/example/installer:1"}}}}}}
	for _, o := range []client.Object{secret, job} {
		if err := kube.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	job.Status.Failed = 1
	if err := kube.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: space.Namespace, Name: name + "-install-x7k2p",
		Labels:          map[string]string{batchv1.JobNameLabel: job.Name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID}}},
		Spec: job.Spec.Template.Spec}
	if err := kube.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	started := metav1.NewTime(time.Now().Add(-time.Minute))
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "install", Image: "quay.io/example/installer:1", ImageID: "quay.io/example/installer@sha256:0",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error",
			Message: installLogTail, StartedAt: started, FinishedAt: metav1.Now()}},
	}}}
	if err := kube.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}

	event := func(name string, involved corev1.ObjectReference, typ, reason, message string, at time.Time) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: space.Namespace, Name: name},
			InvolvedObject: involved, Type: typ, Reason: reason, Message: message,
			FirstTimestamp: metav1.NewTime(at), LastTimestamp: metav1.NewTime(at), Count: 1,
			Source: corev1.EventSource{Component: "test"}}
	}
	instRef := corev1.ObjectReference{APIVersion: instanceGVK.GroupVersion().String(), Kind: instanceGVK.Kind, Namespace: space.Namespace, Name: name, UID: inst.GetUID()}
	podRef := corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: space.Namespace, Name: pod.Name, UID: pod.UID}
	now := time.Now()
	for _, e := range []*corev1.Event{
		event("pod-started", podRef, corev1.EventTypeNormal, "Started", "Started container install", now.Add(-3*time.Minute)),
		event("cti-failed", instRef, corev1.EventTypeWarning, "InstallFailed", "the install job "+job.Name+" failed: InsufficientInstanceCapacity", now.Add(-time.Minute)),
		event("cti-installing", instRef, corev1.EventTypeNormal, "Installing", "started the install job "+job.Name, now.Add(-2*time.Minute)),
	} {
		if err := kube.Create(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDiagnoseNamesTheCauseOfAFailedInstall(t *testing.T) {
	space, _ := newSpace(t)
	failInstall(t, space, "run")
	var report strings.Builder
	err := Diagnose(context.Background(), space, "run", &report)
	out := report.String()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mustContain(t, "the report", out,
		"ClusterTemplateInstance "+space.Namespace+"/run",
		"phase:      ClusterInstallFailed",
		"message:    the install job failed",
		"InstallSucceeded   False   InstallFailed: the install job failed",
		"cost: 1",
		"allows small (at most 2; 1 in use: run)",
		"budget 5, 1 spent by the instances that exist",
		"Warning InstallFailed ClusterTemplateInstance/run: the install job run-install failed: InsufficientInstanceCapacity",
		"Job run-install: 0 active, 0 succeeded, 1 failed",
		"Pod run-install-x7k2p: Failed",
		"container install: terminated with exit code 1 (Error)",
		"log: unavailable (",
		"the container's termination message instead:",
		"| level=error msg=\"the cloud refused the worker nodes: InsufficientInstanceCapacity for m6g.large in us-east-1a\"",
	)
	// The instance's own Events come first, oldest first; the others after.
	installing, failed, started := strings.Index(out, "Installing"), strings.Index(out, "InstallFailed ClusterTemplateInstance"), strings.Index(out, "Started container")
	if !(installing < failed && failed < started) {
		t.Errorf("want the instance's Events first in time order, then the Pod's:\n%s", out)
	}
	if strings.Contains(out, "never-print-this") {
		t.Fatalf("the report shows a Secret:\n%s", out)
	}
	t.Log("\n" + out)
}

func TestDiagnoseReportsAMissingInstance(t *testing.T) {
	space, _ := newSpace(t)
	var report strings.Builder
	if err := Diagnose(context.Background(), space, "never-made", &report); err != nil {
		t.Fatal(err)
	}
	mustContain(t, "the report", report.String(), "does not exist", "Events in namespace "+space.Namespace, "none")
}
