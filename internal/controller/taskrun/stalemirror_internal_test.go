package taskrun

import (
	"context"
	"strconv"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// TestAMirrorIsWrittenOnceWhileTheCacheIsBehindIt: on real Tekton a task's end brings several
// reconciles in a row (Tekton's completion, berth's own patch, the clean's wake-up), and the
// cache may still show the TaskRun as it was before berth's patch taking the host label and
// finalizer off. berth patches once; the passes on the older copy send nothing, where they
// once sent the same patch again, testing values berth itself had removed, which the
// apiserver refused (422) and berth retried. Once the watch brings the patched TaskRun, the
// mirror keeps nothing of the patch.
func TestAMirrorIsWrittenOnceWhileTheCacheIsBehindIt(t *testing.T) {
	ctx := context.Background()
	api := newAPIServer()
	tr := userTaskRun("ended", s390x)
	tr.Namespace, tr.UID = tenantNS, types.UID("uid-ended")
	tr.Labels = map[string]string{contract.AssignedHostLabel: "h1", contract.TargetPlatformLabel: contract.PlatformLabelValue(s390x)}
	tr.Finalizers = []string{contract.Finalizer}
	tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue, Reason: "Succeeded"})
	if err := api.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	cache := cacheView(api, berthNS)
	var before pipelinev1.TaskRun
	if err := cache.Get(ctx, client.ObjectKeyFromObject(tr), &before); err != nil {
		t.Fatal(err)
	}

	patches, refused := 0, 0
	counted := interceptor.NewClient(cache, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches++
			err := c.Patch(ctx, obj, patch, opts...)
			if apierrors.IsInvalid(err) {
				refused++
			}
			return err
		},
	})
	r := &Reconciler{Client: counted, Config: hostconfig.NewStore(), Capacity: capacity.New(), Recorder: &eventLog{}, Namespace: berthNS}
	r.init()

	// Three passes, each on the copy the cache held before berth's patch.
	for pass := range 3 {
		stale := before.DeepCopy()
		if _, err := r.mirror.sync(ctx, stale, nil); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	if patches != 1 || refused != 0 {
		t.Fatalf("berth sent %d patches (%d refused) for one end, want 1", patches, refused)
	}
	var now pipelinev1.TaskRun
	if err := api.Get(ctx, client.ObjectKeyFromObject(tr), &now); err != nil {
		t.Fatal(err)
	}
	if now.Labels[contract.AssignedHostLabel] != "" || len(now.Finalizers) != 0 {
		t.Fatalf("the TaskRun still has host %q and finalizers %v", now.Labels[contract.AssignedHostLabel], now.Finalizers)
	}
	if _, kept := r.mirror.patched.Load(tr.UID); !kept {
		t.Fatal("the mirror dropped what its patch left before the cache had it")
	}

	// A reconcile starts from the cache's copy with berth's patch in it.
	r.mirror.startsFrom(now.DeepCopy())
	if _, kept := r.mirror.patched.Load(tr.UID); kept {
		t.Fatal("the cache has berth's patch, and the mirror still keeps what the patch left")
	}
	if _, err := r.mirror.sync(ctx, now.DeepCopy(), nil); err != nil || patches != 1 {
		t.Fatalf("a pass on the caught-up cache: %d patches in all, %v", patches, err)
	}
}

// TestTheWatchEventOfBerthsPatchLetsThePatchGo: what berth's patch left is kept for a TaskRun
// only until the cache has the patch. The patch's own watch event shows that; it is the echo
// of berth's write, so it starts no reconcile, and a task waiting for hours keeps nothing of
// the patch meanwhile all the same. While a reconcile of the TaskRun is under way, which may
// hold the cache's older copy, the event leaves the patch to it, and the reconcile lets it go
// as it ends, unless it patched the TaskRun again since. (A reconcile that starts from a cache
// with the patch in it lets it go too: TestAMirrorIsWrittenOnceWhileTheCacheIsBehindIt.)
func TestTheWatchEventOfBerthsPatchLetsThePatchGo(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	h.create(userTaskRun("served", s390x))
	waiter := h.create(userTaskRun("waiter", s390x))
	h.settle()
	h.waiting("waiter")
	kept := func() bool {
		_, ok := h.r.mirror.patched.Load(waiter.UID)
		return ok
	}
	// The waiter's waiting label is berth's last write on it: nothing has read it back yet.
	if !kept() {
		t.Fatal("berth labelled the waiter, and the mirror keeps nothing of the patch")
	}
	// The watch brings the labelled TaskRun, as the reconcile's watch of TaskRuns filters it.
	labelled := h.get("waiter")
	echo := func(tr *pipelinev1.TaskRun) (passed bool) {
		for _, p := range h.r.reconcileTaskRunEvents() {
			if !p.Update(event.UpdateEvent{ObjectOld: waiter, ObjectNew: tr}) {
				return false
			}
		}
		return true
	}
	key := client.ObjectKeyFromObject(waiter)
	done := h.r.mirror.reconcile(key)
	if echo(labelled) {
		t.Error("the echo of berth's waiting label started a reconcile")
	}
	if !kept() {
		t.Error("the watch brought berth's patch while a reconcile of the waiter was under way, and the mirror dropped what the patch left")
	}
	done()
	if kept() {
		t.Error("the reconcile under way when the watch brought berth's patch has ended, and the mirror still keeps what the patch left")
	}

	// A reconcile that patches the TaskRun after the watch brought the earlier patch keeps
	// what its own patch left: the cache has not got it yet.
	done = h.r.mirror.reconcile(key)
	echo(labelled)
	newer := labelled.DeepCopy()
	rv, err := strconv.ParseUint(labelled.ResourceVersion, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	newer.ResourceVersion = strconv.FormatUint(rv+1, 10)
	h.r.mirror.notePatched(newer)
	done()
	if !kept() {
		t.Error("a reconcile patched the waiter after the watch brought an older version, and the mirror dropped what its patch left")
	}
	// Its own event, with no reconcile under way, lets it go.
	echo(newer)
	if kept() {
		t.Error("the watch brought berth's later patch of the waiter, and the mirror still keeps what the patch left")
	}
}

// TestARecordDeletedIsGoneWhileTheCacheStillShowsIt: after berth deletes a record, the cache
// may list it for a while; a pass reading it then would pay its debts again (remove the build
// user once more, delete the record again). To the record store it is gone at once, and it
// keeps nothing of it once the watch has told the cache.
func TestARecordDeletedIsGoneWhileTheCacheStillShowsIt(t *testing.T) {
	ctx := context.Background()
	api := newAPIServer()
	key := types.NamespacedName{Namespace: tenantNS, Name: "ended"}
	rec := &berthv1.Allocation{
		ObjectMeta: metav1.ObjectMeta{Name: "uid-ended", Namespace: berthNS, UID: "record-uid"},
		Spec:       berthv1.AllocationSpec{TaskRun: berthv1.TaskRunRef{Namespace: key.Namespace, Name: key.Name, UID: "uid-ended"}, Platform: s390x},
	}
	if err := api.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// The cache: it shows the record as it was until the watch brings its deletion (ghost nil).
	var ghost *berthv1.Allocation
	cache := interceptor.NewClient(api, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			if l, ok := list.(*berthv1.AllocationList); ok && ghost != nil && len(l.Items) == 0 {
				l.Items = append(l.Items, *ghost.DeepCopy())
			}
			return nil
		},
		Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if a, ok := obj.(*berthv1.Allocation); ok && ghost != nil && k.Name == ghost.Name {
				*a = *ghost.DeepCopy()
				return nil
			}
			return c.Get(ctx, k, obj, opts...)
		},
	})
	r := &Reconciler{Client: cache, Config: hostconfig.NewStore(), Capacity: capacity.New(), Recorder: &eventLog{}, Namespace: berthNS}
	r.init()
	rs := r.records
	records := func() int {
		t.Helper()
		recs, err := rs.of(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return len(recs)
	}

	recs, err := rs.of(ctx, key)
	if err != nil || len(recs) != 1 {
		t.Fatalf("before: %d records, %v", len(recs), err)
	}
	ghost = recs[0].DeepCopy()
	if err := rs.drop(ctx, recs[0]); err != nil {
		t.Fatal(err)
	}
	if n := records(); n != 0 {
		t.Fatalf("the cache still lists the deleted record, and the store shows %d", n)
	}
	// A second delete of it (another pass that read it before) is no error either.
	if err := rs.drop(ctx, ghost.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	// The watch brings the deletion: the cache lets the record go, and the event wakes its
	// TaskRun.
	ghost, gone := nil, ghost
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	r.recordEvents().Delete(ctx, event.DeleteEvent{Object: gone}, q)
	if n, kept := records(), marked(rs); n != 0 || kept != 0 {
		t.Fatalf("after the watch's delete event: %d records shown, %d kept", n, kept)
	}
	if item, _, _ := q.GetWithPriority(); item.NamespacedName != key {
		t.Fatalf("the delete event woke %v, not %v", item.NamespacedName, key)
	}

	// A delete event that came while the request was answered: nothing is kept at all.
	again := rec.DeepCopy()
	again.ResourceVersion, again.UID = "", "record-uid-2"
	if err := api.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	fast := &recordStore{namespace: berthNS}
	fast.client = interceptor.NewClient(api, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			err := c.Delete(ctx, obj, opts...)
			fast.seenGone(obj) // the watch's event, before the answer
			return err
		},
	})
	if err := fast.drop(ctx, again); err != nil {
		t.Fatal(err)
	}
	if kept := marked(fast); kept != 0 {
		t.Fatalf("the cache had let the record go, and the store keeps %d", kept)
	}
	// A delete the apiserver refuses (the record changed since it was read) leaves nothing
	// marked either.
	refusing := &recordStore{namespace: berthNS, client: interceptor.NewClient(api, interceptor.Funcs{
		Delete: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.DeleteOption) error {
			return apierrors.NewConflict(berthv1.GroupVersion.WithResource("allocations").GroupResource(), obj.GetName(), nil)
		},
	})}
	if err := refusing.drop(ctx, rec.DeepCopy()); !apierrors.IsConflict(err) {
		t.Fatalf("a refused delete: %v", err)
	}
	if kept := marked(refusing); kept != 0 {
		t.Fatalf("a refused delete left %d records marked gone", kept)
	}
}

// marked counts the records rs holds as deleted while the cache may still show them.
func marked(rs *recordStore) int {
	n := 0
	rs.dropped.Range(func(any, any) bool { n++; return true })
	return n
}
