package taskrun

// The guard phase: a handed-over secret stays as berth wrote it.

import (
	"context"
	"fmt"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// guardSecret notices a tenant's edit or deletion of the task's secret. The host is never
// touched again for that user but to remove it; the secret is written back holding only an
// error, so the task fails at once instead of hanging.
func (g *guardPhase) guardSecret(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, want string) (reconcile.Result, error) {
	if want == "" {
		return reconcile.Result{}, nil // adopted from an earlier controller: its secret is not ours to judge
	}
	secret, err := g.secrets.of(ctx, tr.Namespace, tr.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if secret != nil && cachedDigest(secret) == want {
		return reconcile.Result{}, nil
	}
	// The cache may simply lag behind our own write: ask the apiserver before judging.
	var live corev1.Secret
	err = g.apiReader.Get(ctx, client.ObjectKey{Namespace: tr.Namespace, Name: tasksecret.Name(tr.Name)}, &live)
	if err == nil && digest(live.Data) == want {
		return reconcile.Result{}, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if rec.Status.SecretTampered {
		if left := g.mirror.revertWait(tr); left > 0 {
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
	if err := g.records.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	// A token the tenant read out of the secret before changing it redeems nothing now.
	if err := g.keyring.revoke(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	if err := g.secrets.write(ctx, tr, errSecret); err != nil {
		return reconcile.Result{}, err
	}
	g.keyring.handed.Store(keyID(rec), next.Status.SecretDigest) // a pass on a stale copy of the record judges by it
	g.mirror.noteRevert(tr)
	errorSecrets.WithLabelValues("SecretTampered").Inc()
	tell(ctx, g.recorder, tr, "", corev1.EventTypeWarning, "SecretTampered", "%s", msg)
	return reconcile.Result{}, nil
}
