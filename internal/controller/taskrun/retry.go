package taskrun

// The retry phase: Tekton retries a failed attempt of a TaskRun in place (a pipeline task with
// retries: N), with a new pod that mounts the same secret. berth keeps the task's host and
// build user for every attempt, so that secret logs in again; with the OTP option the key
// server lets each attempt redeem its token once (docs/otp.md). What is left here is to say so.

import (
	"context"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
)

// follow records a new attempt of the task on its record and tells the task's owner what it
// keeps. It returns the record as it now is.
func (p *retryPhase) follow(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (*berthv1.Allocation, error) {
	attempt := attemptOf(tr)
	if attempt <= max(rec.Status.TaskRunAttempt, 1) {
		return rec, nil
	}
	next := rec.DeepCopy()
	next.Status.TaskRunAttempt = attempt
	if err := p.records.save(ctx, next); err != nil {
		return rec, err
	}
	taskRetries.WithLabelValues(rec.Spec.Platform).Inc()
	if login := rec.Status.Login; login != nil && rec.Status.BuildUser != "" {
		how := "its secret logs in as before"
		if p.oneTime {
			how = "the one-time token in its secret can be redeemed once more"
		}
		tell(ctx, p.recorder, tr, login.Host, corev1.EventTypeNormal, "Retried",
			"Tekton runs attempt %d of this task: it keeps build user %s on host %s, so %s", attempt, rec.Status.BuildUser, login.Host, how)
	} else {
		tell(ctx, p.recorder, tr, "", corev1.EventTypeNormal, "Retried",
			"Tekton runs attempt %d of this task, which still waits for a host of platform %s", attempt, rec.Spec.Platform)
	}
	return next, nil
}
