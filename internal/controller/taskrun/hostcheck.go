package taskrun

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
)

// HostChecks checks every static host each Interval through the provisioner and keeps its
// BuildHost record: a failed check quarantines the host; a passing one lifts the quarantine once
// the build users still owed to the host are gone, and retries those cleanups at once. It runs
// on the leader only.
type HostChecks struct {
	Reconciler *Reconciler
	Interval   time.Duration
	// Timeout bounds one host's check.
	Timeout time.Duration
}

// NeedLeaderElection: two replicas must not check every host twice.
func (h *HostChecks) NeedLeaderElection() bool { return true }

// Start checks at once, then every Interval, until ctx ends.
func (h *HostChecks) Start(ctx context.Context) error {
	if h.Interval <= 0 {
		return nil
	}
	log := logr.FromContextOrDiscard(ctx).WithName("host-checks")
	ticker := time.NewTicker(h.Interval)
	defer ticker.Stop()
	for {
		if err := h.checkAll(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "checking hosts")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (h *HostChecks) checkAll(ctx context.Context) error {
	r := h.Reconciler
	cfg := r.Config.Config()
	if cfg == nil {
		return nil
	}
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(cfg.Hosts))
	slots := make(chan struct{}, 8)
	for _, host := range cfg.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			health := r.Provisioner.Check(cctx, loginOf(host))
			cancel()
			if err := r.recordHealth(ctx, host, health.Healthy, health.Reason); err != nil {
				errs <- fmt.Errorf("host %s: %w", host.Name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// recordHealth writes a check's outcome into the host's record and the ledger.
func (r *Reconciler) recordHealth(ctx context.Context, host *config.StaticHost, healthy bool, reason string) error {
	bh, err := r.buildHost(ctx, host)
	if err != nil {
		return err
	}
	owed, err := r.owedTo(ctx, host.Name)
	if err != nil {
		return err
	}
	next := bh.DeepCopy()
	next.Status.Platform, next.Status.Address = string(host.Platform), host.Address
	next.Status.LastCheck = r.stamp()
	next.Status.PendingCleans = len(owed)
	switch {
	case !healthy:
		next.Status.Quarantined, next.Status.QuarantineReason = true, reason
	case len(owed) > 0 && bh.Status.Quarantined:
		// Reachable again: its dirty slots are cleaned before it takes new builds.
		next.Status.QuarantineReason = fmt.Sprintf("reachable again; %d build user(s) still to be removed before it takes builds", len(owed))
		for _, key := range owed {
			r.Notify(key)
		}
	default:
		next.Status.Quarantined, next.Status.QuarantineReason = false, ""
	}
	if err := r.Client.Update(ctx, next); err != nil {
		return err
	}
	switch {
	case next.Status.Quarantined && !bh.Status.Quarantined:
		r.Recorder.Eventf(next, nil, corev1.EventTypeWarning, "HostQuarantined", "Check", "host %s takes no new builds until a check passes: %s", host.Name, reason)
	case !next.Status.Quarantined && bh.Status.Quarantined:
		r.Recorder.Eventf(next, nil, corev1.EventTypeNormal, "HostHealthy", "Check", "host %s passed its check and takes builds again", host.Name)
	}
	r.syncHost(next)
	return nil
}

// quarantineForCleans takes a host out of service whose cleanups keep failing.
func (r *Reconciler) quarantineForCleans(ctx context.Context, hostName, why string) {
	var bh berthv1.BuildHost
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: berthv1.BuildHostName(hostName)}, &bh); err != nil {
		host := r.Config.Host(hostName)
		if host == nil {
			return
		}
		created, err := r.buildHost(ctx, host)
		if err != nil {
			return
		}
		bh = *created
	}
	if bh.Status.Quarantined {
		return
	}
	bh.Status.Quarantined, bh.Status.QuarantineReason = true, "cleanups keep failing: "+why
	if err := r.Client.Update(ctx, &bh); err != nil {
		return
	}
	r.Recorder.Eventf(&bh, nil, corev1.EventTypeWarning, "HostQuarantined", "Clean", "host %s takes no new builds until a check passes and its build users are removed: %s", hostName, why)
	r.syncHost(&bh)
}

// owedTo lists the TaskRun keys (namespace/name) of records owing the host a cleanup.
func (r *Reconciler) owedTo(ctx context.Context, host string) ([]string, error) {
	var list berthv1.AllocationList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Namespace)); err != nil {
		return nil, err
	}
	var keys []string
	for _, rec := range list.Items {
		for _, d := range rec.Status.Debts {
			if d.Host == host {
				keys = append(keys, rec.Spec.TaskRun.Key())
			}
		}
	}
	return keys, nil
}

// buildHost reads the host's record, creating it on first sight.
func (r *Reconciler) buildHost(ctx context.Context, host *config.StaticHost) (*berthv1.BuildHost, error) {
	var bh berthv1.BuildHost
	key := client.ObjectKey{Namespace: r.Namespace, Name: berthv1.BuildHostName(host.Name)}
	err := r.Client.Get(ctx, key, &bh)
	if err == nil {
		return &bh, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	bh = berthv1.BuildHost{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: r.Namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "berth"}},
		Spec:       berthv1.BuildHostSpec{HostName: host.Name},
		Status:     berthv1.BuildHostStatus{Platform: string(host.Platform), Address: host.Address},
	}
	if err := r.Client.Create(ctx, &bh); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return &bh, r.APIReader.Get(ctx, key, &bh)
		}
		return nil, err
	}
	return &bh, nil
}

// syncHost tells the ledger whether the host takes new builds.
func (r *Reconciler) syncHost(bh *berthv1.BuildHost) {
	r.wake(r.Ledger.Quarantine(bh.Spec.HostName, bh.Spec.Drained || bh.Status.Quarantined))
}

// HostRecords applies what operators do to BuildHost records (drain, undrain, forget).
type HostRecords struct{ Reconciler *Reconciler }

// Reconcile syncs one BuildHost into the ledger, and carries out a forget.
func (h *HostRecords) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r := h.Reconciler
	if done, err := r.restoreOnce(ctx); !done || err != nil {
		return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, err
	}
	var bh berthv1.BuildHost
	if err := r.Client.Get(ctx, req.NamespacedName, &bh); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if bh.Spec.Forget {
		return reconcile.Result{}, r.forgetHost(ctx, &bh)
	}
	r.syncHost(&bh)
	return reconcile.Result{}, nil
}

// forgetHost drops every build user owed to the host, frees their slots, and leaves the host
// drained: for a host that is gone for good.
func (r *Reconciler) forgetHost(ctx context.Context, bh *berthv1.BuildHost) error {
	var list berthv1.AllocationList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Namespace)); err != nil {
		return err
	}
	for i := range list.Items {
		rec := &list.Items[i]
		var dropped []berthv1.Debt
		next := rec.DeepCopy()
		next.Status.Debts = next.Status.Debts[:0]
		for _, d := range rec.Status.Debts {
			if d.Host == bh.Spec.HostName {
				dropped = append(dropped, d)
			} else {
				next.Status.Debts = append(next.Status.Debts, d)
			}
		}
		if len(dropped) == 0 {
			continue
		}
		var err error
		if len(next.Status.Debts) == 0 && next.Status.Phase == berthv1.PhaseCleaning {
			err = r.drop(ctx, rec)
		} else {
			err = r.save(ctx, next)
		}
		if err != nil {
			return err
		}
		for _, d := range dropped {
			r.Provisioner.Forget(job(rec, d.HostLogin, d.BuildUser).ID)
			if d.HoldsSlot {
				r.wake(r.Ledger.Release(debtTask(rec, d.BuildUser)))
			}
			r.Recorder.Eventf(bh, nil, corev1.EventTypeWarning, "DebtForgotten", "Forget",
				"build user %s of %s is no longer removed from host %s: the host was forgotten; if it comes back, remove the user by hand", d.BuildUser, rec.Spec.TaskRun.Key(), d.Host)
		}
	}
	next := bh.DeepCopy()
	next.Spec.Forget, next.Spec.Drained, next.Status.PendingCleans = false, true, 0
	if err := r.Client.Update(ctx, next); err != nil {
		return err
	}
	r.syncHost(next)
	return nil
}
