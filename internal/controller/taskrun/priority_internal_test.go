package taskrun

import (
	"context"
	"runtime"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
)

func taskRunNamed(name string) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name}}
}

func doneTaskRun(name string) *pipelinev1.TaskRun {
	tr := taskRunNamed(name)
	tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue})
	return tr
}

// TestHandOversGoBeforeArrivals: in the controller's work queue, a host job's end goes first; a
// wake-up and a TaskRun that has just ended are handed to a worker before arrivals queued
// earlier; an ended TaskRun's later events (berth's own patch taking its finalizer off) are
// not, nor one a start finds ended.
func TestHandOversGoBeforeArrivals(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	arrivals := &handler.EnqueueRequestForObject{}
	for _, name := range []string{"a1", "a2", "a3"} {
		arrivals.Create(ctx, event.CreateEvent{Object: taskRunNamed(name)}, q)
	}
	// No config in force: firstLook leaves arrivals to their reconcile.
	slots := capacity.New()
	r := &Reconciler{Config: hostconfig.NewStore(), Capacity: slots}
	r.init()
	look := r.firstLook()
	look.Update(ctx, event.UpdateEvent{ObjectOld: taskRunNamed("again"), ObjectNew: doneTaskRun("again")}, q)
	look.Update(ctx, event.UpdateEvent{ObjectOld: doneTaskRun("again"), ObjectNew: doneTaskRun("again")}, q)
	look.Update(ctx, event.UpdateEvent{ObjectOld: doneTaskRun("patched"), ObjectNew: doneTaskRun("patched")}, q)
	look.Create(ctx, event.CreateEvent{Object: taskRunNamed("a4")}, q)
	look.Create(ctx, event.CreateEvent{Object: doneTaskRun("long-ended"), IsInInitialList: true}, q)
	// A wake-up, through the channel source the controller watches.
	if err := slots.Source(handOverPriority).Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	slots.Wake(allocation.Task{Namespace: "team", Name: "woken"})
	// A host job's end, told as the provisioner tells it, through its own source.
	if err := slots.JobEnds(jobEndPriority).Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	slots.Notify("team/user-ready")
	for deadline := time.Now().Add(time.Minute); q.Len() < 6; runtime.Gosched() {
		if time.Now().After(deadline) { // the source's goroutine never moved it into the queue
			t.Fatalf("the wake-up never reached the queue (%d items)", q.Len())
		}
	}

	var order []string
	var first []int
	for q.Len() > 0 {
		item, priority, _ := q.GetWithPriority()
		order = append(order, item.Name)
		first = append(first, priority)
		q.Done(item)
	}
	want := []string{"user-ready", "again", "woken", "a1", "a2", "a3"}
	if len(order) != len(want) {
		t.Fatalf("queue handed out %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("queue handed out %v (priorities %v), want %v", order, first, want)
		}
	}
	if first[0] != jobEndPriority || first[1] != handOverPriority || first[2] != handOverPriority || first[3] != 0 {
		t.Fatalf("priorities %v: the job's end must go with jobEndPriority, the ended task and the wake-up with handOverPriority, arrivals with 0", first)
	}
}
