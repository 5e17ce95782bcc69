package taskrun

import (
	"fmt"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/controller/capacity"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// task is the i-th task of oneSlotLedger.
func task(i int) allocation.Task {
	return allocation.Task{Namespace: "ns", Name: fmt.Sprintf("t%d", i)}
}

// oneSlotLedger has one host of one slot on linux/s390x, held by task 0, and tasks 1..n-1
// waiting in the order of their creation.
func oneSlotLedger(n int) *capacity.Capacity {
	l := capacity.New()
	l.SetHosts([]allocation.Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	for i := range n {
		l.Acquire(allocation.Request{Task: task(i), Platform: "linux/s390x", Created: t0.Add(time.Duration(i) * time.Second)})
	}
	return l
}

// A place not shown yet is shown as it is; a place shown already is rewritten only when the
// refresh loop made it due, once.
func TestAShownPlaceMovesOnlyWhenTheRefreshLoopSays(t *testing.T) {
	l := oneSlotLedger(3)
	m := &taskMirror{capacity: l, positionInterval: time.Minute, now: func() time.Time { return t0 }}
	tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t2", UID: "uid-2"}}
	rec := &berthv1.Allocation{Spec: berthv1.AllocationSpec{Platform: "linux/s390x"}}
	if got := m.queuePosition(tr, rec); got != 2 {
		t.Fatalf("a place not shown yet: %d, want 2", got)
	}
	m.notePosition(tr, 2)
	l.Release(task(0)) // t1 takes the slot: t2 moves up to 1
	if g := l.Acquire(allocation.Request{Task: task(1), Platform: "linux/s390x", Created: t0.Add(time.Second)}); g.Host != "a" {
		t.Fatalf("t1 did not get the freed slot: %+v", g)
	}
	if got := m.queuePosition(tr, rec); got != 2 {
		t.Fatalf("a moved place the loop has not made due: %d, want the 2 shown", got)
	}
	m.refreshDue.Store(task(2), struct{}{})
	if got := m.queuePosition(tr, rec); got != 1 {
		t.Fatalf("a moved place made due: %d, want 1", got)
	}
	if _, still := m.refreshDue.Load(task(2)); still {
		t.Fatal("the refresh was not used up by the rewrite")
	}
}

// The refresh loop wakes only waiters whose shown place moved and may be rewritten, front of the
// queues first and within its budget, and forgets those that wait no more.
func TestRefreshWakesMovedPlacesFrontFirst(t *testing.T) {
	l := oneSlotLedger(6)
	now := t0.Add(time.Minute)
	m := &taskMirror{capacity: l, positionInterval: 10 * time.Second, now: func() time.Time { return now }}
	// t1..t5 wait at 1..5; shown: t1 at 2 (moved), t2 at 2 (unmoved), t3 at 4 (moved, written
	// just now), t4 at 5 (moved), t5 at 6 (moved); and a mark of t0, which holds the slot.
	for i, mark := range map[int]positionMark{0: {position: 1, at: t0}, 1: {position: 2, at: t0}, 2: {position: 2, at: t0},
		3: {position: 4, at: now.Add(-time.Second)}, 4: {position: 5, at: t0}, 5: {position: 6, at: t0}} {
		m.positions.Store(task(i), mark)
	}
	if got := fmt.Sprint(m.movedPositions(m.waiterPlaces(), 2)); got != fmt.Sprint([]allocation.Task{task(1), task(4)}) {
		t.Fatalf("woke %s, want ns/t1 and ns/t4", got)
	}
	if _, ok := m.positions.Load(task(0)); ok {
		t.Fatal("the mark of a task that waits no more was kept")
	}
}

// A waiter not shown that it waits at two looks in a row is put first, back of the queues
// first and within the budget; one shown meanwhile, or served, is not.
func TestRefreshPutsFirstWaitersLeftUnlabelled(t *testing.T) {
	l := oneSlotLedger(6) // t0 holds the slot, t1..t5 wait
	m := &taskMirror{capacity: l, positionInterval: 10 * time.Second, now: func() time.Time { return t0 }}
	m.positions.Store(task(2), positionMark{position: 2, at: t0}) // t2 was shown its place
	if got := m.unshownWaiters(m.waiterPlaces(), 2); len(got) != 0 {
		t.Fatalf("at the first look woke %s; a waiter gets a look's time to be labelled", got)
	}
	m.positions.Store(task(3), positionMark{position: 3, at: t0}) // t3 is shown between the looks
	if got, want := fmt.Sprint(m.unshownWaiters(m.waiterPlaces(), 2)), fmt.Sprint([]allocation.Task{task(5), task(4)}); got != want {
		t.Fatalf("at the second look woke %s, want %s", got, want)
	}
	// t1 is served; t4 and t5 are still unlabelled (their reconciles queued behind hand-overs).
	l.Release(task(0))
	if g := l.Acquire(allocation.Request{Task: task(1), Platform: "linux/s390x", Created: t0.Add(time.Second)}); g.Host != "a" {
		t.Fatalf("t1 did not get the freed slot: %+v", g)
	}
	if got, want := fmt.Sprint(m.unshownWaiters(m.waiterPlaces(), 5)), fmt.Sprint([]allocation.Task{task(5), task(4)}); got != want {
		t.Fatalf("at the third look woke %s, want %s", got, want)
	}
}
