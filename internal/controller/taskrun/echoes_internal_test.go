package taskrun

import (
	"context"
	"fmt"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/kubescheme"
)

func taskRunAt(uid types.UID, rv string) *pipelinev1.TaskRun {
	tr := taskRunNamed("build")
	tr.UID, tr.ResourceVersion = uid, rv
	return tr
}

// The echo of berth's own write is held back by every watch that filters its kind, and its
// note goes once they all saw it; every other event of the object goes through: one older
// than the write that was still on its way, the next change (a tenant's edit, Tekton's
// status), an event berth's note came too late for, and a deletion, which also drops the note.
func TestOnlyTheEchoOfBerthsOwnWriteIsHeldBack(t *testing.T) {
	e := &echoes{}
	reconciles, firstLook := e.notEchoes(), e.notEchoes()
	e.note(taskRunAt("u1", "10"))
	for _, p := range []predicate.Predicate{reconciles, firstLook} {
		if !p.Update(event.UpdateEvent{ObjectOld: taskRunAt("u1", "8"), ObjectNew: taskRunAt("u1", "9")}) {
			t.Error("a change from before berth's write was held back")
		}
	}
	for _, p := range []predicate.Predicate{reconciles, firstLook} {
		if p.Update(event.UpdateEvent{ObjectOld: taskRunAt("u1", "9"), ObjectNew: taskRunAt("u1", "10")}) {
			t.Error("a watch let the echo of berth's write through")
		}
	}
	if e.held() != 0 {
		t.Errorf("%d notes kept after both TaskRun watches saw the echo", e.held())
	}
	if !reconciles.Update(event.UpdateEvent{ObjectOld: taskRunAt("u1", "10"), ObjectNew: taskRunAt("u1", "11")}) {
		t.Error("a change after berth's write was held back")
	}
	if !reconciles.Update(event.UpdateEvent{ObjectOld: taskRunAt("u2", "1"), ObjectNew: taskRunAt("u2", "2")}) {
		t.Error("an object berth never wrote: its event was held back")
	}

	// A record is filtered by one watch: its note goes at once.
	rec := &berthv1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: "r", UID: "r1", ResourceVersion: "3"}}
	e.note(rec)
	if reconciles.Create(event.CreateEvent{Object: rec}) || e.held() != 0 {
		t.Errorf("a record's echo went through, or its note stayed (%d notes kept)", e.held())
	}

	// The event came before berth noted its write: it went through, and so do the later ones;
	// the note goes with the object.
	if !reconciles.Create(event.CreateEvent{Object: taskRunAt("u3", "5")}) {
		t.Error("a create berth had not noted was held back")
	}
	e.note(taskRunAt("u3", "5"))
	if !reconciles.Update(event.UpdateEvent{ObjectOld: taskRunAt("u3", "5"), ObjectNew: taskRunAt("u3", "6")}) {
		t.Error("a tenant's edit after a late note was held back")
	}
	if !reconciles.Delete(event.DeleteEvent{Object: taskRunAt("u3", "6")}) {
		t.Error("a deletion was held back")
	}
	if e.held() != 0 {
		t.Errorf("%d notes outlived their objects", e.held())
	}

	// After a broken watch, the informer's one update from its old copy to the listed one
	// carries berth's version and Tekton's completion before it: the completion goes through.
	e.note(taskRunAt("u4", "21"))
	done := taskRunAt("u4", "21")
	done.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue, Reason: "Succeeded"})
	if !reconciles.Update(event.UpdateEvent{ObjectOld: taskRunAt("u4", "19"), ObjectNew: done}) {
		t.Error("an update that ends the TaskRun was held back for carrying berth's version")
	}
}

// The client's writes are noted with what the apiserver answered, for the kinds whose events
// reach the task controller only: a write of anything else would leave a note no event takes
// away.
func TestTheWritesOfWatchedKindsAreNoted(t *testing.T) {
	ctx := context.Background()
	e := &echoes{namespace: berthNS}
	c := e.noting(fake.NewClientBuilder().WithScheme(kubescheme.New()).Build())
	rec := &berthv1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: berthNS}}
	labelled := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "multi-platform-ssh-build", Namespace: "team",
		Labels: map[string]string{contract.SecretLabel: "true"}}}
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "team"}}
	// The controller's own namespace is left out of the secrets' cache, labelled or not.
	own := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "multi-platform-ssh-own", Namespace: berthNS,
		Labels: map[string]string{contract.SecretLabel: "true"}}}
	marker := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "marker", Namespace: berthNS}}
	tr := taskRunNamed("build")
	// The fake apiserver keeps the UIDs it is given (the real one makes them).
	for i, o := range []client.Object{rec, labelled, other, own, marker, tr} {
		o.SetUID(types.UID(fmt.Sprint("uid-", i)))
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	patched := tr.DeepCopy()
	patched.Labels = map[string]string{contract.AssignedHostLabel: "s390x-1"}
	if err := c.Patch(ctx, patched, client.MergeFrom(tr)); err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{rec, labelled, patched} {
		if !e.of(o) {
			t.Errorf("%T %s: the write was not noted as answered (uid %q resourceVersion %s)", o, o.GetName(), o.GetUID(), o.GetResourceVersion())
		}
	}
	for _, o := range []client.Object{other, own, marker} {
		if _, noted := e.last[o.GetUID()]; noted {
			t.Errorf("%T %s: noted, though no event of it reaches the controller", o, o.GetName())
		}
	}
	meta := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{UID: "u9", ResourceVersion: "3"}}
	meta.SetGroupVersionKind(pipelinev1.SchemeGroupVersion.WithKind("TaskRun"))
	if e.watches(meta) != taskRunWatches {
		t.Error("the mirror's patch answer (a TaskRun's metadata) is not a watched kind")
	}
}
