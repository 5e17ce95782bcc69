package taskrun

// The manager's cache lags the apiserver: right after berth writes a record or a secret, a read
// from the cache may still show the version before that write, or no object at all for one
// just made, or one just deleted. The phases must then never act twice on what they already
// did. lagging models that lag on berth's own objects, one read long, on the harness of the
// phases (phases_internal_test.go).

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/provision/provisionfake"
	"github.com/berth-ci/berth/internal/remote"
)

// lagging is a cache one read behind the apiserver for Allocation records and Secrets: the
// first read of such an object after it changed shows what the cache held before (the older
// version, nothing for a new object, the object still there for a deleted one); the read after
// that shows the apiserver's. stale counts the reads it answered from the past.
type lagging struct {
	mu    sync.Mutex
	held  map[string]client.Object // kind/namespace/name → the version the cache holds
	stale int
}

func newLagging() *lagging { return &lagging{held: map[string]client.Object{}} }

func lagKey(obj client.Object) string {
	return fmt.Sprintf("%T/%s/%s", obj, obj.GetNamespace(), obj.GetName())
}

// lags tells whether obj is one of the kinds the cache is behind on.
func lags(obj client.Object) bool {
	switch obj.(type) {
	case *berthv1.Allocation, *corev1.Secret:
		return true
	}
	return false
}

// see answers a read of one object: current is the apiserver's version (nil when there is
// none); it returns what the cache shows (nil for nothing), and catches the cache up.
func (l *lagging) see(key string, current client.Object) client.Object {
	l.mu.Lock()
	defer l.mu.Unlock()
	held, had := l.held[key]
	if current == nil {
		delete(l.held, key)
	} else {
		l.held[key] = current.DeepCopyObject().(client.Object)
	}
	switch {
	case !had && current == nil:
		return nil
	case !had: // made since the cache last looked
		l.stale++
		return nil
	case current == nil: // deleted since
		l.stale++
		return held
	case held.GetResourceVersion() != current.GetResourceVersion():
		l.stale++
		return held
	}
	return current
}

// funcs is the cache's reads of the lagging kinds.
func (l *lagging) funcs() *interceptor.Funcs {
	return &interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if !lags(obj) {
				return c.Get(ctx, key, obj, opts...)
			}
			fresh := obj.DeepCopyObject().(client.Object)
			err := c.Get(ctx, key, fresh, opts...)
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			var current client.Object
			if err == nil {
				current = fresh
			}
			fresh.SetNamespace(key.Namespace)
			fresh.SetName(key.Name)
			shown := l.see(lagKey(fresh), current)
			if shown == nil {
				return apierrors.NewNotFound(corev1.Resource("objects"), key.Name)
			}
			copyInto(shown, obj)
			return nil
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			recs, ok := list.(*berthv1.AllocationList)
			if !ok {
				return nil
			}
			// Records are the only listed kind that lags here: each listed one is shown as
			// the cache holds it, and one the cache still holds but the apiserver deleted is
			// shown too, when it matches the list's namespace.
			var shown []berthv1.Allocation
			listed := map[string]bool{}
			for i := range recs.Items {
				key := lagKey(&recs.Items[i])
				listed[key] = true
				if s := l.see(key, &recs.Items[i]); s != nil {
					shown = append(shown, *s.(*berthv1.Allocation))
				}
			}
			l.mu.Lock()
			var gone []string
			for key, held := range l.held {
				if rec, ok := held.(*berthv1.Allocation); ok && !listed[key] && matches(rec, opts) {
					gone = append(gone, key)
				}
			}
			l.mu.Unlock()
			for _, key := range gone {
				if s := l.see(key, nil); s != nil {
					shown = append(shown, *s.(*berthv1.Allocation))
				}
			}
			recs.Items = shown
			return nil
		},
	}
}

// matches applies a list's namespace and TaskRun-key field to a record.
func matches(rec *berthv1.Allocation, opts []client.ListOption) bool {
	var lo client.ListOptions
	lo.ApplyOptions(opts)
	if lo.Namespace != "" && rec.Namespace != lo.Namespace {
		return false
	}
	if lo.FieldSelector != nil {
		if want, ok := lo.FieldSelector.RequiresExactMatch(taskRunKeyField); ok && rec.Spec.TaskRun.Key() != want {
			return false
		}
	}
	return true
}

func copyInto(from, to client.Object) {
	switch t := to.(type) {
	case *berthv1.Allocation:
		*t = *from.(*berthv1.Allocation).DeepCopy()
	case *corev1.Secret:
		*t = *from.(*corev1.Secret).DeepCopy()
	}
}

// TestACacheBehindBerthsOwnWritesNeverMakesItActTwice: with a cache one read behind every
// record and secret berth writes, four tasks share two slots of one host. Host jobs take their
// time (each ends when the test says), and the first clean fails once, so records change while
// their tasks are reconciled. Each task's user is made once, handed over once and removed
// once (a record deleted and still in the cache is not paid again), the host
// never holds more users than its slots, the waiters go in turn, and nothing is left at the
// end.
func TestACacheBehindBerthsOwnWritesNeverMakesItActTwice(t *testing.T) {
	lag := newLagging()
	clock := newTestClock()
	h := &harness{t: t, api: newAPIServer(), events: &eventLog{}, cfg: hostsConfig(2, "h1"), faults: lag.funcs(),
		tune: func(r *Reconciler) { r.now = clock.now }}
	h.start()
	h.prov.Rule = func(provisionfake.Kind, provision.Job) (provision.Outcome, bool) { return provision.Outcome{}, false }
	end := func(kind provisionfake.Kind, user string, out provision.Outcome) {
		t.Helper()
		if err := h.prov.End(kind, user, out); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if users := h.prov.Users("h1"); len(users) > 2 {
			t.Fatalf("h1 holds %d build users %v with 2 slots", len(users), users)
		}
	}
	names := []string{"t1", "t2", "t3", "t4"}
	for _, n := range names {
		h.create(userTaskRun(n, s390x))
	}
	h.settle()
	provisioning := func() []string {
		var users []string
		for _, j := range h.prov.Running(provisionfake.Provision) {
			users = append(users, j.User)
		}
		return users
	}
	served := map[string]string{}
	for i, n := range names {
		for _, u := range provisioning() { // n's, and the next's if it started since
			end(provisionfake.Provision, u, provision.Outcome{})
		}
		served[n], _ = h.handedOver(h.get(n))
		if i+2 < len(names) {
			h.waiting(names[i+2]) // until the task two ahead of it is clean
		}
		h.finish(n)
		h.settle()
		if i == 0 {
			end(provisionfake.Clean, served[n], provision.Outcome{Err: &remote.RemoteError{Host: "h1", Command: "removing user " + served[n],
				ExitCode: 1, Stderr: "userdel: user is currently used by process 4242"}})
			h.waiting(names[i+2])
			clock.advance(maxCleanBackoff)
			h.enqueue(n) // the backoff's requeue
			h.settle()
		}
		end(provisionfake.Clean, served[n], provision.Outcome{})
		// The record's delete event, and any other of the TaskRun, wakes it once more while the
		// cache may still show the record.
		h.enqueue(n)
		h.settle()
	}
	if lag.stale == 0 {
		t.Fatal("no read was answered from the past: the test proves nothing")
	}
	provisions, cleans := map[string]int{}, map[string]int{}
	for _, s := range h.prov.Started() {
		switch s.Kind {
		case provisionfake.Provision:
			provisions[s.Job.User]++
		case provisionfake.Clean:
			cleans[s.Job.User]++
		}
	}
	for i, n := range names {
		user := served[n]
		if provisions[user] != 1 {
			t.Errorf("%s's user %s was provisioned %d times", n, user, provisions[user])
		}
		// The first clean failed once and was tried again: two; every other, one.
		want := 1
		if i == 0 {
			want = 2
		}
		if cleans[user] != want {
			t.Errorf("%s's user %s was removed %d times, want %d", n, user, cleans[user], want)
		}
	}
	if len(provisions) != len(names) {
		t.Errorf("users provisioned %v, want one for each of %v", provisions, names)
	}
	users := slices.Sorted(maps.Values(served))
	if len(slices.Compact(users)) != len(names) {
		t.Errorf("two tasks were handed the same user: %v", served)
	}
	if recs := h.records(); len(recs) > 0 {
		t.Errorf("records left: %+v", recs)
	}
	h.noBuildUsersLeft()
	t.Logf("%d reads answered from the past", lag.stale)
}

// TestATaskGoneBeforeTheCacheShowsItsRecordKeepsItsSlot: a tenant strips berth's finalizer off
// a TaskRun and deletes it while its build user is being made, and the cache has not shown the
// TaskRun's record yet. The reconcile of the gone TaskRun finds neither TaskRun nor record;
// it must not free the slot (the user may be on the host), only retry. Once the cache shows
// the record, the user is cleaned and only then is the waiter served.
func TestATaskGoneBeforeTheCacheShowsItsRecordKeepsItsSlot(t *testing.T) {
	var mu sync.Mutex
	hide := true // the cache has not seen any record yet
	hidden := func(l *berthv1.AllocationList) {
		mu.Lock()
		defer mu.Unlock()
		if hide {
			l.Items = nil
		}
	}
	faults := &interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			if l, ok := list.(*berthv1.AllocationList); ok {
				hidden(l)
			}
			return nil
		},
	}
	h := &harness{t: t, api: newAPIServer(), events: &eventLog{}, cfg: hostsConfig(1, "h1"), faults: faults}
	h.start()
	if done, err := h.r.line.restoreOnce(h.ctx); !done || err != nil {
		t.Fatalf("restore: %v, %v", done, err)
	}
	h.prov.Rule = func(provisionfake.Kind, provision.Job) (provision.Outcome, bool) { return provision.Outcome{}, false }
	doomed := h.create(userTaskRun("doomed", s390x))
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: tenantNS, Name: "doomed"}}
	if got, _, _ := h.queue.GetWithPriority(); got != req { // reconciled by hand below
		t.Fatalf("queued %v, want %v", got, req)
	}
	h.queue.Done(req)
	if _, err := h.r.Reconcile(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	running := h.prov.Running(provisionfake.Provision)
	if len(running) != 1 {
		t.Fatalf("provisions running: %v, want doomed's", running)
	}
	user := running[0].User

	tr := h.get("doomed")
	tr.Finalizers = nil
	if err := h.api.Update(h.ctx, tr); err != nil {
		t.Fatal(err)
	}
	if err := h.api.Delete(h.ctx, tr); err != nil {
		t.Fatal(err)
	}
	res, err := h.r.Reconcile(h.ctx, req)
	if err != nil || res.RequeueAfter <= 0 {
		t.Fatalf("the gone TaskRun's reconcile: %+v, %v; want a retry soon", res, err)
	}
	if holder, held := h.r.Capacity.Holder(taskOf(doomed)); !held {
		t.Fatalf("the gone task's slot was freed while its user %s is being made (holder %v)", user, holder)
	}
	waiter := h.create(userTaskRun("waiter", s390x))
	h.settle()
	h.waiting("waiter")

	mu.Lock()
	hide = false // the cache catches up
	mu.Unlock()
	h.enqueue("doomed")
	h.settle()
	if err := h.prov.End(provisionfake.Provision, user, provision.Outcome{}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if err := h.prov.End(provisionfake.Clean, user, provision.Outcome{}); err != nil {
		t.Fatalf("the gone task's user is not being cleaned: %v (host jobs %v)", err, h.hostJobs())
	}
	h.settle()
	if slices.Contains(h.prov.Users("h1"), user) {
		t.Errorf("the gone task's user %s is left on h1", user)
	}
	for _, j := range h.prov.Running(provisionfake.Provision) {
		if err := h.prov.End(provisionfake.Provision, j.User, provision.Outcome{}); err != nil {
			t.Fatal(err)
		}
	}
	h.settle()
	h.handedOver(waiter)
}
