package taskrun

import (
	"fmt"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/allocation"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestAMovedPlaceIsWrittenAtMostOncePerInterval(t *testing.T) {
	last := positionMark{position: 5, at: t0}
	for _, tc := range []struct {
		name      string
		written   bool
		position  int
		after     time.Duration
		want      int
		wantAfter time.Duration
	}{
		{"first write: at once", false, 5, 0, 5, 0},
		{"unmoved: the same (no write)", true, 5, time.Second, 5, 0},
		{"moved too soon: the last one stands until the interval is up", true, 3, 4 * time.Second, 5, 6 * time.Second},
		{"moved after the interval: written", true, 3, 10 * time.Second, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, wait := heldPosition(last, tc.written, tc.position, t0.Add(tc.after), 10*time.Second)
			if got != tc.want || wait != tc.wantAfter {
				t.Fatalf("got %d, wait %s; want %d, wait %s", got, wait, tc.want, tc.wantAfter)
			}
		})
	}
}

// The refresh loop wakes only waiters whose shown place moved and may be rewritten, front of the
// queues first and within its budget, and forgets those that wait no more.
func TestRefreshWakesMovedPlacesFrontFirst(t *testing.T) {
	l := allocation.New()
	l.SetHosts([]allocation.Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	task := func(i int) allocation.Task { return allocation.Task{Namespace: "ns", Name: fmt.Sprintf("t%d", i)} }
	for i := range 6 {
		l.Acquire(allocation.Request{Task: task(i), Platform: "linux/s390x", Created: t0.Add(time.Duration(i) * time.Second)})
	}
	now := t0.Add(time.Minute)
	r := &Reconciler{Ledger: l, PositionInterval: 10 * time.Second, now: func() time.Time { return now }}
	// t1..t5 wait at 1..5; shown: t1 at 2 (moved), t2 at 2 (unmoved), t3 at 4 (moved, written
	// just now), t4 at 5 (moved), t5 at 6 (moved); and a mark of t0, which holds the slot.
	for i, mark := range map[int]positionMark{0: {position: 1, at: t0}, 1: {position: 2, at: t0}, 2: {position: 2, at: t0},
		3: {position: 4, at: now.Add(-time.Second)}, 4: {position: 5, at: t0}, 5: {position: 6, at: t0}} {
		r.positions.Store(task(i), mark)
	}
	if got := fmt.Sprint(r.movedPositions(2)); got != fmt.Sprint([]allocation.Task{task(1), task(4)}) {
		t.Fatalf("woke %s, want ns/t1 and ns/t4", got)
	}
	if _, ok := r.positions.Load(task(0)); ok {
		t.Fatal("the mark of a task that waits no more was kept")
	}
}
