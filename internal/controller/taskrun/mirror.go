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
	"sync"
	"sync/atomic"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/capacity"
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
	// bare: the TaskRun's own annotations leave no room for berth's (see taskMirror.patch), so
	// only labels and finalizer are written, and berth's annotations are taken away.
	bare bool
}

// taskMirror writes the mirrors of user TaskRuns and keeps, per TaskRun, what it wrote: to tell
// a tenant's edit from its own write, to bound how often it undoes one, and to show a waiter
// its place in line without rewriting it at every hand-over.
type taskMirror struct {
	client           client.Client
	apiReader        client.Reader // the finalizers the cache cut (keptFinalizers)
	capacity         *capacity.Capacity
	recorder         events.EventRecorder
	now              func() time.Time
	revertInterval   time.Duration // the least time between two reverts on one TaskRun
	positionInterval time.Duration // the least time between two writes of one place in line
	// refreshes carries the wake-ups of the position refresh, which go in line with the rest.
	refreshes chan event.GenericEvent

	written  sync.Map // TaskRun UID → mirrorState berth last wrote
	patched  sync.Map // TaskRun UID → *patchedMeta: the metadata berth's last patch left, until the cache has it
	reverted sync.Map // TaskRun UID → when berth last undid a tenant's edit
	full     sync.Map // TaskRun UID → struct{}: no room for berth's annotations on it
	// foreign holds the TaskRuns told that their secret is another's (ForeignSecret): berth
	// writes nothing on such a TaskRun, so no mirror says it was told, and each of its updates
	// starts a reconcile.
	foreign sync.Map
	// reconciling holds the TaskRun names whose reconcile is under way (types.NamespacedName →
	// *atomic.Pointer[pipelinev1.TaskRun], the latest copy the watch brought meanwhile; one at
	// most per name): caughtUp leaves their patches to them.
	reconciling sync.Map
	// sets counts, per TaskRun UID, the times a step set the TaskRun's mirrors (see
	// reconcileUser). Reconciles of one TaskRun never run at once, so a plain count will do.
	sets sync.Map
	// positions holds the place in line last written on each waiting TaskRun (allocation.Task
	// → positionMark).
	positions sync.Map
	// refreshDue holds the waiters whose moved place the refresh loop let be rewritten.
	refreshDue sync.Map
	// unshown holds the waiters the refresh loop found not yet shown that they wait, at its
	// last look (see unshownWaiters); only that loop uses it.
	unshown map[allocation.Task]bool
}

// newMirror is the mirror writer of the reconciler's client, ledger and intervals.
func newMirror(r *Reconciler) *taskMirror {
	return &taskMirror{client: r.Client, apiReader: r.APIReader, capacity: r.Capacity, recorder: r.Recorder, now: r.now,
		revertInterval: r.MirrorRevertInterval, positionInterval: r.PositionInterval,
		refreshes: make(chan event.GenericEvent, positionWritesPerInterval)}
}

// forget drops what is kept about a TaskRun's mirrors once it has ended or gone.
func (m *taskMirror) forget(uid types.UID) {
	m.written.Delete(uid)
	m.patched.Delete(uid)
	m.sets.Delete(uid)
	m.reverted.Delete(uid)
	m.full.Delete(uid)
	m.foreign.Delete(uid)
}

// firstForeign tells whether this is the first time this process finds the TaskRun's secret
// to be another's: the ForeignSecret Event is told then, not at every update of the TaskRun.
func (m *taskMirror) firstForeign(uid types.UID) bool {
	_, told := m.foreign.LoadOrStore(uid, struct{}{})
	return !told
}

// toldWaiting tells whether the task was told it waits: this process mirrored the wait on it,
// or its TaskRun carries the waiting label (mirrored before a restart). A tenant who sets the
// label itself only spares itself the Event.
func (m *taskMirror) toldWaiting(tr *pipelinev1.TaskRun, platform string) bool {
	if last, ok := m.written.Load(tr.UID); ok && last.(mirrorState).waiting {
		return true
	}
	return tr.Labels[contract.WaitingForPlatformLabel] == contract.PlatformLabelValue(platform)
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

// sync brings the TaskRun's mirrors in line with its record (and a waiter's place in line
// with the ledger, see queuePosition). When they differ from what berth itself last wrote, a
// tenant edited them: the edit is reverted, at most once per MirrorRevertInterval per TaskRun
// and with an Event, and changes nothing else.
func (m *taskMirror) sync(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	tr = m.freshest(tr)
	m.noteSet(tr.UID)
	want := mirrorOf(rec)
	want.position = m.queuePosition(tr, rec)
	want.bare = m.annotationsFull(tr.UID)
	last, wrote := m.written.Load(tr.UID)
	if wrote && last.(mirrorState) == want {
		probe := tr.DeepCopy()
		want.apply(probe)
		if sameMetadata(tr, probe) {
			return reconcile.Result{}, nil
		}
		if left := m.revertWait(tr); left > 0 {
			return reconcile.Result{RequeueAfter: left}, nil
		}
		if err := m.patch(ctx, tr, want); err != nil {
			return reconcile.Result{}, err
		}
		m.noteRevert(tr)
		mirrorReverts.Inc()
		tell(ctx, m.recorder, tr, "", corev1.EventTypeWarning, "MirrorReverted", "labels, annotations and finalizer of this TaskRun are written by berth from its own records; the edit was undone and changed nothing")
		return reconcile.Result{}, nil
	}
	if err := m.patch(ctx, tr, want); err != nil {
		return reconcile.Result{}, err
	}
	if !want.ended {
		want.bare = m.annotationsFull(tr.UID)
		m.written.Store(tr.UID, want)
	}
	return reconcile.Result{}, nil
}

// patch writes state with a JSON patch that tests what it changes (see metadataPatch).
// Cached TaskRuns are stripped of what berth does not read, so they are never written whole.
//
// A tenant may fill its TaskRun's annotations up to the apiserver's limit (256 KiB in all),
// leaving no room for berth's queue-position and failed-hosts: the apiserver then refuses every
// patch that adds them, and the labels and finalizer in the same patch would never be written.
// So on that refusal the TaskRun is marked full (an Event says so, once) and its mirrors are
// written without berth's annotations, now and until it ends.
func (m *taskMirror) patch(ctx context.Context, tr *pipelinev1.TaskRun, state mirrorState) error {
	m.noteSet(tr.UID)
	if fresh := m.freshest(tr); fresh != tr {
		*tr = *fresh
	}
	state.bare = state.bare || m.annotationsFull(tr.UID)
	before := tr.DeepCopy()
	err := m.write(ctx, tr, before, state)
	if err != nil && !state.bare && annotationsTooLong(err) {
		m.full.Store(tr.UID, struct{}{})
		tell(ctx, m.recorder, before, "", corev1.EventTypeWarning, "AnnotationsFull",
			"annotations full (%d bytes in all): no queue-position or failed-hosts here; the labels show the state", apivalidation.TotalAnnotationSizeLimitB)
		*tr = *before.DeepCopy()
		state.bare = true
		err = m.write(ctx, tr, before, state)
	}
	if err != nil {
		return err
	}
	m.notePosition(tr, state.position)
	return nil
}

// write applies state to tr and patches what changed since before.
func (m *taskMirror) write(ctx context.Context, tr, before *pipelinev1.TaskRun, state mirrorState) error {
	state.apply(tr)
	if err := m.uncutFinalizers(ctx, before, tr); err != nil {
		return err
	}
	ops := metadataPatch(&before.ObjectMeta, &tr.ObjectMeta)
	if len(ops) == 0 {
		return nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	// The patch is sent for the TaskRun's metadata alone: the apiserver patches the whole
	// TaskRun but answers with its metadata (as=PartialObjectMetadata), so that neither it
	// encodes, nor berth decodes and holds, a spec and status a tenant may have made 1.5 MiB
	// large. The answer's metadata replaces tr's, cut down as the cache cuts it.
	answer := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: tr.Name, Namespace: tr.Namespace}}
	answer.SetGroupVersionKind(pipelinev1.SchemeGroupVersion.WithKind("TaskRun"))
	if err := m.client.Patch(ctx, answer, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		if testFailed(err) {
			return fmt.Errorf("%w: %w", errStale, err)
		}
		return err
	}
	tr.ResourceVersion, tr.Generation, tr.DeletionTimestamp = answer.ResourceVersion, answer.Generation, answer.DeletionTimestamp
	tr.Labels = keepKeys(answer.Labels, taskRunLabelsRead)
	tr.Annotations = keepKeys(answer.Annotations, taskRunAnnotationsRead)
	tr.Finalizers = keptFinalizers(answer.Finalizers)
	m.notePatched(tr)
	return nil
}

// uncutFinalizers puts the TaskRun's whole finalizer list, read past the cache, in before and
// after when after changes berth's finalizer on a list the cache cut (keptFinalizers): the patch
// tests and writes the list whole, which the cache does not hold. What is read is not kept.
func (m *taskMirror) uncutFinalizers(ctx context.Context, before, after *pipelinev1.TaskRun) error {
	if !slices.Contains(before.Finalizers, finalizersCut) || slices.Equal(before.Finalizers, after.Finalizers) {
		return nil
	}
	ours := slices.Contains(after.Finalizers, contract.Finalizer)
	live := &metav1.PartialObjectMetadata{}
	live.SetGroupVersionKind(pipelinev1.SchemeGroupVersion.WithKind("TaskRun"))
	if err := m.apiReader.Get(ctx, client.ObjectKeyFromObject(before), live); err != nil {
		return err
	}
	if live.UID != before.UID {
		return fmt.Errorf("%w: TaskRun %s/%s was replaced by another of the name", errStale, before.Namespace, before.Name)
	}
	before.Finalizers = live.Finalizers
	after.Finalizers = slices.Clone(live.Finalizers)
	if ours {
		controllerutil.AddFinalizer(after, contract.Finalizer)
	} else {
		controllerutil.RemoveFinalizer(after, contract.Finalizer)
	}
	return nil
}

func (m *taskMirror) annotationsFull(uid types.UID) bool {
	_, full := m.full.Load(uid)
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
func (m *taskMirror) notePatched(tr *pipelinev1.TaskRun) {
	rv, err := strconv.ParseUint(tr.ResourceVersion, 10, 64)
	if err != nil {
		m.patched.Delete(tr.UID)
		return
	}
	// tr's labels and annotations are cut down already (write): what the cache keeps of them.
	m.patched.Store(tr.UID, &patchedMeta{resourceVersion: rv, labels: maps.Clone(tr.Labels),
		annotations: maps.Clone(tr.Annotations), finalizers: slices.Clone(tr.Finalizers)})
}

// freshest is tr, or, while the cache has not caught up with berth's own last patch of it (the
// moments after a write, when the write's own event or the record's brings the TaskRun back),
// tr with the metadata that patch left. A patch based on the cache's older copy would test
// values that are gone, or leave a label berth removed a moment ago, and that copy would pass
// for a tenant's edit.
//
// tr may be the cache's copy or one berth made (this function's, or a copy a patch's answer
// updated), so what the patch left is never dropped here: a copy of berth's own at the patch's
// version says nothing of the cache. startsFrom drops it.
func (m *taskMirror) freshest(tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	v, ok := m.patched.Load(tr.UID)
	if !ok {
		return tr
	}
	last := v.(*patchedMeta)
	if last.reachedBy(tr) {
		return tr
	}
	fresh := tr.DeepCopy()
	fresh.ResourceVersion = strconv.FormatUint(last.resourceVersion, 10)
	fresh.Labels, fresh.Annotations, fresh.Finalizers = maps.Clone(last.labels), maps.Clone(last.annotations), slices.Clone(last.finalizers)
	return fresh
}

// startsFrom tells the mirror the cache's copy of a TaskRun that a reconcile starts from. Once
// the cache holds berth's own last patch of it, what the patch left is no longer needed (a
// TaskRun waiting for hours would otherwise keep a copy of its labels here all along); and
// no reconcile of the TaskRun can hold an older copy any more, since they run one at a time
// and each reads anew. The patch's watch event, seen by caughtUp, lets it go too.
func (m *taskMirror) startsFrom(tr *pipelinev1.TaskRun) {
	v, ok := m.patched.Load(tr.UID)
	if !ok {
		return
	}
	if v.(*patchedMeta).reachedBy(tr) {
		m.patched.CompareAndDelete(tr.UID, v)
	}
}

// caughtUp passes every event of a TaskRun and, on the way, drops what berth's last patch of
// it left once the event shows the patch's version or a later one. The patch's own event is
// its echo, which starts no reconcile (echoes), so without this the note would wait for the
// task's next reconcile: for a task waiting in line, one note per waiting task for as long as
// it waits.
//
// The informer stores an object before it hands the object's event to the watches, so the
// cache has the patch by then, and a reconcile that starts later reads it. A reconcile under
// way may have read the cache before, and calls freshest on that older copy: while one is,
// the event's copy goes on the reconcile's mark, and the reconcile drops the note as it
// ends (reconcile), unless it patched again since. A reconcile marks itself before it reads
// the cache, so no such reconcile goes unseen here.
func (m *taskMirror) caughtUp() predicate.Predicate {
	seen := func(o client.Object) {
		tr, ok := o.(*pipelinev1.TaskRun)
		if !ok {
			return
		}
		name := client.ObjectKeyFromObject(tr)
		v, busy := m.reconciling.Load(name)
		if !busy {
			m.startsFrom(tr)
			return
		}
		v.(*atomic.Pointer[pipelinev1.TaskRun]).Store(tr)
		// The reconcile may have ended before the copy went on its mark, and read none of it
		// then. Any reconcile marked since read the cache after the informer stored tr.
		if now, _ := m.reconciling.Load(name); now != v {
			m.startsFrom(tr)
		}
	}
	return predicate.Funcs{
		CreateFunc: func(ev event.CreateEvent) bool { seen(ev.Object); return true },
		UpdateFunc: func(ev event.UpdateEvent) bool { seen(ev.ObjectNew); return true },
	}
}

// reconcile marks the reconcile of a TaskRun name under way, until the returned func is called.
// When it is, a copy of the TaskRun the watch brought meanwhile counts as one the next
// reconcile starts from (startsFrom): the cache held it before the reconcile ended.
func (m *taskMirror) reconcile(name types.NamespacedName) (done func()) {
	seen := &atomic.Pointer[pipelinev1.TaskRun]{}
	m.reconciling.Store(name, seen)
	return func() {
		m.reconciling.CompareAndDelete(name, seen)
		if tr := seen.Load(); tr != nil {
			m.startsFrom(tr)
		}
	}
}

// reachedBy tells whether tr is at the patch's version or later. resourceVersions are etcd
// revisions, which only grow; one that does not parse as such is taken as new.
func (p *patchedMeta) reachedBy(tr *pipelinev1.TaskRun) bool {
	rv, err := strconv.ParseUint(tr.ResourceVersion, 10, 64)
	return err != nil || rv >= p.resourceVersion
}

// noteMirrorSet counts that the TaskRun's mirrors were set from what berth knows now.
func (m *taskMirror) noteSet(uid types.UID) {
	m.sets.Store(uid, m.setCount(uid)+1)
}

func (m *taskMirror) setCount(uid types.UID) uint64 {
	n, _ := m.sets.Load(uid)
	count, _ := n.(uint64)
	return count
}

func sameMetadata(a, b *pipelinev1.TaskRun) bool {
	return maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations) && slices.Equal(a.Finalizers, b.Finalizers)
}

func (m *taskMirror) revertWait(tr *pipelinev1.TaskRun) time.Duration {
	v, ok := m.reverted.Load(tr.UID)
	if !ok {
		return 0
	}
	return m.revertInterval - m.now().Sub(v.(time.Time))
}

func (m *taskMirror) noteRevert(tr *pipelinev1.TaskRun) { m.reverted.Store(tr.UID, m.now()) }
