package taskrun

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/retryable"
)

// debts are the build users berth still owes a host a clean, held on the records (a user of a
// task that ended, a half-made one of a failed attempt): paid with backoff, each holding its
// slot until its user is gone, or forgotten with a host that is gone for good.
type debts struct {
	client      client.Client
	namespace   string
	provisioner provision.Provisioner
	capacity    *capacity.Capacity
	strategies  strategies
	records     *recordStore
	// cleans judges each clean's outcome; nil judges none.
	cleans   HostCleans
	recorder events.EventRecorder
	now      func() time.Time
	// retries holds, per clean job (its ID), when this process tries its failed clean again
	// (the RetryAt it saved, or now for a host reachable again), until the debt is settled:
	// the step before reconcileUser's own pay in the same pass may have saved a newer record
	// than the copy it holds. One entry per failed debt the records hold; retryHost, reading a
	// cache that still shows a debt settled a moment before, can leave one more until the
	// process ends.
	retries retryable.Retries
}

// failedClean is one debt whose clean failed in a pass.
type failedClean struct {
	debt berthv1.Debt
	err  error
}

// pay removes owed build users, with backoff on failure, whatever the config says now:
// the record holds the address and admin-key reference. A paid debt frees its slot; a record
// with nothing owed and no running task goes.
//
// A failed clean is tried again only once its debt's RetryAt has come. Any event can bring the
// record back before that (the echo of the failure's own write when it beats the write's
// answer, an edit of the TaskRun or its secret, a wake-up, another step of the same pass), and
// each such pass used to start the next attempt at once: a host that failed cleans was logged
// in to many times a second while the Events said "retrying in 5m0s". One signal retries
// early: a host that passes its check after failing (retryHost), which stays out of service
// until the users owed to it are gone. A config change does not: the record pins the address
// and admin-key reference, so it does not touch what the clean uses, and a fix on the host or
// of its key takes effect within maxCleanBackoff anyway.
func (ds *debts) pay(ctx context.Context, rec *berthv1.Allocation) (reconcile.Result, error) {
	var paid []berthv1.Debt
	var failures []failedClean
	now := ds.now()
	var wait time.Duration // until the soonest debt not yet due
	for _, d := range rec.Status.Debts {
		if gone, err := ds.strategies.vmGone(ctx, d.HostLogin); err != nil {
			return reconcile.Result{}, err
		} else if gone {
			paid = append(paid, d) // the VM went with the user on it
			continue
		}
		j := job(rec, d.HostLogin, d.BuildUser)
		if left := ds.retries.Wait(j.ID, "", d.RetryAt.Get(), now); left > 0 {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		out := ds.provisioner.Clean(ctx, j)
		switch {
		case !out.Done:
		case out.Err != nil:
			ds.provisioner.Forget(j.ID)
			failures = append(failures, failedClean{debt: d, err: out.Err})
		default:
			paid = append(paid, d)
		}
	}
	if len(paid) == 0 && len(failures) == 0 {
		if len(rec.Status.Debts) == 0 && rec.Status.Phase == berthv1.PhaseCleaning {
			return reconcile.Result{}, ds.records.drop(ctx, rec)
		}
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	next := rec.DeepCopy()
	var retry time.Duration
	var retryAt time.Time
	if len(failures) > 0 {
		first := failures[0]
		next.Status.CleanFailures++
		next.Status.Message = fmt.Sprintf("removing build user %s from host %s failed: %v", first.debt.BuildUser, first.debt.Host, first.err)
		retry = cleanBackoff(next.Status.CleanFailures)
		retryAt = now.Add(retry)
		for i := range next.Status.Debts {
			d := &next.Status.Debts[i]
			if slices.ContainsFunc(failures, func(f failedClean) bool { return sameDebt(f.debt, *d) }) {
				d.RetryAt = microStamp(retryAt)
			}
		}
	} else {
		next.Status.CleanFailures = 0
	}
	if err := ds.settle(ctx, rec, next, paid); err != nil {
		return reconcile.Result{}, err
	}
	for _, f := range failures {
		ds.retries.Set(job(rec, f.debt.HostLogin, f.debt.BuildUser).ID, "", retryAt)
	}
	if len(failures) > 0 {
		host := failures[0].debt.Host
		cleanFailures.WithLabelValues(host).Inc()
		konfluxmetrics.CleanupFailed(rec.Spec.Platform)
		tellRecord(ctx, ds.recorder, rec, host, corev1.EventTypeWarning, "CleanFailed", "%s; retrying in %s", next.Status.Message, retry)
	}
	if ds.cleans != nil {
		for _, d := range paid {
			ds.cleans.Cleaned(ctx, d)
		}
		for _, f := range failures {
			ds.cleans.CleanFailed(ctx, rec, f.debt, f.err, next.Status.CleanFailures, retry)
		}
	}
	if wait > 0 && (retry == 0 || wait < retry) {
		retry = wait
	}
	return reconcile.Result{RequeueAfter: retry}, nil
}

// retryHost makes the cleans owed to host due now, whatever their backoff: the host passed its
// check after failing, so they will likely pass, and it takes no builds until they did. Its
// caller wakes the records' tasks. Records are read from the cache: one it does not show yet
// owes nothing that failed since this process started, which the map holds already.
func (ds *debts) retryHost(ctx context.Context, host string) error {
	var list berthv1.AllocationList
	if err := ds.client.List(ctx, &list, client.InNamespace(ds.namespace)); err != nil {
		return fmt.Errorf("listing the records owing host %s a clean: %w", host, err)
	}
	now := ds.now()
	for i := range list.Items {
		rec := &list.Items[i]
		for _, d := range rec.Status.Debts {
			if d.Host == host {
				ds.retries.Set(job(rec, d.HostLogin, d.BuildUser).ID, "", now)
			}
		}
	}
	return nil
}

func sameDebt(a, b berthv1.Debt) bool { return a.BuildUser == b.BuildUser && a.Host == b.Host }

// settle records that the debts in settled are no longer owed (paid, or forgotten): next,
// rec's update, is written without them, or the record goes when its task has ended and it owes
// nothing more. Then their jobs are forgotten and the slots they held freed.
func (ds *debts) settle(ctx context.Context, rec, next *berthv1.Allocation, settled []berthv1.Debt) error {
	next.Status.Debts = slices.DeleteFunc(next.Status.Debts, func(d berthv1.Debt) bool {
		return slices.ContainsFunc(settled, func(p berthv1.Debt) bool { return sameDebt(p, d) })
	})
	for _, d := range settled {
		if d.HoldsSlot {
			if err := ds.strategies.of(rec).releasing(ctx, d.Host); err != nil {
				return err
			}
		}
	}
	var err error
	if len(next.Status.Debts) == 0 && next.Status.Phase == berthv1.PhaseCleaning {
		err = ds.records.drop(ctx, rec)
	} else {
		err = ds.records.save(ctx, next)
	}
	if err != nil {
		return err
	}
	for _, d := range settled {
		id := job(rec, d.HostLogin, d.BuildUser).ID
		ds.provisioner.Forget(id)
		ds.retries.Forget(id)
		if d.HoldsSlot {
			ds.capacity.Release(debtTask(rec, d.BuildUser))
		}
	}
	return nil
}

// forgetHost drops every build user owed to the host and frees the slots they held.
func (ds *debts) forgetHost(ctx context.Context, host string) error {
	var list berthv1.AllocationList
	if err := ds.client.List(ctx, &list, client.InNamespace(ds.namespace)); err != nil {
		return err
	}
	for i := range list.Items {
		rec := &list.Items[i]
		var dropped []berthv1.Debt
		for _, d := range rec.Status.Debts {
			if d.Host == host {
				dropped = append(dropped, d)
			}
		}
		if len(dropped) == 0 {
			continue
		}
		if err := ds.settle(ctx, rec, rec.DeepCopy(), dropped); err != nil {
			return err
		}
		for _, d := range dropped {
			tellRecord(ctx, ds.recorder, rec, d.Host, corev1.EventTypeWarning, "DebtForgotten",
				"build user %s of %s is no longer removed from host %s: the host is gone or was forgotten; if it comes back, remove the user by hand", d.BuildUser, rec.Spec.TaskRun.Key(), d.Host)
		}
	}
	return nil
}

// maxCleanBackoff is the longest wait between two tries of a failing clean.
const maxCleanBackoff = 5 * time.Minute

// cleanBackoff spaces out retries of a failing clean: 1s, 2s, 4s, … up to maxCleanBackoff.
func cleanBackoff(failures int) time.Duration {
	d := time.Second << min(failures-1, 9)
	return min(d, maxCleanBackoff)
}

// ForgetHost drops every build user owed to the host and frees the slots they held: for a host
// gone for good (forgotten by an operator, or a VM berth terminated).
func (r *Reconciler) ForgetHost(ctx context.Context, host string) error {
	return r.debts.forgetHost(ctx, host)
}

// RetryCleans makes the cleans owed to a host that is reachable again due now, whatever their
// backoff (see debts.retryHost).
func (r *Reconciler) RetryCleans(ctx context.Context, host string) error {
	return r.debts.retryHost(ctx, host)
}
