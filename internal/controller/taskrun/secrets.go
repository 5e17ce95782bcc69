package taskrun

// The task's secret: written, answered with an error, or deleted, only when berth owns it.

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// taskSecrets writes and deletes the secrets berth answers tasks with (multi-platform-ssh-<name>),
// only ever one it wrote for that same TaskRun.
type taskSecrets struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	mirror    *taskMirror
}

// fail answers the task with an error secret it prints before it exits, and counts it in
// berth_error_secrets_total and in also, the reason's own counters, when it wrote the secret.
func (ts *taskSecrets) fail(ctx context.Context, tr *pipelinev1.TaskRun, reason, message string, also ...prometheus.Counter) error {
	written, err := ts.put(ctx, tr, tasksecret.ForError(ownerOf(tr), message))
	if err != nil {
		return err
	}
	// A reconcile that ran before the cache saw the secret finds this very answer there
	// already: the task was counted and told then.
	if written {
		errorSecrets.WithLabelValues(reason).Inc()
		for _, c := range also {
			c.Inc()
		}
		tell(ctx, ts.recorder, tr, "", corev1.EventTypeWarning, reason, "%s", message)
	}
	return ts.mirror.patch(ctx, tr, mirrorState{platform: contract.Platform(tr)})
}

// write is put, for callers to whom an answer already in place is as good as one written.
func (ts *taskSecrets) write(ctx context.Context, tr *pipelinev1.TaskRun, s *corev1.Secret) error {
	_, err := ts.put(ctx, tr, s)
	return err
}

// put creates the task's secret, or replaces one berth wrote earlier for this same TaskRun
// (delete, then create: berth never needs to update a secret), and says whether it wrote one.
// One that berth wrote for this TaskRun with the same data and its label intact is the answer
// already (a reconcile on a cache behind berth's own create gets here): it is kept, and put
// writes nothing. A secret of that name that berth did not write for this TaskRun is left
// alone and reported.
func (ts *taskSecrets) put(ctx context.Context, tr *pipelinev1.TaskRun, s *corev1.Secret) (bool, error) {
	err := ts.client.Create(ctx, s)
	if !apierrors.IsAlreadyExists(err) {
		return err == nil, err
	}
	var existing corev1.Secret
	if err := ts.apiReader.Get(ctx, client.ObjectKeyFromObject(s), &existing); err != nil {
		if apierrors.IsNotFound(err) {
			return false, errStale
		}
		return false, err
	}
	if !ownedBy(&existing, tr.UID) {
		tell(ctx, ts.recorder, tr, "", corev1.EventTypeWarning, "SecretConflict", "a secret named %s exists that berth did not write for this TaskRun; delete it so berth can answer the task", s.Name)
		return false, fmt.Errorf("secret %s/%s exists and is not berth's", s.Namespace, s.Name)
	}
	if existing.Type == s.Type && existing.Labels[contract.SecretLabel] == s.Labels[contract.SecretLabel] && maps.EqualFunc(existing.Data, s.Data, bytes.Equal) {
		return false, nil
	}
	if err := ts.client.Delete(ctx, &existing, client.Preconditions{UID: &existing.UID, ResourceVersion: &existing.ResourceVersion}); client.IgnoreNotFound(err) != nil {
		return false, err
	}
	err = ts.client.Create(ctx, s)
	return err == nil, err
}

// delete removes the task's secret if berth wrote it for that TaskRun; any other secret
// of the name is not berth's to delete.
func (ts *taskSecrets) delete(ctx context.Context, namespace, name string, uid types.UID) error {
	s, err := ts.of(ctx, namespace, name)
	if err != nil || s == nil || !ownedBy(s, uid) {
		return err
	}
	return client.IgnoreNotFound(ts.client.Delete(ctx, s, client.Preconditions{UID: &s.UID}))
}

// dropStale deletes the secret berth wrote under this name for a TaskRun that is gone:
// one deleted without berth's finalizer (a local or error answer holds none), or replaced by a
// new TaskRun of the same name (current, "" if none). Also one deleted while berth was down:
// every secret of berth's reaches this on start.
// The owner reference would let a garbage collector do this, some time later; berth does not
// count on one running, and a stale secret would stand in the way of the new TaskRun's answer.
// A secret berth did not write is never touched.
func (ts *taskSecrets) dropStale(ctx context.Context, key types.NamespacedName, current types.UID) error {
	s, err := ts.of(ctx, key.Namespace, key.Name)
	if err != nil || s == nil || s.Labels[contract.SecretLabel] != "true" || ownedBy(s, current) {
		return err
	}
	writtenFor := taskRunOwner(s, key.Name)
	if writtenFor == "" {
		return nil
	}
	// The cache may lag behind the apiserver: ask it before deleting a task's only way to start.
	var live metav1.PartialObjectMetadata
	live.SetGroupVersionKind(pipelinev1.SchemeGroupVersion.WithKind("TaskRun"))
	switch err := ts.apiReader.Get(ctx, key, &live); {
	case err == nil && live.UID == writtenFor:
		return errStale
	case err != nil && !apierrors.IsNotFound(err):
		return err
	}
	return ts.delete(ctx, key.Namespace, key.Name, writtenFor)
}

// taskRunOwner is the UID of the TaskRun named name that owns the secret ("" if none does).
func taskRunOwner(s *corev1.Secret, name string) types.UID {
	for _, o := range s.OwnerReferences {
		if o.Kind == "TaskRun" && o.Name == name {
			return o.UID
		}
	}
	return ""
}

// ownedBy tells a secret berth wrote for the TaskRun with this UID: its label and its owner.
func ownedBy(s *corev1.Secret, uid types.UID) bool {
	if s.Labels[contract.SecretLabel] != "true" {
		return false
	}
	for _, o := range s.OwnerReferences {
		if o.UID == uid && o.Kind == "TaskRun" {
			return true
		}
	}
	return false
}

// answeredElsewhere tells a task's secret, labelled as berth's, that no TaskRun owns: berth
// writes none such, while the provision task of the controller berth replaces writes every one
// so (kubectl create, no owner). Its task has a host and a build user from that controller
// (one berth did not adopt: on a cloud VM, or a host berth does not know), and a host berth
// reserved for it could never be handed over: the secret's name is taken.
func answeredElsewhere(s *corev1.Secret) bool {
	if s.Labels[contract.SecretLabel] != "true" {
		return false
	}
	return !slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "TaskRun" })
}

func ownerOf(tr *pipelinev1.TaskRun) tasksecret.Owner {
	return tasksecret.Owner{Name: tr.Name, Namespace: tr.Namespace, UID: tr.UID}
}

// of reads the task's secret from the cache, which holds only berth-labelled secrets and
// of each only what stripSecret keeps: no data but its digest (cachedDigest) and a well-formed
// OTP token.
func (ts *taskSecrets) of(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	var s corev1.Secret
	err := ts.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: contract.SecretPrefix + name}, &s)
	if err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return &s, nil
}

// giveUp answers the task with an error; what the record still owes the hosts is paid first.
func (an *answers) giveUp(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, reason, message string) (reconcile.Result, error) {
	if err := an.secrets.fail(ctx, tr, reason, message, konfluxmetrics.HostAllocationFailures(rec.Spec.Platform)); err != nil {
		return reconcile.Result{}, err
	}
	if rec.ResourceVersion == "" {
		return reconcile.Result{}, nil
	}
	if len(rec.Status.Debts) == 0 {
		return reconcile.Result{}, an.records.drop(ctx, rec)
	}
	next := rec.DeepCopy()
	next.Status.Phase, next.Status.Message = berthv1.PhaseCleaning, message
	if err := an.records.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	return an.debts.pay(ctx, next)
}
