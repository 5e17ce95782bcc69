//go:build stack

package taskrun_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/berth-ci/berth/internal/controller/taskrun"
)

// TestMirrorPatchesTestOnlyWhatTheyChange sends berth's mirror patches to the real apiserver:
// a write made after berth's read that touches nothing the patch changes (a status update, a
// label of someone else's) does not refuse it and survives it; a change of what the patch
// rests on (a finalizer added, a label berth replaces or removes edited) refuses it, as a
// conflict, and is kept.
func TestMirrorPatchesTestOnlyWhatTheyChange(t *testing.T) {
	ns := namespace(t)
	ctx := context.Background()
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "patched", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{
			Steps: []pipelinev1.Step{{Name: "s", Image: "busybox", Script: "true"}}}},
	}
	create(t, tr)
	read := func() *pipelinev1.TaskRun { return get(t, tr) }
	send := func(before, after *pipelinev1.TaskRun) error {
		t.Helper()
		patch, err := taskrun.MetadataPatch(&before.ObjectMeta, &after.ObjectMeta)
		if err != nil {
			t.Fatal(err)
		}
		return c().Patch(ctx, after.DeepCopy(), client.RawPatch(types.JSONPatchType, patch))
	}
	other := func(edit func(*pipelinev1.TaskRun)) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			now := read()
			edit(now)
			return c().Update(ctx, now)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	mustBe := func(what string, want map[string]string, finalizers ...string) {
		t.Helper()
		now := read()
		if !maps.Equal(now.Labels, want) || !slices.Equal(now.Finalizers, finalizers) {
			t.Fatalf("%s: labels %v finalizers %v, want %v %v", what, now.Labels, now.Finalizers, want, finalizers)
		}
	}

	// Onto a TaskRun without labels, annotations or finalizers, after someone else's write.
	base := read()
	other(func(now *pipelinev1.TaskRun) { now.Annotations = map[string]string{"tenant": "note"} })
	want := base.DeepCopy()
	want.Labels = map[string]string{"berth.dev/host": "h1", "example.com/b": "x"}
	want.Finalizers = []string{"berth.dev/finalizer"}
	if err := send(base, want); err != nil {
		t.Fatalf("a patch resting on nothing that changed was refused: %v", err)
	}
	mustBe("after the first patch", want.Labels, "berth.dev/finalizer")
	if read().Annotations["tenant"] != "note" {
		t.Fatal("the patch undid an annotation it does not change")
	}

	// A label of someone else's, set after the read, survives a patch of other labels.
	base = read()
	other(func(now *pipelinev1.TaskRun) { now.Labels["team"] = "a" })
	want = base.DeepCopy()
	want.Labels["berth.dev/host"] = "h2"
	delete(want.Labels, "example.com/b")
	if err := send(base, want); err != nil {
		t.Fatalf("a patch of other labels was refused: %v", err)
	}
	mustBe("after the second patch", map[string]string{"berth.dev/host": "h2", "team": "a"}, "berth.dev/finalizer")

	// A finalizer added after the read refuses a patch that rewrites the list, and stays.
	base = read()
	other(func(now *pipelinev1.TaskRun) { now.Finalizers = append(now.Finalizers, "tekton.dev/other") })
	want = base.DeepCopy()
	want.Finalizers = nil
	err := send(base, want)
	if err == nil || !taskrun.TestFailed(err) {
		t.Fatalf("removing the finalizer from a stale list: got %v, want a failed test", err)
	}
	mustBe("after the refused finalizer patch", map[string]string{"berth.dev/host": "h2", "team": "a"}, "berth.dev/finalizer", "tekton.dev/other")

	// A label berth replaces, changed after the read, refuses the patch.
	base = read()
	other(func(now *pipelinev1.TaskRun) { now.Labels["berth.dev/host"] = "tenant-edit" })
	want = base.DeepCopy()
	want.Labels["berth.dev/host"] = "h3"
	if err := send(base, want); err == nil || !taskrun.TestFailed(err) {
		t.Fatalf("replacing a label edited since the read: got %v, want a failed test", err)
	}

	// A patch the apiserver refuses on validation is an error, not a conflict to retry.
	base = read()
	want = base.DeepCopy()
	want.Labels["berth.dev/host"] = "not a label value"
	if err := send(base, want); err == nil || taskrun.TestFailed(err) {
		t.Fatalf("an invalid label value: got %v, want a refusal that is not a failed test", err)
	}

	// From an up-to-date read, everything of berth's goes and the rest stays.
	base = read()
	want = base.DeepCopy()
	delete(want.Labels, "berth.dev/host")
	want.Finalizers = []string{"tekton.dev/other"}
	if err := send(base, want); err != nil {
		t.Fatal(err)
	}
	mustBe("after the last patch", map[string]string{"team": "a"}, "tekton.dev/other")
	other(func(now *pipelinev1.TaskRun) { now.Finalizers = nil })
}

// TestTheEchoOfAMirrorPatchIsKnown: the mirror's patch, sent for the TaskRun's metadata alone,
// is answered by the real apiserver with the resourceVersion its watch event carries, so that
// event is held back; a tenant's edit after it and any other writer's change (the stack's
// Tekton and berth run beside the test) go through.
func TestTheEchoOfAMirrorPatchIsKnown(t *testing.T) {
	ns := namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := create(t, &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "echoed", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{
			Steps: []pipelinev1.Step{{Name: "s", Image: "busybox", Script: "true"}}}},
	})
	watching, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: c().Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watching.Watch(ctx, &pipelinev1.TaskRunList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	noting, notEchoes := taskrun.EchoFilter(c())
	// until reads the watch up to the event of resourceVersion rv and tells whether it went
	// through; every other event on the way must.
	until := func(rv string) bool {
		t.Helper()
		for {
			select {
			case ev, open := <-w.ResultChan():
				if !open {
					t.Fatal("the watch ended")
				}
				now, ok := ev.Object.(*pipelinev1.TaskRun)
				if !ok || now.Name != tr.Name {
					continue
				}
				passed := notEchoes.Update(event.UpdateEvent{ObjectOld: tr, ObjectNew: now})
				if now.ResourceVersion == rv {
					return passed
				}
				if !passed {
					t.Fatalf("a change of someone else's (resourceVersion %s) was held back", now.ResourceVersion)
				}
			case <-ctx.Done():
				t.Fatalf("no event of resourceVersion %s", rv)
			}
		}
	}

	before := get(t, tr)
	after := before.DeepCopy()
	after.Labels = map[string]string{"berth.dev/host": "h1"}
	after.Finalizers = []string{"berth.dev/finalizer"}
	patch, err := taskrun.MetadataPatch(&before.ObjectMeta, &after.ObjectMeta)
	if err != nil {
		t.Fatal(err)
	}
	answer := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: tr.Name, Namespace: ns}}
	answer.SetGroupVersionKind(pipelinev1.SchemeGroupVersion.WithKind("TaskRun"))
	if err := noting.Patch(ctx, answer, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		t.Fatal(err)
	}
	if until(answer.ResourceVersion) {
		t.Fatalf("the echo of berth's patch (resourceVersion %s, kind %q) went through", answer.ResourceVersion, answer.Kind)
	}

	var edited *pipelinev1.TaskRun
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		edited = get(t, tr)
		edited.Labels["berth.dev/host"] = "tenant-edit"
		return c().Update(ctx, edited)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !until(edited.ResourceVersion) {
		t.Fatal("a tenant's edit after berth's patch was held back")
	}
}
