package hosts

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
)

// retire stops a VM taking new tasks, in its record and in the ledger (a later pass terminates
// it once free).
func (v *vmLoop) retire(ctx context.Context, rec *berthv1.BuildHost, reason string) error {
	if rec.Spec.Instance.Retire != "" {
		return nil
	}
	next := rec.DeepCopy()
	next.Spec.Instance.Retire = reason
	if err := v.client.Update(ctx, next); err != nil {
		return client.IgnoreNotFound(err)
	}
	v.capacity.RetireHost(rec.Name)
	v.event(next, corev1.EventTypeNormal, "Retired", "takes no new tasks: %s", reason)
	v.kick()
	return nil
}

// startTerminating records the decision to end the VM, then ends it. The decision goes into
// the spec first (spec.instance.retire: no task is handed the VM again, whatever happens
// next), then the Terminating phase into the status. A crash between the two writes is
// repaired from the phase the status still shows: launching and booting records that are
// retired come back here, and a ready one is opened retired and terminated by the planner
// once free.
func (v *vmLoop) startTerminating(ctx context.Context, rec *berthv1.BuildHost, why string) (reconcile.Result, error) {
	next := rec.DeepCopy()
	if next.Spec.Instance.Retire == "" {
		next.Spec.Instance.Retire = why
		if err := v.client.Update(ctx, next); err != nil {
			return reconcile.Result{}, err
		}
	}
	v.capacity.RetireHost(rec.Name)
	if next.Status.Instance == nil {
		next.Status.Instance = &berthv1.InstanceStatus{} // recorded; no status written yet
	}
	moved := next.Status.Instance.Phase != berthv1.InstanceTerminating
	if moved {
		// The terminate's failures are its own: what the launch failed says nothing of them.
		next.Status.Instance.Failures, next.Status.Instance.RetryAt = 0, nil
	}
	next.Status.Instance.Phase = berthv1.InstanceTerminating
	if err := v.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	if moved {
		v.retries.Forget(rec.Name)
	}
	return v.terminate(ctx, next)
}

// terminate ends the instance (already gone is done) and then drops the record. A terminate
// the cloud failed is asked again only at the record's RetryAt (see retryIn), whatever brings
// the record back before.
func (v *vmLoop) terminate(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	in, st := rec.Spec.Instance, rec.Status.Instance
	v.capacity.RetireHost(rec.Name)
	if st.ID != "" {
		if left := v.retryIn(rec, berthv1.InstanceTerminating); left > 0 {
			return reconcile.Result{RequeueAfter: left}, nil
		}
		p, err := v.providers.of(rec)
		if err == nil {
			err = p.Terminate(ctx, st.ID)
		}
		if err != nil && cloud.KindOf(err) != cloud.NotFound {
			next := rec.DeepCopy()
			next.Status.Instance.Failures++
			next.Status.Instance.Message = err.Error()
			retry := v.failed(next, berthv1.InstanceTerminating, err)
			if uerr := v.writeStatus(ctx, next); uerr != nil {
				return reconcile.Result{}, uerr
			}
			v.warn(next, "TerminateFailed", "terminating instance %s failed: %v; retrying in %s", st.ID, err, retry)
			return reconcile.Result{RequeueAfter: retry}, nil
		}
		v.event(rec, corev1.EventTypeNormal, "Terminated", "instance %s terminated: %s", st.ID, in.Retire)
		terminations.WithLabelValues(in.Platform).Inc()
	}
	return reconcile.Result{}, v.finishTermination(ctx, rec)
}

// finishTermination forgets what was owed to the VM and drops its record: nothing is left.
func (v *vmLoop) finishTermination(ctx context.Context, rec *berthv1.BuildHost) error {
	if err := v.debts.ForgetHost(ctx, rec.Name); err != nil {
		return err
	}
	if err := v.deleteRecord(ctx, rec); err != nil {
		return err
	}
	v.capacity.RemoveHost(rec.Name)
	v.readyVMs.drop(rec.Name)
	return nil
}

func (v *vmLoop) deleteRecord(ctx context.Context, rec *berthv1.BuildHost) error {
	err := v.client.Delete(ctx, rec, client.Preconditions{UID: &rec.UID})
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	v.forget(rec.Name)
	v.kick()
	return nil
}
