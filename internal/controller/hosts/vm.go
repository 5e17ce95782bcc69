package hosts

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/incident"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
	"github.com/berth-ci/berth/internal/retryable"
	"github.com/berth-ci/berth/internal/warning"
)

// maxLaunchAttempts bounds relaunches of one record after its instance was lost.
const maxLaunchAttempts = 3

// vmLoop walks one VM record through its phases (launching, booting, ready, terminating),
// asking the cloud and writing what it answered into the record.
type vmLoop struct {
	client       client.Client
	config       *hostconfig.Store
	capacity     *capacity.Capacity
	recorder     events.EventRecorder
	debts        Debts
	prober       Prober
	providers    *providers
	installation *installation
	trouble      *troubles
	readyVMs     *readyVMs
	now          func() time.Time
	// kick asks the planner for a pass soon.
	kick func()
	// retries holds, per VM record (by name, tagged with its UID and phase), when this
	// process asks the cloud again after a failed launch or terminate; the record's RetryAt is
	// what a restart goes by. One entry per VM whose last call failed, dropped when its phase
	// moves on or its record goes.
	retries retryable.Retries
}

// reconcile walks a VM's record (one with an instance section) through its phases.
func (v *vmLoop) reconcile(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	if rec.Status.Instance == nil {
		rec.Status.Instance = &berthv1.InstanceStatus{}
	}
	switch rec.Status.Instance.Phase {
	case berthv1.InstanceLaunching, "":
		return v.launch(ctx, rec)
	case berthv1.InstanceBooting:
		return v.boot(ctx, rec)
	case berthv1.InstanceReady:
		return v.ready(ctx, rec)
	case berthv1.InstanceTerminating:
		return v.terminate(ctx, rec)
	}
	return reconcile.Result{}, nil
}

// Token is the idempotency token of the record's current launch attempt: its UID and attempt,
// and the fallback instance type it asks for, if any (so each type is asked under a token of
// its own; records from before fallbacks keep their token).
func Token(rec *berthv1.BuildHost) string {
	token := fmt.Sprintf("%s-%d", rec.UID, rec.Spec.Instance.Attempt)
	if f := rec.Spec.Instance.Fallback; f > 0 {
		token += fmt.Sprintf("-f%d", f)
	}
	return token
}

// launch asks the cloud for the VM. The token makes a repeated call (after a crash before the
// instance id was saved, or a lost answer) return the same instance.
func (v *vmLoop) launch(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	in := rec.Spec.Instance
	if rec.Spec.Instance.Retire != "" {
		return v.startTerminating(ctx, rec, rec.Spec.Instance.Retire)
	}
	if left := v.retryIn(rec, berthv1.InstanceLaunching); left > 0 {
		return reconcile.Result{RequeueAfter: left}, nil
	}
	p, err := v.providers.of(rec)
	if err != nil {
		return v.launchFailed(ctx, rec, err)
	}
	installation, err := v.installation.id(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	types := cloud.InstanceTypes(p)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: Token(rec), Name: rec.Name, Tags: v.providers.tags(installation, in.Platform, rec.Name), Fallback: in.Fallback})
	if err != nil {
		if cloud.KindOf(err) == cloud.Capacity && len(types) > 1 {
			return v.fallBack(ctx, rec, types, err)
		}
		return v.launchFailed(ctx, rec, err)
	}
	next := rec.DeepCopy()
	next.Status.Instance.ID, next.Status.Instance.Phase = inst.ID, berthv1.InstanceBooting
	if len(types) > 1 && in.Fallback < len(types) {
		next.Status.Instance.InstanceType = types[in.Fallback]
	}
	next.Status.Instance.LaunchedAt = v.stamp()
	next.Status.Instance.Failures, next.Status.Instance.RetryAt, next.Status.Instance.Message = 0, nil, ""
	next.Status.Platform = in.Platform
	if err := v.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err // the next attempt gets the same instance by the token
	}
	v.retries.Forget(rec.Name)
	v.trouble.clear(in.Platform)
	launches.WithLabelValues(in.Platform, "launched").Inc()
	v.event(next, corev1.EventTypeNormal, "Launched", "instance %s launched for platform %s", inst.ID, in.Platform)
	return v.boot(ctx, next)
}

// fallBack moves a launch the cloud had no capacity for to the platform's next instance type,
// at once, under a token of its own: the choice goes into the spec first, so a crash never
// asks twice under one token with two types. After the last type it goes back to the first
// and waits out the usual backoff (launchFailed), as a platform without fallbacks does.
func (v *vmLoop) fallBack(ctx context.Context, rec *berthv1.BuildHost, types []string, cause error) (reconcile.Result, error) {
	in := rec.Spec.Instance
	next := rec.DeepCopy()
	next.Spec.Instance.Fallback = (in.Fallback + 1) % len(types)
	if err := v.client.Update(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	next.Status = *rec.Status.DeepCopy() // the update answers with the stored status, maybe none yet
	if next.Spec.Instance.Fallback == 0 {
		return v.launchFailed(ctx, next, cause)
	}
	v.warn(next, "LaunchFallback", "instance type %s had no capacity for platform %s (%v); launching %s, the next of its fallback-instance-types",
		types[in.Fallback], in.Platform, cause, types[next.Spec.Instance.Fallback])
	fallbacks.WithLabelValues(in.Platform).Inc()
	return v.launch(ctx, next)
}

// launchFailed retries what may pass (capacity, throttling, a network error) with backoff,
// until the platform's allocation timeout; the record goes at once when the cloud refused for
// good (bad settings or credentials). Waiting tasks learn either way (see Unservable). The
// retry waits for the record's RetryAt (see retryIn): the failure's own status write brings
// the record back at once, and so does any other event of it.
func (v *vmLoop) launchFailed(ctx context.Context, rec *berthv1.BuildHost, cause error) (reconcile.Result, error) {
	in := rec.Spec.Instance
	// The tenants waiting on the platform learn only the kind of failure and ref; cause,
	// with the cloud's own answer, goes to this record's Events and the log under ref.
	ref := incident.NewRef()
	if d := dynamic(v.config, config.Platform(in.Platform)); d != nil && !outdated(in, d) {
		// A launch with settings the platform no longer has says nothing about the new ones.
		ref = v.trouble.note(in.Platform, cause)
	}
	_, limit, _ := v.timing(in.Platform)
	if cloud.KindOf(cause).Permanent() || v.now().Sub(rec.CreationTimestamp.Time) > limit {
		v.warn(rec, "LaunchFailed", "giving up on launching a VM for platform %s (%s): %v", in.Platform, ref, cause)
		// A transient failure may still have made an instance under the token: the sweeper
		// terminates it once it finds no record for it.
		return reconcile.Result{}, v.deleteRecord(ctx, rec)
	}
	next := rec.DeepCopy()
	next.Status.Instance.Phase = berthv1.InstanceLaunching // shown while the launch is retried
	next.Status.Instance.Failures++
	next.Status.Instance.Message = cause.Error()
	retry := v.failed(next, berthv1.InstanceLaunching, cause)
	if err := v.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	v.warn(next, "LaunchRetry", "launching a VM for platform %s failed (%s: %s); retrying in %s", in.Platform, ref, cause, retry)
	return reconcile.Result{RequeueAfter: retry}, nil
}

// backoff spaces out retries: 1s, 2s, 4s, … up to a minute, or what the cloud asked for.
func backoff(failures int, asked time.Duration) time.Duration {
	d := min(time.Second<<min(failures-1, 6), time.Minute)
	return max(d, asked)
}

// failed sets next's RetryAt after the cloud failed its call of phase (next already counts
// the failure) and returns the wait. This process keeps it too, before next is written: the
// call was made whether or not the write lands (it conflicts when the spec was updated
// meanwhile), and the error's retry must not ask the cloud again at once.
func (v *vmLoop) failed(next *berthv1.BuildHost, phase berthv1.InstancePhase, cause error) time.Duration {
	retry := backoff(next.Status.Instance.Failures, cloud.RetryAfterOf(cause))
	at := v.now().Add(retry)
	stamp := berthv1.NewMicroTime(at)
	next.Status.Instance.RetryAt = &stamp
	v.retries.Set(next.Name, retryTag(next, phase), at)
	return retry
}

// retryIn is how long the failed cloud call of rec's phase still waits, 0 once it is due (or
// none failed).
func (v *vmLoop) retryIn(rec *berthv1.BuildHost, phase berthv1.InstancePhase) time.Duration {
	var recorded time.Time
	if st := rec.Status.Instance; st != nil {
		recorded = st.RetryAt.Get()
	}
	return v.retries.Wait(rec.Name, retryTag(rec, phase), recorded, v.now())
}

// retryTag tells a retry of rec's phase from one of an earlier record of its name or of
// another phase.
func retryTag(rec *berthv1.BuildHost, phase berthv1.InstancePhase) string {
	return string(rec.UID) + "/" + string(phase)
}

// forget drops what this process kept of the record name, which is gone.
func (v *vmLoop) forget(name string) {
	v.retries.Forget(name)
}

// boot waits for the instance's address and for SSH, and pins the host key at first contact.
func (v *vmLoop) boot(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	in, st := rec.Spec.Instance, rec.Status.Instance
	if in.Retire != "" {
		return v.startTerminating(ctx, rec, in.Retire)
	}
	interval, limit, hostKey := v.timing(in.Platform)
	// A record launched before it kept the launch time (or edited by hand) counts from its
	// creation.
	launched := rec.CreationTimestamp.Time
	if st.LaunchedAt != nil {
		launched = st.LaunchedAt.Time
	}
	overdue := v.now().Sub(launched) > limit
	p, err := v.providers.of(rec)
	if err != nil {
		return reconcile.Result{}, err
	}
	inst, err := p.Get(ctx, st.ID)
	switch {
	case err == nil && inst.State == cloud.StateStopped:
		return v.stopped(ctx, rec, "while it booted")
	case cloud.KindOf(err) == cloud.NotFound || (err == nil && inst.State == cloud.StateGone):
		return v.relaunch(ctx, rec, fmt.Sprintf("instance %s was lost while it booted", st.ID))
	case err != nil && overdue:
		// A cloud that keeps failing to answer must not keep the VM, and its place under
		// max-instances, booting for good.
		return v.bootFailed(ctx, rec, fmt.Sprintf("the cloud did not tell its state within the allocation timeout (%s): %v", limit, err))
	case err != nil:
		return reconcile.Result{RequeueAfter: backoff(1, cloud.RetryAfterOf(err))}, nil
	}
	if inst.State != cloud.StateRunning || inst.Address == "" {
		if overdue {
			return v.bootFailed(ctx, rec, fmt.Sprintf("it did not start within the allocation timeout (%s)", limit))
		}
		return reconcile.Result{RequeueAfter: interval}, nil
	}
	probe := rec.DeepCopy()
	probe.Status.Address, probe.Status.Instance.HostKey = inst.Address, hostKey
	key, err := v.prober.FirstContact(ctx, loginOf(probe))
	if err != nil {
		if overdue {
			return v.bootFailed(ctx, rec, fmt.Sprintf("berth could not log in within the allocation timeout (%s): %v", limit, err))
		}
		next := rec.DeepCopy()
		next.Status.Instance.Message = "waiting for SSH: " + err.Error()
		if next.Status.Instance.Message != st.Message {
			if err := v.writeStatus(ctx, next); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{RequeueAfter: interval}, nil
	}
	next := probe
	next.Status.Instance.HostKey, next.Status.Instance.Phase = key, berthv1.InstanceReady
	next.Status.Instance.ReadyAt, next.Status.Instance.Message = v.stamp(), ""
	if err := v.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	bootSeconds.WithLabelValues(in.Platform).Observe(next.Status.Instance.ReadyAt.Sub(launched).Seconds())
	v.event(next, corev1.EventTypeNormal, "Ready", "instance %s at %s is ready for platform %s", st.ID, inst.Address, in.Platform)
	return v.ready(ctx, next)
}

// bootFailed ends a VM that did not come up within the platform's allocation timeout. It is
// counted once, when the decision is recorded: a pass that finds it recorded already goes to
// startTerminating at the top of boot, not here.
func (v *vmLoop) bootFailed(ctx context.Context, rec *berthv1.BuildHost, why string) (reconcile.Result, error) {
	next := rec.DeepCopy()
	next.Spec.Instance.Retire = why
	if err := v.client.Update(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	next.Status = *rec.Status.DeepCopy() // the update answers with the stored status
	konfluxmetrics.ProvisioningFailed(rec.Spec.Instance.Platform)
	return v.startTerminating(ctx, next, why)
}

// relaunch gives up on an instance the cloud lost and launches anew under a new token. The
// new attempt goes into the spec first, so the cloud never hears a token the record does not
// hold; then the status forgets the lost instance. A crash between the two writes leaves the
// lost instance in the status: the next pass finds it lost again and moves on to the attempt
// after, one attempt spent and nothing launched twice.
func (v *vmLoop) relaunch(ctx context.Context, rec *berthv1.BuildHost, why string) (reconcile.Result, error) {
	v.warn(rec, "InstanceLost", "%s", why)
	lost.WithLabelValues(rec.Spec.Instance.Platform).Inc()
	if rec.Spec.Instance.Attempt >= maxLaunchAttempts {
		return reconcile.Result{}, v.deleteRecord(ctx, rec)
	}
	next := rec.DeepCopy()
	next.Spec.Instance.Attempt++
	if err := v.client.Update(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	next.Status.Instance = &berthv1.InstanceStatus{Phase: berthv1.InstanceLaunching, Message: why}
	if err := v.writeStatus(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	return v.launch(ctx, next)
}

// stopped ends a VM someone stopped (in the console, with another tool, or the cloud on an
// interruption that stops rather than terminates). A stopped VM serves no task, yet its cloud
// keeps it and its volumes, and bills them, until it is terminated; nobody but berth knows it
// is berth's to end. It counts as lost, and it is terminated as any retired VM is: the
// decision goes into the spec first, so a crash or a refused Terminate is retried from the
// record, never forgotten. The planner launches anew for the tasks still waiting.
func (v *vmLoop) stopped(ctx context.Context, rec *berthv1.BuildHost, when string) (reconcile.Result, error) {
	platform := rec.Spec.Instance.Platform
	why := fmt.Sprintf("instance %s was stopped %s; a stopped VM serves no task and is still billed", rec.Status.Instance.ID, when)
	v.warn(rec, "InstanceStopped", "%s: terminating it", why)
	lost.WithLabelValues(platform).Inc()
	return v.startTerminating(ctx, rec, why)
}

// ready keeps a ready VM in the ledger, and notices when the cloud has lost it.
func (v *vmLoop) ready(ctx context.Context, rec *berthv1.BuildHost) (reconcile.Result, error) {
	in := rec.Spec.Instance
	v.readyVMs.open(rec)
	interval, _, _ := v.timing(in.Platform)
	p, err := v.providers.of(rec)
	if err != nil {
		return reconcile.Result{RequeueAfter: interval}, nil
	}
	inst, err := p.Get(ctx, rec.Status.Instance.ID)
	if err == nil && inst.State == cloud.StateStopped {
		return v.stopped(ctx, rec, "while it was ready")
	}
	if cloud.KindOf(err) == cloud.NotFound || (err == nil && inst.State == cloud.StateGone) {
		v.warn(rec, "InstanceLost", "instance %s of platform %s is gone from the cloud; its tasks fail and nothing is owed to it any more", rec.Status.Instance.ID, in.Platform)
		lost.WithLabelValues(in.Platform).Inc()
		v.capacity.RetireHost(rec.Name)
		return reconcile.Result{}, v.finishTermination(ctx, rec)
	}
	// A drain, undrain or retirement changed the spec since the status was written.
	next := rec.DeepCopy()
	next.SetConditions(v.now())
	if !equality.Semantic.DeepEqual(next.Status, rec.Status) {
		if err := v.client.Status().Update(ctx, next); err != nil {
			if apierrors.IsConflict(err) {
				return reconcile.Result{RequeueAfter: time.Second}, nil // written meanwhile: its event brings it back
			}
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	return reconcile.Result{RequeueAfter: interval}, nil
}

// writeStatus writes the status of a VM's record, its conditions first brought in line with
// the rest (see BuildHost.SetConditions). It writes nothing of the spec.
func (v *vmLoop) writeStatus(ctx context.Context, rec *berthv1.BuildHost) error {
	rec.SetConditions(v.now())
	return v.client.Status().Update(ctx, rec)
}

func (v *vmLoop) stamp() *berthv1.MicroTime {
	t := berthv1.NewMicroTime(v.now())
	return &t
}

// timing is the platform's check interval, allocation timeout and configured host key; the
// defaults for a platform no longer in the config, whose VMs are still walked to their end.
func (v *vmLoop) timing(platform string) (interval, timeout time.Duration, hostKey string) {
	if d := dynamic(v.config, config.Platform(platform)); d != nil {
		return d.CheckInterval, d.AllocationTimeout, d.HostKey
	}
	return time.Duration(config.DefaultCheckInterval) * time.Second, time.Duration(config.DefaultAllocationTimeout) * time.Second, ""
}

// event tells the operator of a VM's step: an Event on its BuildHost and a log line with the
// VM, its platform and instance (a warning line for a Warning; see package warning).
func (v *vmLoop) event(rec *berthv1.BuildHost, eventType, reason, format string, args ...any) {
	v.recorder.Eventf(rec, nil, eventType, reason, reason, "%s", incident.Note(fmt.Sprintf(format, args...)))
	log := vmLog.WithValues("host", rec.Name, "platform", rec.Spec.Instance.Platform, "reason", reason)
	if st := rec.Status.Instance; st != nil && st.ID != "" {
		log = log.WithValues("instance", st.ID)
	}
	if eventType == corev1.EventTypeWarning {
		warning.Log(log, fmt.Sprintf(format, args...))
		return
	}
	log.Info(fmt.Sprintf(format, args...))
}

var vmLog = ctrl.Log.WithName("vm")

func (v *vmLoop) warn(rec *berthv1.BuildHost, reason, format string, args ...any) {
	v.event(rec, corev1.EventTypeWarning, reason, format, args...)
}
