package taskrun

// The provision phase: a build user is made on the reserved host and its key handed over in
// the task's secret, which is then guarded until the task ends.

import (
	"context"
	"errors"
	"slices"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
	"github.com/berth-ci/berth/internal/remote"
)

// provision sees the build user's creation through and hands the task its secret.
func (p *provisionPhase) provision(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	v, ok := p.keyring.pending.Load(keyID(rec))
	if !ok {
		// The private key lived only in the process that generated it (a restart, or another
		// replica): the user made with it is of no use. Remove it and start over under a new
		// name; never repair a user.
		return p.redo(ctx, tr, rec, "berth restarted while the build user was being created")
	}
	keys := v.(keyPair)
	j := job(rec, *rec.Status.Login, rec.Status.BuildUser)
	j.AuthorizedKey = keys.authorized
	if cfg := p.config.Config(); cfg != nil {
		j.UIDs = cfg.BuildUIDs
		login := rec.Status.Login
		j.Limits, j.SudoCommands = cfg.ForBuild(login.Host, config.Platform(login.Platform), login.Instance != "")
	}
	out := p.provisioner.Provision(ctx, j)
	if !out.Done {
		return reconcile.Result{}, nil // its end wakes us
	}
	if out.Err != nil {
		p.provisioner.Forget(j.ID)
		p.keyring.pending.Delete(keyID(rec))
		return p.provisioningFailed(ctx, tr, rec, out.Err)
	}
	secret, err := p.keyring.secretFor(ctx, tr, rec, out.UserDir, keys.private)
	if err != nil {
		return reconcile.Result{}, err
	}
	handedOver := seal(secret, rec)
	if err := p.secrets.write(ctx, tr, secret); err != nil {
		return reconcile.Result{}, err
	}
	// The sealed secret is the record of the hand-over: the record itself is not written.
	p.keyring.handed.Store(keyID(rec), handedOver)
	p.keyring.pending.Delete(keyID(rec))
	p.provisioner.Forget(j.ID)
	took := p.now().Sub(rec.Status.ReservedAt.Time)
	allocationSeconds.WithLabelValues(rec.Spec.Platform).Observe(took.Seconds())
	konfluxmetrics.Provisioned(rec.Spec.Platform, took)
	step(ctx, tr.Namespace+"/"+tr.Name, rec.Spec.Platform, rec.Status.Login.Host, "Provisioned", "build user %s ready on host %s", rec.Status.BuildUser, rec.Status.Login.Host)
	return reconcile.Result{}, nil
}

// redo owes the host the current user and provisions a new one on the same slot.
func (p *provisionPhase) redo(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, why string) (reconcile.Result, error) {
	next := rec.DeepCopy()
	next.Status.Debts = append(next.Status.Debts, berthv1.Debt{HostLogin: *rec.Status.Login, BuildUser: rec.Status.BuildUser})
	pair, err := p.keyring.pair(tr.Namespace + "/" + tr.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	next.Status.Attempt++
	next.Status.BuildUser = hostops.UserNameFor(next.Spec.Platform, string(tr.UID), next.Status.Attempt)
	next.Status.Message = why
	if err := p.records.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	p.keyring.pending.Store(keyID(next), pair)
	tell(ctx, p.recorder, tr, rec.Status.Login.Host, corev1.EventTypeNormal, "Reprovisioning", "%s; removing build user %s and creating %s on host %s", why, rec.Status.BuildUser, next.Status.BuildUser, rec.Status.Login.Host)
	var results outcomes
	results.add(reconcile.Result{}, p.keyring.revoke(ctx, next)) // a key kept for the old user before the restart
	results.add(p.provision(ctx, tr, next))
	results.add(p.debts.pay(ctx, next))
	return results.result()
}

// provisioningFailed gives up on the host for this task: what the attempt left there is owed
// (and keeps its slot until removed), the host goes into the failed hosts, and the task tries
// another.
func (p *provisionPhase) provisioningFailed(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, cause error) (reconcile.Result, error) {
	// Counted here, where the provisioner's outcome is read once (it is forgotten just
	// before), not after the record is saved: a failed save must not lose the failure.
	konfluxmetrics.ProvisioningFailed(rec.Spec.Platform)
	login := *rec.Status.Login
	why := cause.Error()
	if errors.Is(cause, hostops.ErrUserExists) {
		why = "a user named " + rec.Status.BuildUser + " already exists there (left by an attempt cut short); berth never reuses a build user: it is removed, and the task tries again under a new name"
	}
	// A host berth never logged in to has no user to remove; any other failure may have left
	// a half-made one, which is owed a clean and keeps its slot until then.
	owed := !remote.NeverReached(cause)
	next := rec.DeepCopy()
	if owed {
		next.Status.Debts = append(next.Status.Debts, berthv1.Debt{HostLogin: login, BuildUser: rec.Status.BuildUser, HoldsSlot: true})
	}
	if !slices.Contains(next.Status.FailedHosts, login.Host) {
		next.Status.FailedHosts = append(next.Status.FailedHosts, login.Host)
	}
	next.Status.Phase, next.Status.Login, next.Status.BuildUser, next.Status.Message = berthv1.PhaseWaiting, nil, "", why
	if err := p.records.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	if owed {
		p.capacity.Transfer(taskOf(tr), debtTask(next, rec.Status.BuildUser))
	} else {
		p.capacity.Release(taskOf(tr))
	}
	reason := "ProvisioningFailed"
	if remote.IsHostKeyChanged(cause) {
		reason = "HostKeyChanged" // a replaced host, or someone in the middle: people must look
	}
	p.hostFailed(ctx, tr, next, login.Host, reason, cause, why)
	var results outcomes
	results.add(p.debts.pay(ctx, next))
	results.add(p.reserving.reserve(ctx, tr, next))
	return results.result()
}
