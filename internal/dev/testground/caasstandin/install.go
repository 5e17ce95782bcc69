package caasstandin

import (
	"context"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The install of a cluster runs as a Job, <instance>-install, in the instance's namespace. There
// is no kubelet on the test ground, so the stand-in writes its Pod's status as the kubelet would
// and the Job's as the Job controller would.

type installState int

const (
	installRunning installState = iota
	installSucceeded
	installFailed
)

const (
	installContainer = "installer"
	// installImage is never pulled; it only says on the Pod what runs there.
	installImage = "caas-standin.invalid/openshift-install:stand-in"
	// terminationMessageLines is how much of a failed install's log the Pod keeps as its
	// container's termination message (the kubelet keeps at most 80 lines).
	terminationMessageLines = 10
	eventSource             = "caas-standin"
)

// installFailureLog is what a DefinitionInstallFails install writes before it exits 1: an
// openshift-install run that the cloud refuses capacity.
const installFailureLog = `level=info msg=Consuming Install Config from target directory
level=info msg=Creating infrastructure resources...
level=info msg=Started local control plane with envtest
level=info msg=Stored kubeconfig for envtest in: /tmp/openshift-install-bootstrap/.clusterapi_output/envtest.kubeconfig
level=info msg=Running process: Cluster API with args [-v=2 --diagnostics-address=0 --health-addr=127.0.0.1:34567]
level=info msg=Creating infra manifests...
level=info msg=Created manifest *v1beta2.AWSCluster, namespace=openshift-cluster-api-guests name=stand-in-7x2kq
level=info msg=Waiting up to 15m0s (until 10:42AM UTC) for network infrastructure to become ready...
level=error msg=failed to fetch Cluster: failed to generate asset "Cluster": failed to create cluster: failed provisioning resources after infrastructure ready: failed to create bootstrap instance: VcpuLimitExceeded: You have requested more vCPU capacity than your current vCPU limit of 32 allows for the instance bucket that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.
level=fatal msg=Bootstrap failed to complete: cluster installation failed: VcpuLimitExceeded: request more vCPU capacity for the account, or free some, and retry
`

// failureSummary is the line of an install log that says why it failed: its last fatal or error
// line, without the log's level prefix.
func failureSummary(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		for _, prefix := range []string{"level=fatal msg=", "level=error msg="} {
			if rest, ok := strings.CutPrefix(lines[i], prefix); ok {
				return rest
			}
		}
	}
	return lines[len(lines)-1]
}

func logTail(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	return strings.Join(lines[max(0, len(lines)-terminationMessageLines):], "\n")
}

// ensureInstall makes the install Job and its Pod if they are not there and, unless the Job has
// already finished, puts both in state.
func (s *StandIn) ensureInstall(ctx context.Context, cti *instance, state installState, log string) error {
	job, err := s.installJob(ctx, cti)
	if err != nil {
		return err
	}
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	pod, err := s.installPod(ctx, job)
	if err != nil {
		return err
	}
	now := metav1.Now()
	if want := podStatus(pod, state, log, now); pod.Status.Phase != want.Phase {
		pod.Status = want
		if err := s.client.Status().Update(ctx, pod); err != nil {
			return fmt.Errorf("writing the status of install Pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	if want := jobStatus(job, state, now); !jobStatusEqual(job.Status, want) {
		job.Status = want
		if err := s.client.Status().Update(ctx, job); err != nil {
			return fmt.Errorf("writing the status of install Job %s/%s: %w", job.Namespace, job.Name, err)
		}
	}
	return nil
}

func (s *StandIn) installJob(ctx context.Context, cti *instance) (*batchv1.Job, error) {
	job := &batchv1.Job{}
	key := client.ObjectKey{Namespace: cti.Namespace, Name: cti.installJob()}
	err := s.client.Get(ctx, key, job)
	if !apierrors.IsNotFound(err) {
		return job, err
	}
	owner := cti.ownerReference()
	owner.Controller, owner.BlockOwnerDeletion = ptr.To(true), ptr.To(true)
	job = &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: installContainer, Image: installImage,
					Command:                  []string{"openshift-install", "create", "cluster", "--dir=/output", "--log-level=info"},
					TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				}},
			}},
		},
	}
	if err := s.client.Create(ctx, job); err != nil {
		return nil, fmt.Errorf("creating install Job %s: %w", key, err)
	}
	return job, nil
}

// installPod is the Job's one Pod, named as the Job controller would with a suffix taken from
// the Job's UID, so that a restarted stand-in finds it again.
func (s *StandIn) installPod(ctx context.Context, job *batchv1.Job) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	key := client.ObjectKey{Namespace: job.Namespace, Name: job.Name + "-" + strings.ReplaceAll(string(job.UID), "-", "")[:5]}
	err := s.client.Get(ctx, key, pod)
	if !apierrors.IsNotFound(err) {
		return pod, err
	}
	pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: key.Name, Namespace: key.Namespace, Labels: job.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *job.Spec.Template.Spec.DeepCopy(),
	}
	if err := s.client.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating install Pod %s: %w", key, err)
	}
	return pod, nil
}

func podStatus(pod *corev1.Pod, state installState, log string, now metav1.Time) corev1.PodStatus {
	started := now
	if pod.Status.StartTime != nil {
		started = *pod.Status.StartTime
	}
	cs := corev1.ContainerStatus{Name: installContainer, Image: installImage}
	st := corev1.PodStatus{StartTime: &started}
	switch state {
	case installRunning:
		st.Phase = corev1.PodRunning
		cs.Ready, cs.Started = true, ptr.To(true)
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: started}
	case installSucceeded:
		st.Phase = corev1.PodSucceeded
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: started, FinishedAt: now}
	case installFailed:
		st.Phase = corev1.PodFailed
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: logTail(log), StartedAt: started, FinishedAt: now}
	}
	st.ContainerStatuses = []corev1.ContainerStatus{cs}
	return st
}

func jobStatus(job *batchv1.Job, state installState, now metav1.Time) batchv1.JobStatus {
	started := now
	if job.Status.StartTime != nil {
		started = *job.Status.StartTime
	}
	st := batchv1.JobStatus{StartTime: &started}
	condition := func(typ batchv1.JobConditionType, reason, message string) batchv1.JobCondition {
		return batchv1.JobCondition{Type: typ, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastProbeTime: now, LastTransitionTime: now}
	}
	switch state {
	case installRunning:
		st.Active, st.Ready = 1, ptr.To[int32](1)
	case installSucceeded:
		st.Succeeded, st.Ready, st.CompletionTime = 1, ptr.To[int32](0), &now
		st.Conditions = []batchv1.JobCondition{
			condition(batchv1.JobSuccessCriteriaMet, "CompletionsReached", "Reached expected number of succeeded pods"),
			condition(batchv1.JobComplete, "CompletionsReached", "Reached expected number of succeeded pods"),
		}
	case installFailed:
		st.Failed, st.Ready = 1, ptr.To[int32](0)
		st.Conditions = []batchv1.JobCondition{
			condition(batchv1.JobFailureTarget, "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
			condition(batchv1.JobFailed, "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
		}
	}
	return st
}

// jobStatusEqual compares what tells a Job's state, not its times.
func jobStatusEqual(a, b batchv1.JobStatus) bool {
	return a.Active == b.Active && a.Succeeded == b.Succeeded && a.Failed == b.Failed && len(a.Conditions) == len(b.Conditions)
}

// warn records a Warning Event on the instance. Its name is fixed per reason, so that a retried
// reconcile does not repeat it.
func (s *StandIn) warn(ctx context.Context, cti *instance, reason, message string) error {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: cti.Name + "." + strings.ToLower(reason), Namespace: cti.Namespace},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: instanceGVK.GroupVersion().String(), Kind: instanceGVK.Kind,
			Namespace: cti.Namespace, Name: cti.Name, UID: cti.UID, ResourceVersion: cti.ResourceVersion,
		},
		Reason: reason, Message: message, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: eventSource},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := s.client.Create(ctx, ev); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("recording an Event on instance %s/%s: %w", cti.Namespace, cti.Name, err)
	}
	return nil
}

// deleteInstall deletes the install Job and its Pod; the Pod too, since a cluster without a
// garbage collector would otherwise keep it.
func (s *StandIn) deleteInstall(ctx context.Context, cti *instance) error {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: cti.installJob(), Namespace: cti.Namespace}}
	if err := s.client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting install Job %s/%s: %w", job.Namespace, job.Name, err)
	}
	err := s.client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(cti.Namespace), client.MatchingLabels{batchv1.JobNameLabel: cti.installJob()})
	if err != nil {
		return fmt.Errorf("deleting the Pods of install Job %s/%s: %w", job.Namespace, job.Name, err)
	}
	return nil
}
