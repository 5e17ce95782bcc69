package taskrun

// The reserve phase: a recorded task takes a slot of a host, or waits in line for one.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
)

// reserve takes a slot for the task, or queues it. The record names host, admin login and build
// user before anything happens on the host; only once it is written does provisioning start.
func (rs *reservePhase) reserve(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	task := taskOf(tr)
	grant := rs.capacity.Acquire(allocation.Request{Task: task, Platform: rec.Spec.Platform,
		Created: rec.Spec.Queued.Time, Exclude: rec.Status.FailedHosts})
	switch {
	case grant.Blocked:
		return rs.answers.giveUp(ctx, tr, rec, "AllHostsFailed", fmt.Sprintf(
			"no host of platform %s could be provisioned for this task (failed: %s). The hosts may be down or misconfigured; see the events of this TaskRun and tell the platform team.",
			rec.Spec.Platform, strings.Join(rec.Status.FailedHosts, ", ")))
	case grant.Host == "":
		return rs.wait(ctx, tr, rec, grant.Position)
	}
	login, ok := rs.strategies.of(rec).login(grant.Host)
	if !ok {
		rs.capacity.Release(task)
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	pair, err := rs.keyring.pair(tr.Namespace + "/" + tr.Name)
	if err != nil {
		rs.capacity.Release(task)
		return reconcile.Result{}, err
	}
	next := rec.DeepCopy()
	next.Status.Phase = berthv1.PhaseProvisioning
	next.Status.Login = &login
	next.Status.Attempt++
	next.Status.BuildUser = hostops.UserNameFor(next.Spec.Platform, string(tr.UID), next.Status.Attempt)
	next.Status.UserDir, next.Status.Message = "", ""
	next.Status.ReservedAt = microStamp(rs.now())
	if len(next.Status.SealKey) == 0 {
		if next.Status.SealKey, err = newSealKey(); err != nil {
			rs.capacity.Release(task)
			return reconcile.Result{}, err
		}
	}
	if err := rs.records.save(ctx, next); err != nil {
		// A reservation made just now and not recorded is not held. One made by an earlier
		// reconcile is recorded already (this one read a stale copy): it stays.
		if !grant.Held {
			rs.capacity.Release(task)
		}
		return reconcile.Result{}, err
	}
	rs.keyring.pending.Store(keyID(next), pair)
	waited := rs.now().Sub(tr.CreationTimestamp.Time)
	waitSeconds.WithLabelValues(rec.Spec.Platform).Observe(waited.Seconds())
	konfluxmetrics.Reserved(rec.Spec.Platform, waited)
	step(ctx, tr.Namespace+"/"+tr.Name, rec.Spec.Platform, login.Host, "HostAssigned", "host %s reserved for platform %s; creating build user %s", login.Host, rec.Spec.Platform, next.Status.BuildUser)
	var results outcomes
	results.add(rs.mirror.sync(ctx, tr, next))
	results.add(rs.provisioning.provision(ctx, tr, next))
	return results.result()
}

func keyID(rec *berthv1.Allocation) string {
	return string(rec.Spec.TaskRun.UID) + "/" + strconv.Itoa(rec.Status.Attempt)
}

// wait records the task as waiting and tells it its place; a freed slot wakes it. The only timed
// requeue is the wait timeout's.
func (rs *reservePhase) wait(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, position int) (reconcile.Result, error) {
	var left time.Duration
	if rs.waitTimeout > 0 {
		// Counted from creation: the same answer after a restart.
		if left = rs.waitTimeout - rs.now().Sub(tr.CreationTimestamp.Time); left <= 0 {
			rs.capacity.Release(taskOf(tr))
			return rs.answers.giveUp(ctx, tr, rec, "WaitTimeout", fmt.Sprintf(
				"no host of platform %s became free within %s; all are busy. Retry later, or ask the platform team for more capacity.", rec.Spec.Platform, rs.waitTimeout))
		}
	}
	reason, message, recheck := rs.strategies.of(rec).busy(rec.Spec.Platform, rs.now().Sub(rec.Spec.Queued.Time))
	if reason != "" {
		rs.capacity.Release(taskOf(tr))
		return rs.answers.giveUp(ctx, tr, rec, reason, message)
	}
	if recheck > 0 && (left == 0 || recheck < left) {
		left = recheck
	}
	if rec.ResourceVersion == "" {
		// A task that never held a slot waits without a record: the ledger's queue holds it,
		// its TaskRun's labels show it, and after a restart it is queued again as a user
		// TaskRun with neither record nor secret (see restoreQueue), by its creation time.
		// Only a task that had a host and must try another (provisioningFailed) has a
		// Waiting record, for the hosts that failed it and the users it owes.
		rec = rec.DeepCopy()
		rec.Status.Phase = berthv1.PhaseWaiting
		if !rs.mirror.toldWaiting(tr, rec.Spec.Platform) {
			tell(ctx, rs.recorder, tr, "", corev1.EventTypeNormal, "Waiting", "every host of platform %s is busy; this task is number %d in line", rec.Spec.Platform, position)
		}
	}
	res, err := rs.mirror.sync(ctx, tr, rec)
	if left > 0 && (res.RequeueAfter == 0 || left < res.RequeueAfter) {
		res.RequeueAfter = left
	}
	return res, err
}
