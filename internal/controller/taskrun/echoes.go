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
// An entry lives until the object is deleted, whatever events come in between: an event older
// than berth's write can still be on its way when the write is answered, and must not take
// the note away before the echo comes. berth holds one entry per object it wrote that still
// exists, and none for an object it never wrote.
type echoes struct {
	last sync.Map // types.UID → the resourceVersion of berth's last write
}

// note remembers what berth's write left on o (as the apiserver answered it).
func (e *echoes) note(o client.Object) {
	if uid, rv := o.GetUID(), o.GetResourceVersion(); uid != "" && rv != "" {
		e.last.Store(uid, rv)
	}
}

// of tells whether o, as a watch event shows it, is what berth's own last write of it left.
func (e *echoes) of(o client.Object) bool {
	rv, ok := e.last.Load(o.GetUID())
	return ok && rv == o.GetResourceVersion()
}

func (e *echoes) gone(uid types.UID) { e.last.Delete(uid) }

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

// noted notes o when err says the write succeeded and o is of what the task controller
// watches (whose deletion event will take the note away), and returns err.
func (c notingClient) noted(o client.Object, err error) error {
	if err == nil && watched(o) {
		c.echoes.note(o)
	}
	return err
}

// watched tells the objects whose events reach the task controller: TaskRuns (written as a
// whole or, by the mirror's patch, as metadata), records, and the secrets that carry the
// contract's label (the only ones in its cache).
func watched(o client.Object) bool {
	switch o := o.(type) {
	case *pipelinev1.TaskRun, *berthv1.Allocation:
		return true
	case *metav1.PartialObjectMetadata:
		return o.Kind == "TaskRun"
	case *corev1.Secret:
		_, labelled := o.Labels[contract.SecretLabel]
		return labelled
	}
	return false
}

// notEchoes passes every event but the echo of berth's own write; a deletion also drops what
// was noted of the object.
func (e *echoes) notEchoes() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(ev event.CreateEvent) bool { return !e.of(ev.Object) },
		UpdateFunc: func(ev event.UpdateEvent) bool { return !e.of(ev.ObjectNew) },
		DeleteFunc: func(ev event.DeleteEvent) bool {
			e.gone(ev.Object.GetUID())
			return true
		},
	}
}
