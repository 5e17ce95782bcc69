package taskrun

import (
	"context"
	"sync"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
)

// echoes remembers the resourceVersion berth's own last write left on each object it wrote (a
// TaskRun's mirrors, a record, a secret), so that the watch event of that very write, its echo,
// starts no reconcile: the pass that wrote it did what the write was for, and a reconcile
// started by it would find nothing to do but would still take a worker, read the cache and
// copy the task's objects, several times for every task. Any other change of the object (a
// tenant's edit, Tekton's status, a later write of berth's) carries another resourceVersion
// and goes through as before.
//
// A note goes once every watch that filters the object's kind has seen its echo (TaskRuns
// have two: the reconcile's and firstLook), or with the object's deletion. Other events do not
// take it away: one older than the write can still be on its way when the write is answered.
// So berth holds notes for the writes whose echo has not come yet, and, when an echo came
// before its write was answered, one note per such object until the object is deleted.
type echoes struct {
	// namespace is the controller's own: its secrets are not in the task controller's cache
	// (CacheOptions), so no event of theirs comes to take a note away.
	namespace string
	mu        sync.Mutex
	last      map[types.UID]*echo
}

// echo is what berth's last write left on an object, and how many watches are still to see it.
type echo struct {
	resourceVersion string
	watches         int
}

// note remembers what berth's write left on o (as the apiserver answered it), when o is of
// what the task controller watches (whose echo or deletion will take the note away).
func (e *echoes) note(o client.Object) {
	uid, rv, watches := o.GetUID(), o.GetResourceVersion(), e.watches(o)
	if uid == "" || rv == "" || watches == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last == nil {
		e.last = map[types.UID]*echo{}
	}
	e.last[uid] = &echo{resourceVersion: rv, watches: watches}
}

// of tells whether o, as a watch event shows it, is what berth's own last write of it left;
// the note goes when the last watch that filters o's kind has seen it.
func (e *echoes) of(o client.Object) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, ok := e.last[o.GetUID()]
	if !ok || n.resourceVersion != o.GetResourceVersion() {
		return false
	}
	if n.watches--; n.watches <= 0 {
		delete(e.last, o.GetUID())
	}
	return true
}

func (e *echoes) gone(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.last, uid)
}

// held is how many notes are kept.
func (e *echoes) held() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.last)
}

// taskRunWatches is how many of the task controller's watches of TaskRuns filter echoes (the
// reconcile's and firstLook; see SetupWithManager).
const taskRunWatches = 2

// noting is c with every create, update and patch that succeeds noted. berth writes no
// subresource of what it watches, so Status and SubResource are c's own.
func (e *echoes) noting(c client.Client) client.Client { return notingClient{Client: c, echoes: e} }

type notingClient struct {
	client.Client
	echoes *echoes
}

func (c notingClient) Create(ctx context.Context, o client.Object, opts ...client.CreateOption) error {
	return c.noted(o, c.Client.Create(ctx, o, opts...))
}

func (c notingClient) Update(ctx context.Context, o client.Object, opts ...client.UpdateOption) error {
	return c.noted(o, c.Client.Update(ctx, o, opts...))
}

func (c notingClient) Patch(ctx context.Context, o client.Object, p client.Patch, opts ...client.PatchOption) error {
	return c.noted(o, c.Client.Patch(ctx, o, p, opts...))
}

// noted notes o when err says the write succeeded, and returns err.
func (c notingClient) noted(o client.Object, err error) error {
	if err == nil {
		c.echoes.note(o)
	}
	return err
}

// watches is how many of the task controller's watches filter the echoes of o's kind, 0 for
// an object whose events never reach it. They reach it for TaskRuns (written as a whole or, by
// the mirror's patch, as metadata), records, and the secrets of tenants' namespaces that carry
// the contract's label (the only ones in its cache).
func (e *echoes) watches(o client.Object) int {
	switch o := o.(type) {
	case *pipelinev1.TaskRun:
		return taskRunWatches
	case *metav1.PartialObjectMetadata:
		if o.Kind == "TaskRun" {
			return taskRunWatches
		}
	case *berthv1.Allocation:
		return 1
	case *corev1.Secret:
		if _, labelled := o.Labels[contract.SecretLabel]; labelled && o.Namespace != e.namespace {
			return 1
		}
	}
	return 0
}

// notEchoes passes every event but the echo of berth's own write; a deletion also drops what
// was noted of the object. An update that ends a TaskRun always passes (endsHere).
func (e *echoes) notEchoes() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(ev event.CreateEvent) bool { return !e.of(ev.Object) },
		UpdateFunc: func(ev event.UpdateEvent) bool { return !e.of(ev.ObjectNew) || endsHere(ev.ObjectOld, ev.ObjectNew) },
		DeleteFunc: func(ev event.DeleteEvent) bool {
			e.gone(ev.Object.GetUID())
			return true
		},
	}
}

// endsHere tells an update that ends a TaskRun: Tekton's completion, or the deletion's mark.
// berth makes neither, so such an update carries another's change even when its version is
// berth's. It happens when a watch breaks: the informer lists again and sends one update from
// its old copy to the listed one, and every change between the two is folded into it.
func endsHere(old, updated client.Object) bool {
	o, ok := old.(*pipelinev1.TaskRun)
	n, ok2 := updated.(*pipelinev1.TaskRun)
	return ok && ok2 && !ended(o) && ended(n)
}
