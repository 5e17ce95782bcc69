//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
)

// labelHistory keeps, from a watch, every value the assigned-host label of each TaskRun of a
// namespace took, in order ("" when absent), without repeats of the same value in a row.
type labelHistory struct {
	mu     sync.Mutex
	values map[string][]string
}

func watchHostLabels(t *testing.T, ns string) *labelHistory {
	t.Helper()
	wc, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: stack.ControlPlane.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(context.Background(), &pipelinev1.TaskRunList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	h := &labelHistory{values: map[string][]string{}}
	go func() {
		for ev := range w.ResultChan() {
			tr, ok := ev.Object.(*pipelinev1.TaskRun)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			h.mu.Lock()
			v := tr.Labels[contract.AssignedHostLabel]
			if seen := h.values[tr.Name]; len(seen) == 0 || seen[len(seen)-1] != v {
				h.values[tr.Name] = append(seen, v)
			}
			h.mu.Unlock()
		}
	}()
	return h
}

func (h *labelHistory) of(task string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.values[task])
}

// TestAWaitedTaskIsNeverShownWaitingAgain: a task that waited for a slot and then got one is
// labelled with its host once, until it ends; berth never shows it waiting again for a moment
// (it once mirrored the record copy it had just replaced), nor warns its owner of an edit
// nobody made (the next reconcile took that flip for a tenant's edit and reverted it).
func TestAWaitedTaskIsNeverShownWaitingAgain(t *testing.T) {
	applyConfig(t, 1, nil)
	ns := namespace(t)
	history := watchHostLabels(t, ns)
	var fills []*pipelinev1.TaskRun
	for i := range stackHosts {
		fills = append(fills, create(t, userTaskRun(ns, fmt.Sprintf("fill-%d", i), platform, "")))
	}
	for _, tr := range fills {
		ready(t, tr)
	}
	waiters := []*pipelinev1.TaskRun{create(t, userTaskRun(ns, "waiter-0", platform, "")), create(t, userTaskRun(ns, "waiter-1", platform, ""))}
	for _, tr := range waiters {
		waiting(t, tr)
	}
	for i, tr := range waiters {
		finish(t, fills[i])
		ready(t, tr)
	}
	for _, tr := range append(fills[len(waiters):], waiters...) {
		finish(t, tr)
	}
	settled(t, ns)
	for _, tr := range waiters {
		host := recordHostSeen(history.of(tr.Name))
		if want := []string{"", host, ""}; host == "" || !slices.Equal(history.of(tr.Name), want) {
			t.Errorf("%s: assigned-host went %q, want it set once and removed once", tr.Name, history.of(tr.Name))
		}
	}
	var events eventsv1.EventList
	if err := c().List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeWarning {
			t.Errorf("warning on %s: %s: %s", e.Regarding.Name, e.Reason, e.Note)
		}
	}
	noBuildUsersLeft(t)
}

// recordHostSeen is the first host a label history names.
func recordHostSeen(values []string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
