//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	eventsv1 "k8s.io/api/events/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
)

// writeCounter counts, from a watch, the changes to each TaskRun of a namespace.
type writeCounter struct {
	mu     sync.Mutex
	writes map[string]int
}

func countWrites(t *testing.T, ns string) *writeCounter {
	t.Helper()
	wc, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: stack.ControlPlane.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var list pipelinev1.TaskRunList
	if err := wc.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	// From now on: the changes before the list are not counted.
	w, err := wc.Watch(context.Background(), &pipelinev1.TaskRunList{},
		&client.ListOptions{Namespace: ns, Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	c := &writeCounter{writes: map[string]int{}}
	go func() {
		for ev := range w.ResultChan() {
			if tr, ok := ev.Object.(*pipelinev1.TaskRun); ok && ev.Type == watch.Modified {
				c.mu.Lock()
				c.writes[tr.Name]++
				c.mu.Unlock()
			}
		}
	}()
	return c
}

func (c *writeCounter) of(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes[name]
}

// TestWaitingTaskRunsShowTheirPlaceInLine: each waiting TaskRun carries its place in line
// (1..n); while no place moves, berth writes nothing, however often it looks; a hand-over moves
// everyone behind it up, and the one served loses the annotation.
func TestWaitingTaskRunsShowTheirPlaceInLine(t *testing.T) {
	const interval = time.Second
	o := controllerOptions()
	o.QueuePositionInterval = interval
	restartController(t, o)
	t.Cleanup(func() { restartController(t, controllerOptions()) })
	applyConfig(t, 1, nil)
	ns := namespace(t)
	fills := fillEveryHost(t, ns)
	var waiters []*pipelinev1.TaskRun
	for i := range 4 {
		waiters = append(waiters, create(t, userTaskRun(ns, fmt.Sprintf("wait-%d", i), platform, "")))
	}
	positionsAre(t, waiters, "1", "2", "3", "4")

	// Three intervals, fifteen looks of the refresh loop: nothing moved, so nothing is written.
	writes := countWrites(t, ns)
	time.Sleep(3 * interval)
	for _, tr := range waiters {
		if n := writes.of(tr.Name); n != 0 {
			t.Errorf("%s was written %d times while its place did not move", tr.Name, n)
		}
	}

	finish(t, fills[0])
	ready(t, waiters[0])
	positionsAre(t, waiters, "", "1", "2", "3")

	for _, tr := range append(fills[1:], waiters...) {
		finish(t, tr)
	}
	settled(t, ns)
	for _, tr := range waiters {
		if v, ok := get(t, tr).Annotations[contract.QueuePositionAnnotation]; ok {
			t.Errorf("%s still shows place %q after it ended", tr.Name, v)
		}
	}
}

// positionsAre waits until each TaskRun's queue-position annotation is want ("" for none).
func positionsAre(t *testing.T, trs []*pipelinev1.TaskRun, want ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("the queue positions are %q", want), func() (bool, error) {
		var got []string
		for _, tr := range trs {
			got = append(got, get(t, tr).Annotations[contract.QueuePositionAnnotation])
		}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Errorf("positions %q", got)
	})
}

// TestFullAnnotationsLeaveTheTaskServed: a tenant fills its TaskRun's annotations to the
// apiserver's limit, leaving no room for berth's queue-position. The apiserver refuses any patch
// that adds it; berth still labels the TaskRun waiting (an Event says why it shows no place),
// serves it when a slot frees, and lets it go when it ends.
func TestFullAnnotationsLeaveTheTaskServed(t *testing.T) {
	applyConfig(t, 1, nil)
	ns := namespace(t)
	fills := fillEveryHost(t, ns)
	full := userTaskRun(ns, "full", platform, "")
	const key = "tenant.example/blob"
	full.Annotations = map[string]string{key: strings.Repeat("x", apivalidation.TotalAnnotationSizeLimitB-len(key))}
	full = create(t, full)
	eventually(t, "the full TaskRun is labelled waiting", func() (bool, error) {
		got := get(t, full)
		return got.Labels[contract.WaitingForPlatformLabel] != "", nil
	})
	if v, ok := get(t, full).Annotations[contract.QueuePositionAnnotation]; ok {
		t.Errorf("a queue-position %q was written past the annotations' limit", v)
	}
	eventually(t, "an AnnotationsFull Event on the TaskRun", func() (bool, error) {
		var events eventsv1.EventList
		if err := c().List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == "AnnotationsFull" && e.Regarding.Name == full.Name {
				return true, nil
			}
		}
		return false, nil
	})
	finish(t, fills[0])
	ready(t, full)
	if got := get(t, full); got.Labels[contract.WaitingForPlatformLabel] != "" || got.Labels[contract.AssignedHostLabel] == "" {
		t.Errorf("the served TaskRun's labels: %v", got.Labels)
	}
	for _, tr := range append(fills[1:], full) {
		finish(t, tr)
	}
	settled(t, ns)
}

// fillEveryHost takes every slot of the stack's hosts (one each) with a ready task of ns.
func fillEveryHost(t *testing.T, ns string) []*pipelinev1.TaskRun {
	t.Helper()
	var fills []*pipelinev1.TaskRun
	for i := range stackHosts {
		fills = append(fills, create(t, userTaskRun(ns, fmt.Sprintf("fill-%d", i), platform, "")))
	}
	for _, tr := range fills {
		ready(t, tr)
	}
	return fills
}
