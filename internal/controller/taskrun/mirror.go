package taskrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
)

// mirrorState is what the labels, annotation and finalizer of a user TaskRun say, derived from
// its record. Dashboards and tasks read them; berth only writes them.
type mirrorState struct {
	ended     bool   // the task is over: take host, waiting and finalizer away, leave the rest
	host      string // assigned-host
	platform  string // target-platform
	waiting   bool   // waiting-for-platform
	finalizer bool
	failed    string // failed-hosts, comma list
	position  int    // queue-position while waiting; 0 for none
	// bare: the TaskRun's own annotations leave no room for berth's (see patchMirrors), so
	// only labels and finalizer are written, and berth's annotations are taken away.
	bare bool
}

func mirrorOf(rec *berthv1.Allocation) mirrorState {
	if rec == nil {
		return mirrorState{ended: true}
	}
	m := mirrorState{platform: rec.Spec.Platform, failed: strings.Join(rec.Status.FailedHosts, ",")}
	switch rec.Status.Phase {
	case berthv1.PhaseWaiting, "":
		m.waiting = true
	case berthv1.PhaseProvisioning, berthv1.PhaseReady:
		m.host, m.finalizer = rec.Status.Login.Host, true
	default:
		m.ended = true
	}
	return m
}

// apply writes m onto tr's metadata.
func (m mirrorState) apply(tr *pipelinev1.TaskRun) {
	if tr.Labels == nil {
		tr.Labels = map[string]string{}
	}
	setOrDelete(tr.Labels, contract.AssignedHostLabel, m.host)
	setOrDelete(tr.Labels, contract.WaitingForPlatformLabel, map[bool]string{true: contract.PlatformLabelValue(m.platform)}[m.waiting])
	if m.bare {
		delete(tr.Annotations, contract.QueuePositionAnnotation)
		delete(tr.Annotations, contract.FailedHostsAnnotation)
	} else if position := m.queuePosition(); position != "" || tr.Annotations[contract.QueuePositionAnnotation] != "" {
		if tr.Annotations == nil {
			tr.Annotations = map[string]string{}
		}
		setOrDelete(tr.Annotations, contract.QueuePositionAnnotation, position)
	}
	if m.finalizer {
		controllerutil.AddFinalizer(tr, contract.Finalizer)
	} else {
		controllerutil.RemoveFinalizer(tr, contract.Finalizer)
	}
	if m.ended {
		return
	}
	tr.Labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(m.platform)
	if !m.bare && (m.failed != "" || tr.Annotations[contract.FailedHostsAnnotation] != "") {
		if tr.Annotations == nil {
			tr.Annotations = map[string]string{}
		}
		setOrDelete(tr.Annotations, contract.FailedHostsAnnotation, m.failed)
	}
}

func (m mirrorState) queuePosition() string {
	if !m.waiting || m.position == 0 {
		return ""
	}
	return strconv.Itoa(m.position)
}

func setOrDelete(m map[string]string, key, value string) {
	if value == "" {
		delete(m, key)
	} else {
		m[key] = value
	}
}

// mirror brings the TaskRun's mirrors in line with its record (and a waiter's place in line
// with the ledger, see queuePosition). When they differ from what berth itself last wrote, a
// tenant edited them: the edit is reverted, at most once per MirrorRevertInterval per TaskRun
// and with an Event, and changes nothing else.
func (r *Reconciler) mirror(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	tr = r.freshest(tr)
	r.noteMirrorSet(tr.UID)
	want := mirrorOf(rec)
	want.position = r.queuePosition(tr, rec)
	want.bare = r.annotationsFull(tr.UID)
	last, wrote := r.mirrors.Load(tr.UID)
	if wrote && last.(mirrorState) == want {
		probe := tr.DeepCopy()
		want.apply(probe)
		if sameMetadata(tr, probe) {
			return reconcile.Result{}, nil
		}
		if left := r.revertWait(tr); left > 0 {
			return reconcile.Result{RequeueAfter: left}, nil
		}
		if err := r.patchMirrors(ctx, tr, want); err != nil {
			return reconcile.Result{}, err
		}
		r.noteRevert(tr)
		mirrorReverts.Inc()
		r.event(ctx, tr, "", corev1.EventTypeWarning, "MirrorReverted", "labels, annotations and finalizer of this TaskRun are written by berth from its own records; the edit was undone and changed nothing")
		return reconcile.Result{}, nil
	}
	if err := r.patchMirrors(ctx, tr, want); err != nil {
		return reconcile.Result{}, err
	}
	if !want.ended {
		want.bare = r.annotationsFull(tr.UID)
		r.mirrors.Store(tr.UID, want)
	}
	return reconcile.Result{}, nil
}

// patchMirrors writes m with a JSON patch that tests what it changes (see metadataPatch).
// Cached TaskRuns are stripped of what berth does not read, so they are never written whole.
//
// A tenant may fill its TaskRun's annotations up to the apiserver's limit (256 KiB in all),
// leaving no room for berth's queue-position and failed-hosts: the apiserver then refuses every
// patch that adds them, and the labels and finalizer in the same patch would never be written.
// So on that refusal the TaskRun is marked full (an Event says so, once) and its mirrors are
// written without berth's annotations, now and until it ends.
func (r *Reconciler) patchMirrors(ctx context.Context, tr *pipelinev1.TaskRun, m mirrorState) error {
	r.noteMirrorSet(tr.UID)
	if fresh := r.freshest(tr); fresh != tr {
		*tr = *fresh
	}
	m.bare = m.bare || r.annotationsFull(tr.UID)
	before := tr.DeepCopy()
	err := r.writeMirrors(ctx, tr, before, m)
	if err != nil && !m.bare && annotationsTooLong(err) {
		r.full.Store(tr.UID, struct{}{})
		r.event(ctx, before, "", corev1.EventTypeWarning, "AnnotationsFull",
			"annotations full (%d bytes in all): no queue-position or failed-hosts here; the labels show the state", apivalidation.TotalAnnotationSizeLimitB)
		*tr = *before.DeepCopy()
		m.bare = true
		err = r.writeMirrors(ctx, tr, before, m)
	}
	if err != nil {
		return err
	}
	r.notePosition(tr, m.position)
	return nil
}

// writeMirrors applies m to tr and patches what changed since before.
func (r *Reconciler) writeMirrors(ctx context.Context, tr, before *pipelinev1.TaskRun, m mirrorState) error {
	m.apply(tr)
	ops := metadataPatch(&before.ObjectMeta, &tr.ObjectMeta)
	if len(ops) == 0 {
		return nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	if err := r.Client.Patch(ctx, tr, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		if testFailed(err) {
			return fmt.Errorf("%w: %w", errStale, err)
		}
		return err
	}
	r.notePatched(tr)
	return nil
}

func (r *Reconciler) annotationsFull(uid types.UID) bool {
	_, full := r.full.Load(uid)
	return full
}

// annotationsTooLong tells the apiserver's refusal of metadata whose annotations exceed its
// limit (a validation error on the field metadata.annotations).
func annotationsTooLong(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Type == metav1.CauseTypeTooLong && c.Field == "metadata.annotations" {
			return true
		}
	}
	return false
}

// patchedMeta is the metadata of a TaskRun as berth's last patch of it left it.
type patchedMeta struct {
	resourceVersion uint64
	labels          map[string]string
	annotations     map[string]string
	finalizers      []string
}

// notePatched keeps what the apiserver answered to berth's patch of tr.
func (r *Reconciler) notePatched(tr *pipelinev1.TaskRun) {
	rv, err := strconv.ParseUint(tr.ResourceVersion, 10, 64)
	if err != nil {
		r.patched.Delete(tr.UID)
		return
	}
	// The apiserver answers with the whole TaskRun: only what the cache would keep of it is
	// kept (stripTaskRun), or a tenant's large annotations would stay here.
	r.patched.Store(tr.UID, &patchedMeta{resourceVersion: rv, labels: keepKeys(tr.Labels, taskRunLabelsRead),
		annotations: keepKeys(tr.Annotations, taskRunAnnotationsRead), finalizers: slices.Clone(tr.Finalizers)})
}

// freshest is tr, or, while the cache has not caught up with berth's own last patch of it (the
// moments after a write, when the write's own event or the record's brings the TaskRun back),
// tr with the metadata that patch left. A patch based on the cache's older copy would test
// values that are gone, or leave a label berth removed a moment ago, and that copy would pass
// for a tenant's edit. resourceVersions are etcd revisions, which only grow; one that does not
// parse as such is taken as new.
func (r *Reconciler) freshest(tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	v, ok := r.patched.Load(tr.UID)
	if !ok {
		return tr
	}
	last := v.(*patchedMeta)
	if cached, err := strconv.ParseUint(tr.ResourceVersion, 10, 64); err != nil || cached >= last.resourceVersion {
		// The cache has caught up: what the patch left is no longer needed (a TaskRun waiting
		// for hours would otherwise keep a copy of its labels here all along).
		r.patched.CompareAndDelete(tr.UID, v)
		return tr
	}
	fresh := tr.DeepCopy()
	fresh.ResourceVersion = strconv.FormatUint(last.resourceVersion, 10)
	fresh.Labels, fresh.Annotations, fresh.Finalizers = maps.Clone(last.labels), maps.Clone(last.annotations), slices.Clone(last.finalizers)
	return fresh
}

// noteMirrorSet counts that the TaskRun's mirrors were set from what berth knows now.
func (r *Reconciler) noteMirrorSet(uid types.UID) {
	r.mirrorSets.Store(uid, r.mirrorSetCount(uid)+1)
}

func (r *Reconciler) mirrorSetCount(uid types.UID) uint64 {
	n, _ := r.mirrorSets.Load(uid)
	count, _ := n.(uint64)
	return count
}

func sameMetadata(a, b *pipelinev1.TaskRun) bool {
	return maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations) && slices.Equal(a.Finalizers, b.Finalizers)
}

func (r *Reconciler) revertWait(tr *pipelinev1.TaskRun) time.Duration {
	v, ok := r.reverted.Load(tr.UID)
	if !ok {
		return 0
	}
	return r.MirrorRevertInterval - r.now().Sub(v.(time.Time))
}

func (r *Reconciler) noteRevert(tr *pipelinev1.TaskRun) { r.reverted.Store(tr.UID, r.now()) }
