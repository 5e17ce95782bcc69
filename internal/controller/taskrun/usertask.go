package taskrun

import (
	"context"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
)

// reconcileUser moves a user TaskRun through the phases of its record.
func (r *Reconciler) reconcileUser(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	if tr.DeletionTimestamp != nil || tr.IsDone() {
		return r.finishing.finish(ctx, tr, rec)
	}
	if rec == nil {
		secret, err := r.secrets.of(ctx, tr.Namespace, tr.Name)
		if err != nil {
			return reconcile.Result{}, err
		}
		if secret != nil && ownedBy(secret, tr.UID) {
			r.line.leave(tr) // answered already: local or an error
			return reconcile.Result{}, nil
		}
		if secret != nil && answeredElsewhere(secret) {
			r.line.leave(tr)
			if !r.mirror.firstForeign(tr.UID) {
				return reconcile.Result{}, nil
			}
			tell(ctx, r.secrets.recorder, tr, "", corev1.EventTypeWarning, "ForeignSecret",
				"the secret %s was not written by berth for this TaskRun (it has no owner, as those of the controller berth replaced have none), so the task has its answer already and berth does not serve it; if that is wrong, delete the secret and re-run the task", secret.Name)
			return reconcile.Result{}, nil
		}
		return r.admitting.admit(ctx, tr)
	}
	rec, err := r.retrying.follow(ctx, tr, rec)
	if err != nil {
		return reconcile.Result{}, err
	}
	var results outcomes
	sets := r.mirror.setCount(tr.UID)
	switch rec.Status.Phase {
	case berthv1.PhaseWaiting, "":
		results.add(r.reserving.reserve(ctx, tr, rec))
	case berthv1.PhaseProvisioning:
		results.add(r.provisioning.hold(ctx, tr, rec))
	case berthv1.PhaseReady:
		results.add(r.guarding.guardSecret(ctx, tr, rec, rec.Status.SecretDigest))
	}
	if len(rec.Status.Debts) > 0 {
		results.add(r.debts.pay(ctx, rec))
	}
	// The mirrors follow rec only when nothing above moved on from it. A step that wrote a
	// new record set the mirrors from that one (a reserved host, a wait, an error), and a
	// failed write proved rec stale: mirroring rec would take back what is true for a moment
	// (a reserved task shown waiting again), and the next reconcile would take berth's own
	// write for a tenant's edit and revert it with a MirrorReverted warning.
	if !results.stale && r.mirror.setCount(tr.UID) == sets {
		results.add(r.mirror.sync(ctx, tr, rec))
	}
	return results.result()
}

// stamp is t as a record's time, to the second.
func stamp(t time.Time) *metav1.Time {
	m := metav1.NewTime(t)
	return &m
}

// microStamp is t to the microsecond, for the times latencies are measured from.
func microStamp(t time.Time) *berthv1.MicroTime {
	m := berthv1.NewMicroTime(t)
	return &m
}
