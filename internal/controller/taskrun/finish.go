package taskrun

// The finish phase: an ended task lets go of its host, and the build users it leaves are
// removed (its debts) before the slot goes to the next.

import (
	"context"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
)

// finish cleans up after a task that ended or is being deleted, in an order that survives a
// crash between any two steps: a record whose TaskRun has ended owes its build user (and holds
// its slot) whatever its phase says, so the finalizer can go at once and a dead host never
// blocks the TaskRun's deletion; the slot is freed only once the user is gone. The secret
// stays: its key logs in as a user that is being removed, and it goes with its TaskRun (its
// owner reference), or when a new TaskRun of the name needs the name (dropStaleSecret).
func (f *finishPhase) finish(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	if rec == nil {
		if err := f.releaseUnrecorded(taskOf(tr)); err != nil {
			return reconcile.Result{}, err
		}
	} else {
		var released bool
		var err error
		rec, released, err = f.endRecord(ctx, rec)
		// Observed on the pass that moved the task's slot to its clean, the one pass of the
		// task's end that the ledger tells apart: the record is saved as Cleaning only later,
		// so every pass until then (the clean's own end, its retries) looks like the first.
		if released && tr.Status.CompletionTime != nil {
			if tr.Status.StartTime != nil {
				taskSeconds.WithLabelValues(rec.Spec.Platform).Observe(tr.Status.CompletionTime.Sub(tr.Status.StartTime.Time).Seconds())
			}
			konfluxmetrics.Completed(rec.Spec.Platform, tr.Status.CompletionTime.Sub(tr.CreationTimestamp.Time))
		}
		if err != nil {
			return reconcile.Result{}, err
		}
	}
	if _, err := f.mirror.sync(ctx, tr, nil); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if rec == nil {
		// What berth last wrote on the TaskRun is kept until its record is gone: the passes in
		// between (the clean ending a moment later) must not take the cache's older copy for
		// the TaskRun as it is, and patch it again on that copy.
		f.mirror.forget(tr.UID)
		return reconcile.Result{}, nil
	}
	return f.debts.pay(ctx, rec)
}

// releaseUnrecorded takes a task the cache shows no record of out of the ledger's queues. A
// task holding a slot always has a record (it is written as soon as the slot is taken), so a
// held one means the cache is behind berth's own write: freeing its slot now would hand it to
// a second task while the first one's build user may be on the host.
func (f *finishPhase) releaseUnrecorded(task allocation.Task) error {
	if _, held := f.capacity.Holder(task); held {
		return errStale
	}
	f.capacity.Release(task)
	return nil
}

// endRecord turns an ended task's hold into a debt of the record, in memory: the record is
// written only when a debt outlives this pass (a clean that failed, see settleDebts). Until
// then the record in the apiserver still names the user as held, which is the same debt to
// the next pass or the next start, since the TaskRun it was held for has ended. A record in
// Cleaning was written so and is returned as it is. released tells that this pass moved the
// task's own slot to its clean.
func (f *finishPhase) endRecord(ctx context.Context, rec *berthv1.Allocation) (next *berthv1.Allocation, released bool, err error) {
	if rec.Status.Phase == berthv1.PhaseCleaning {
		return rec, false, nil
	}
	next = rec.DeepCopy()
	held := rec.Status.Login != nil && (rec.Status.Phase == berthv1.PhaseProvisioning || rec.Status.Phase == berthv1.PhaseReady)
	if held {
		next.Status.Debts = append(next.Status.Debts, berthv1.Debt{HostLogin: *rec.Status.Login, BuildUser: rec.Status.BuildUser, HoldsSlot: true})
	}
	next.Status.Phase, next.Status.Login = berthv1.PhaseCleaning, nil
	next.Status.EndedAt = microStamp(f.now())
	task := taskOfRecord(rec)
	// The first pass moves the slot over; a later one (the clean still running) finds it moved.
	first := !held
	if held && f.capacity.Transfer(task, debtTask(next, rec.Status.BuildUser)) {
		first, released = true, true
		f.keyring.pending.Delete(keyID(rec))
		f.keyring.handed.Delete(keyID(rec))
		step(ctx, task.String(), rec.Spec.Platform, rec.Status.Login.Host, "HostReleased", "task %s ended; removing build user %s from host %s before its slot is freed",
			task, rec.Status.BuildUser, rec.Status.Login.Host)
	}
	f.capacity.Release(task)
	if !first {
		return next, false, nil
	}
	// Once, as the task ends: the redemption already refuses keys of an ended task, and the
	// sweeper deletes what this misses.
	return next, released, f.keyring.revoke(ctx, next)
}

// settleOrphan finishes a record whose TaskRun is gone (or was re-created under its name).
func (f *finishPhase) settleOrphan(ctx context.Context, rec *berthv1.Allocation) (reconcile.Result, error) {
	rec, _, err := f.endRecord(ctx, rec)
	if err != nil {
		return reconcile.Result{}, err
	}
	ref := rec.Spec.TaskRun
	if err := f.secrets.delete(ctx, ref.Namespace, ref.Name, ref.UID); err != nil {
		return reconcile.Result{}, err
	}
	f.mirror.forget(ref.UID)
	return f.debts.pay(ctx, rec)
}
