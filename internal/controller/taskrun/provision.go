package taskrun

// The provision phase: a build user is made on the reserved host and its key handed over in
// the task's secret, which is then guarded until the task ends.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/remote"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// provision sees the build user's creation through and hands the task its secret.
func (r *Reconciler) provision(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	v, ok := r.keyring.pending.Load(keyID(rec))
	if !ok {
		// The private key lived only in the process that generated it (a restart, or another
		// replica): the user made with it is of no use. Remove it and start over under a new
		// name; never repair a user.
		return r.redo(ctx, tr, rec, "berth restarted while the build user was being created")
	}
	keys := v.(keyPair)
	j := job(rec, *rec.Status.Login, rec.Status.BuildUser)
	j.AuthorizedKey = keys.authorized
	if cfg := r.Config.Config(); cfg != nil {
		j.UIDs = cfg.BuildUIDs
	}
	out := r.Provisioner.Provision(ctx, j)
	if !out.Done {
		return reconcile.Result{}, nil // its end wakes us
	}
	if out.Err != nil {
		r.Provisioner.Forget(j.ID)
		r.keyring.pending.Delete(keyID(rec))
		return r.provisioningFailed(ctx, tr, rec, out.Err)
	}
	secret, err := r.keyring.secretFor(ctx, tr, rec, out.UserDir, keys.private)
	if err != nil {
		return reconcile.Result{}, err
	}
	handedOver := seal(secret, rec)
	if err := r.secrets.write(ctx, tr, secret); err != nil {
		return reconcile.Result{}, err
	}
	// The sealed secret is the record of the hand-over: the record itself is not written.
	r.keyring.handed.Store(keyID(rec), handedOver)
	r.keyring.pending.Delete(keyID(rec))
	r.Provisioner.Forget(j.ID)
	allocationSeconds.WithLabelValues(rec.Spec.Platform).Observe(r.now().Sub(rec.Status.ReservedAt.Time).Seconds())
	step(ctx, tr.Namespace+"/"+tr.Name, rec.Spec.Platform, rec.Status.Login.Host, "Provisioned", "build user %s ready on host %s", rec.Status.BuildUser, rec.Status.Login.Host)
	return reconcile.Result{}, nil
}

// redo owes the host the current user and provisions a new one on the same slot.
func (r *Reconciler) redo(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, why string) (reconcile.Result, error) {
	next := rec.DeepCopy()
	next.Status.Debts = append(next.Status.Debts, berthv1.Debt{HostLogin: *rec.Status.Login, BuildUser: rec.Status.BuildUser})
	pair, err := r.keyring.pair(tr.Namespace + "/" + tr.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	next.Status.Attempt++
	next.Status.BuildUser = hostops.UserNameFor(next.Spec.Platform, string(tr.UID), next.Status.Attempt)
	next.Status.Message = why
	if err := r.records.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	r.keyring.pending.Store(keyID(next), pair)
	tell(ctx, r.Recorder, tr, rec.Status.Login.Host, corev1.EventTypeNormal, "Reprovisioning", "%s; removing build user %s and creating %s on host %s", why, rec.Status.BuildUser, next.Status.BuildUser, rec.Status.Login.Host)
	var results outcomes
	results.add(reconcile.Result{}, r.keyring.revoke(ctx, next)) // a key kept for the old user before the restart
	results.add(r.provision(ctx, tr, next))
	results.add(r.debts.pay(ctx, next))
	return results.result()
}

// provisioningFailed gives up on the host for this task: what the attempt left there is owed
// (and keeps its slot until removed), the host goes into the failed hosts, and the task tries
// another.
func (r *Reconciler) provisioningFailed(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, cause error) (reconcile.Result, error) {
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
	if err := r.records.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	if owed {
		r.Capacity.Transfer(taskOf(tr), debtTask(next, rec.Status.BuildUser))
	} else {
		r.Capacity.Release(taskOf(tr))
	}
	reason := "ProvisioningFailed"
	if remote.IsHostKeyChanged(cause) {
		reason = "HostKeyChanged" // a replaced host, or someone in the middle: people must look
	}
	r.hostFailed(ctx, tr, next, login.Host, reason, cause, why)
	var results outcomes
	results.add(r.debts.pay(ctx, next))
	results.add(r.reserve(ctx, tr, next))
	return results.result()
}

// guardSecret notices a tenant's edit or deletion of the task's secret. The host is never
// touched again for that user but to remove it; the secret is written back holding only an
// error, so the task fails at once instead of hanging.
func (r *Reconciler) guardSecret(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, want string) (reconcile.Result, error) {
	if want == "" {
		return reconcile.Result{}, nil // adopted from an earlier controller: its secret is not ours to judge
	}
	secret, err := r.secrets.of(ctx, tr.Namespace, tr.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if secret != nil && cachedDigest(secret) == want {
		return reconcile.Result{}, nil
	}
	// The cache may simply lag behind our own write: ask the apiserver before judging.
	var live corev1.Secret
	err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: tr.Namespace, Name: tasksecret.Name(tr.Name)}, &live)
	if err == nil && digest(live.Data) == want {
		return reconcile.Result{}, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if rec.Status.SecretTampered {
		if left := r.mirror.revertWait(tr); left > 0 {
			return reconcile.Result{RequeueAfter: left}, nil
		}
	}
	msg := fmt.Sprintf("the secret %s was changed or deleted after berth wrote it, so it can no longer be trusted; berth will not touch build user %s again except to remove it. Re-run the task.",
		tasksecret.Name(tr.Name), rec.Status.BuildUser)
	errSecret := tasksecret.ForError(ownerOf(tr), msg)
	// The record first: once the tenant sees the error secret, berth's records already say the
	// user is not to be touched again. A crash between the two writes leaves a record whose
	// digest the secret does not match, which brings the next pass back here.
	next := rec.DeepCopy()
	next.Status.SecretTampered, next.Status.SecretDigest, next.Status.Message = true, digest(errSecret.Data), msg
	if err := r.records.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	// A token the tenant read out of the secret before changing it redeems nothing now.
	if err := r.keyring.revoke(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.secrets.write(ctx, tr, errSecret); err != nil {
		return reconcile.Result{}, err
	}
	r.keyring.handed.Store(keyID(rec), next.Status.SecretDigest) // a pass on a stale copy of the record judges by it
	r.mirror.noteRevert(tr)
	errorSecrets.WithLabelValues("SecretTampered").Inc()
	tell(ctx, r.Recorder, tr, "", corev1.EventTypeWarning, "SecretTampered", "%s", msg)
	return reconcile.Result{}, nil
}

// giveUp answers the task with an error; what the record still owes the hosts is paid first.
func (r *Reconciler) giveUp(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, reason, message string) (reconcile.Result, error) {
	if err := r.secrets.fail(ctx, tr, reason, message); err != nil {
		return reconcile.Result{}, err
	}
	if rec.ResourceVersion == "" {
		return reconcile.Result{}, nil
	}
	if len(rec.Status.Debts) == 0 {
		return reconcile.Result{}, r.records.drop(ctx, rec)
	}
	next := rec.DeepCopy()
	next.Status.Phase, next.Status.Message = berthv1.PhaseCleaning, message
	if err := r.records.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	return r.debts.pay(ctx, next)
}
