package vms

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/incident"
)

// maxLaunchAttempts bounds relaunches of one record after its instance was lost.
const maxLaunchAttempts = 3

// Reconcile walks one VM record through its phases.
func (f *Fleet) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// Nothing is decided before the config is read: until then every platform looks
	// unconfigured, and a record being launched would be given up (deleted, its instance
	// left to the sweeper) as if the cloud had refused its settings for good.
	if !f.Config.Synced() {
		return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, nil
	}
	var rec berthv1.BuildHost
	if err := f.Client.Get(ctx, req.NamespacedName, &rec); err != nil {
		if client.IgnoreNotFound(err) == nil {
			f.dropLogin(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if rec.Spec.Instance == nil {
		return reconcile.Result{}, nil
	}
	if rec.Status.Instance == nil {
		rec.Status.Instance = &berthv1.InstanceStatus{}
	}
	switch rec.Status.Instance.Phase {
	case berthv1.InstanceLaunching, "":
		return f.launch(ctx, &rec)
	case berthv1.InstanceBooting:
		return f.boot(ctx, &rec)
	case berthv1.InstanceReady:
		return f.ready(ctx, &rec)
	case berthv1.InstanceTerminating:
		return f.terminate(ctx, &rec)
	}
	return reconcile.Result{}, nil
}

// Token is the idempotency token of the record's current launch attempt.
func Token(rec *berthv1.BuildHost) string {
	return fmt.Sprintf("%s-%d", rec.UID, rec.Spec.Instance.Attempt)
}

// launch asks the cloud for the VM. The token makes a repeated call (after a crash before the
// instance id was saved, or a lost answer) return the same instance.
func (f *Fleet) launch(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	in := rec.Spec.Instance
	if rec.Spec.Instance.Retire != "" {
		return f.startTerminating(ctx, rec, rec.Spec.Instance.Retire)
	}
	p, err := f.providerOf(rec)
	if err != nil {
		return f.launchFailed(ctx, rec, err)
	}
	installation, err := f.installationID(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: Token(rec), Name: rec.Name, Tags: f.tags(installation, in.Platform, rec.Name)})
	if err != nil {
		return f.launchFailed(ctx, rec, err)
	}
	next := rec.DeepCopy()
	next.Status.Instance.ID, next.Status.Instance.Phase = inst.ID, berthv1.InstanceBooting
	next.Status.Instance.LaunchedAt = f.stamp()
	next.Status.Instance.Failures, next.Status.Instance.Message = 0, ""
	next.Status.Platform = in.Platform
	if err := f.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err // the next attempt gets the same instance by the token
	}
	f.clearTrouble(in.Platform)
	launches.WithLabelValues(in.Platform, "launched").Inc()
	f.event(next, corev1.EventTypeNormal, "Launched", "instance %s launched for platform %s", inst.ID, in.Platform)
	return f.boot(ctx, next)
}

// launchFailed retries what may pass (capacity, throttling, a network error) with backoff,
// until the platform's allocation timeout; the record goes at once when the cloud refused for
// good (bad settings or credentials). Waiting tasks learn either way (see Unservable).
func (f *Fleet) launchFailed(ctx context.Context, rec *berthv1.BuildHost, cause error) (reconcile.Result, error) {
	in := rec.Spec.Instance
	// The tenants waiting on the platform learn only the kind of failure and ref; cause,
	// with the cloud's own answer, goes to this record's Events and the log under ref.
	ref := incident.NewRef()
	if d := f.dynamic(config.Platform(in.Platform)); d != nil && !outdated(in, d) {
		// A launch with settings the platform no longer has says nothing about the new ones.
		ref = f.noteTrouble(in.Platform, cause)
	}
	_, limit, _ := f.timing(in.Platform)
	if cloud.KindOf(cause).Permanent() || f.now().Sub(rec.CreationTimestamp.Time) > limit {
		f.warn(rec, "LaunchFailed", "giving up on launching a VM for platform %s (%s): %v", in.Platform, ref, cause)
		// A transient failure may still have made an instance under the token: the sweeper
		// terminates it once it finds no record for it.
		return reconcile.Result{}, f.deleteRecord(ctx, rec)
	}
	next := rec.DeepCopy()
	next.Status.Instance.Failures++
	next.Status.Instance.Message = cause.Error()
	if err := f.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	retry := backoff(next.Status.Instance.Failures, cloud.RetryAfterOf(cause))
	f.warn(next, "LaunchRetry", "launching a VM for platform %s failed (%s: %s); retrying in %s", in.Platform, ref, cause, retry)
	return reconcile.Result{RequeueAfter: retry}, nil
}

// backoff spaces out retries: 1s, 2s, 4s, … up to a minute, or what the cloud asked for.
func backoff(failures int, asked time.Duration) time.Duration {
	d := min(time.Second<<min(failures-1, 6), time.Minute)
	return max(d, asked)
}

// boot waits for the instance's address and for SSH, and pins the host key at first contact.
func (f *Fleet) boot(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	in, st := rec.Spec.Instance, rec.Status.Instance
	if in.Retire != "" {
		return f.startTerminating(ctx, rec, in.Retire)
	}
	interval, limit, hostKey := f.timing(in.Platform)
	p, err := f.providerOf(rec)
	if err != nil {
		return reconcile.Result{RequeueAfter: interval}, err
	}
	inst, err := p.Get(ctx, st.ID)
	switch {
	case cloud.KindOf(err) == cloud.NotFound || (err == nil && inst.State == cloud.StateGone):
		return f.relaunch(ctx, rec, fmt.Sprintf("instance %s was lost while it booted", st.ID))
	case err != nil:
		return reconcile.Result{RequeueAfter: backoff(1, cloud.RetryAfterOf(err))}, nil
	}
	overdue := f.now().Sub(st.LaunchedAt.Time) > limit
	if inst.State != cloud.StateRunning || inst.Address == "" {
		if overdue {
			return f.startTerminating(ctx, rec, fmt.Sprintf("it did not start within the allocation timeout (%s)", limit))
		}
		return reconcile.Result{RequeueAfter: interval}, nil
	}
	probe := rec.DeepCopy()
	probe.Status.Address, probe.Status.Instance.HostKey = inst.Address, hostKey
	key, err := f.Prober.FirstContact(ctx, loginOf(probe))
	if err != nil {
		if overdue {
			return f.startTerminating(ctx, rec, fmt.Sprintf("berth could not log in within the allocation timeout (%s): %v", limit, err))
		}
		next := rec.DeepCopy()
		next.Status.Instance.Message = "waiting for SSH: " + err.Error()
		if next.Status.Instance.Message != st.Message {
			if err := f.writeStatus(ctx, next); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{RequeueAfter: interval}, nil
	}
	next := probe
	next.Status.Instance.HostKey, next.Status.Instance.Phase = key, berthv1.InstanceReady
	next.Status.Instance.ReadyAt, next.Status.Instance.Message = f.stamp(), ""
	if err := f.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	bootSeconds.WithLabelValues(in.Platform).Observe(next.Status.Instance.ReadyAt.Sub(st.LaunchedAt.Time).Seconds())
	f.event(next, corev1.EventTypeNormal, "Ready", "instance %s at %s is ready for platform %s", st.ID, inst.Address, in.Platform)
	return f.ready(ctx, next)
}

// relaunch gives up on an instance the cloud lost and launches anew under a new token. The
// new attempt goes into the spec first, so the cloud never hears a token the record does not
// hold; then the status forgets the lost instance. A crash between the two writes leaves the
// lost instance in the status: the next pass finds it lost again and moves on to the attempt
// after, one attempt spent and nothing launched twice.
func (f *Fleet) relaunch(ctx context.Context, rec *berthv1.BuildHost, why string) (reconcile.Result, error) {
	f.warn(rec, "InstanceLost", "%s", why)
	lost.WithLabelValues(rec.Spec.Instance.Platform).Inc()
	if rec.Spec.Instance.Attempt >= maxLaunchAttempts {
		return reconcile.Result{}, f.deleteRecord(ctx, rec)
	}
	next := rec.DeepCopy()
	next.Spec.Instance.Attempt++
	if err := f.Client.Update(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	next.Status.Instance = &berthv1.InstanceStatus{Phase: berthv1.InstanceLaunching, Message: why}
	if err := f.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	return f.launch(ctx, next)
}

// ready keeps a ready VM in the ledger, and notices when the cloud has lost it.
func (f *Fleet) ready(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	in := rec.Spec.Instance
	f.open(rec)
	interval, _, _ := f.timing(in.Platform)
	p, err := f.providerOf(rec)
	if err != nil {
		return reconcile.Result{RequeueAfter: interval}, nil
	}
	inst, err := p.Get(ctx, rec.Status.Instance.ID)
	if cloud.KindOf(err) == cloud.NotFound || (err == nil && inst.State == cloud.StateGone) {
		f.warn(rec, "InstanceLost", "instance %s of platform %s is gone from the cloud; its tasks fail and nothing is owed to it any more", rec.Status.Instance.ID, in.Platform)
		lost.WithLabelValues(in.Platform).Inc()
		f.Capacity.RetireHost(rec.Name)
		return reconcile.Result{}, f.finishTermination(ctx, rec)
	}
	// A drain, undrain or retirement changed the spec since the status was written.
	next := rec.DeepCopy()
	next.SetConditions(f.now())
	if !equality.Semantic.DeepEqual(next.Status, rec.Status) {
		if err := f.Client.Status().Update(ctx, next); err != nil {
			if apierrors.IsConflict(err) {
				return reconcile.Result{RequeueAfter: time.Second}, nil // written meanwhile: its event brings it back
			}
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	return reconcile.Result{RequeueAfter: interval}, nil
}

// startTerminating records the decision to end the VM, then ends it. The decision goes into
// the spec first (spec.instance.retire: no task is handed the VM again, whatever happens
// next), then the Terminating phase into the status. A crash between the two writes is
// repaired from the phase the status still shows: launching and booting records that are
// retired come back here, and a ready one is opened retired and terminated by the planner
// once free.
func (f *Fleet) startTerminating(ctx context.Context, rec *berthv1.BuildHost, why string) (reconcile.Result, error) {
	next := rec.DeepCopy()
	if next.Spec.Instance.Retire == "" {
		next.Spec.Instance.Retire = why
		if err := f.Client.Update(ctx, next); err != nil {
			return reconcile.Result{}, err
		}
	}
	f.Capacity.RetireHost(rec.Name)
	if next.Status.Instance == nil {
		next.Status.Instance = &berthv1.InstanceStatus{} // recorded; no status written yet
	}
	next.Status.Instance.Phase = berthv1.InstanceTerminating
	if err := f.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	return f.terminate(ctx, next)
}

// terminate ends the instance (already gone is done) and then drops the record.
func (f *Fleet) terminate(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	in, st := rec.Spec.Instance, rec.Status.Instance
	f.Capacity.RetireHost(rec.Name)
	if st.ID != "" {
		p, err := f.providerOf(rec)
		if err == nil {
			err = p.Terminate(ctx, st.ID)
		}
		if err != nil && cloud.KindOf(err) != cloud.NotFound {
			next := rec.DeepCopy()
			next.Status.Instance.Failures++
			next.Status.Instance.Message = err.Error()
			if uerr := f.writeStatus(ctx, next); uerr != nil {
				return reconcile.Result{}, uerr
			}
			retry := backoff(next.Status.Instance.Failures, cloud.RetryAfterOf(err))
			f.warn(next, "TerminateFailed", "terminating instance %s failed: %v; retrying in %s", st.ID, err, retry)
			return reconcile.Result{RequeueAfter: retry}, nil
		}
		f.event(rec, corev1.EventTypeNormal, "Terminated", "instance %s terminated: %s", st.ID, in.Retire)
		terminations.WithLabelValues(in.Platform).Inc()
	}
	return reconcile.Result{}, f.finishTermination(ctx, rec)
}

// finishTermination forgets what was owed to the VM and drops its record: nothing is left.
func (f *Fleet) finishTermination(ctx context.Context, rec *berthv1.BuildHost) error {
	if err := f.Debts.ForgetHost(ctx, rec.Name); err != nil {
		return err
	}
	if err := f.deleteRecord(ctx, rec); err != nil {
		return err
	}
	f.Capacity.RemoveHost(rec.Name)
	f.dropLogin(rec.Name)
	return nil
}

func (f *Fleet) deleteRecord(ctx context.Context, rec *berthv1.BuildHost) error {
	err := f.Client.Delete(ctx, rec, client.Preconditions{UID: &rec.UID})
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	f.Kick()
	return nil
}

// writeStatus writes the status of a VM's record, its conditions first brought in line with
// the rest (see BuildHost.SetConditions). It writes nothing of the spec.
func (f *Fleet) writeStatus(ctx context.Context, rec *berthv1.BuildHost) error {
	rec.SetConditions(f.now())
	return f.Client.Status().Update(ctx, rec)
}

func (f *Fleet) stamp() *berthv1.MicroTime {
	t := berthv1.NewMicroTime(f.now())
	return &t
}

// timing is the platform's check interval, allocation timeout and configured host key; the
// defaults for a platform no longer in the config, whose VMs are still walked to their end.
func (f *Fleet) timing(platform string) (interval, timeout time.Duration, hostKey string) {
	if d := f.dynamic(config.Platform(platform)); d != nil {
		return d.CheckInterval, d.AllocationTimeout, d.HostKey
	}
	return time.Duration(config.DefaultCheckInterval) * time.Second, time.Duration(config.DefaultAllocationTimeout) * time.Second, ""
}
