package allocation

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func nsReq(ns string, n int) Request {
	return Request{Task: Task{Namespace: ns, Name: fmt.Sprintf("t%04d", n)}, Platform: "linux/s390x", Created: t0.Add(time.Duration(n) * time.Millisecond)}
}

// A namespace that queued a thousand tasks first does not hold up another's one task: the
// next free slot goes to the namespace served least recently.
func TestAFloodingNamespaceDoesNotStarveAnother(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 2}})
	for i := range 1000 {
		l.Acquire(nsReq("flood", i))
	}
	late := nsReq("quiet", 5000)
	if g := l.Acquire(late); g.Host != "" || g.Position != 1 {
		t.Fatalf("the quiet namespace's task: %+v, want to wait first in line", g)
	}
	wake := l.Release(Task{"flood", "t0000"})
	if len(wake) != 1 || wake[0] != late.Task {
		t.Fatalf("the freed slot woke %v, want %v", wake, late.Task)
	}
	if g := l.Acquire(nsReq("flood", 2)); g.Host != "" {
		t.Fatal("the flood took the slot promised to the quiet namespace")
	}
	if g := l.Acquire(late); g.Host != "a" {
		t.Fatalf("the quiet namespace's task got %+v", g)
	}
	// Inside the flood, first created is still first served.
	if wake := l.Release(Task{"flood", "t0001"}); len(wake) != 1 || wake[0] != (Task{"flood", "t0002"}) {
		t.Fatalf("woke %v, want flood/t0002", wake)
	}
}

// Namespaces take turns: with three namespaces waiting, slots go round.
func TestNamespacesTakeTurns(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	l.Acquire(nsReq("x", 0))
	for i := 1; i <= 3; i++ {
		for _, ns := range []string{"x", "y", "z"} {
			l.Acquire(nsReq(ns, i*10+len(ns)))
		}
	}
	holder := Task{"x", "t0000"}
	var got []string
	for range 6 {
		wake := l.Release(holder)
		if len(wake) != 1 {
			t.Fatalf("woke %v", wake)
		}
		if g := l.Acquire(Request{Task: wake[0], Platform: "linux/s390x"}); g.Host != "a" {
			t.Fatalf("%v was woken but got %+v", wake[0], g)
		}
		holder = wake[0]
		got = append(got, holder.Namespace)
	}
	if fmt.Sprint(got) != "[y z x y z x]" {
		t.Fatalf("served %v, want turns y z x y z x (x was served last before)", got)
	}
}

// A namespace at its cap waits even with slots free, while others are served; when one of its
// tasks ends, its next waiter runs.
func TestNamespaceCapBoundsOneTenant(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 2}, {Name: "b", Platform: "linux/s390x", Capacity: 2}})
	l.SetNamespaceCaps(map[string]int{"linux/s390x": 2})
	var held []Task
	for i := range 4 {
		if g := l.Acquire(nsReq("greedy", i)); g.Host != "" {
			held = append(held, Task{"greedy", fmt.Sprintf("t%04d", i)})
		}
	}
	if len(held) != 2 {
		t.Fatalf("the capped namespace holds %d slots, want 2", len(held))
	}
	if g := l.Acquire(nsReq("other", 10)); g.Host == "" {
		t.Fatalf("another namespace waits although slots are free: %+v", g)
	}
	wake := l.Release(held[0])
	if len(wake) != 1 || wake[0] != (Task{"greedy", "t0002"}) {
		t.Fatalf("releasing a capped task woke %v, want greedy/t0002", wake)
	}
	// Raising the cap lets the rest in at once.
	if wake := l.SetNamespaceCaps(nil); len(wake) != 2 {
		t.Fatalf("lifting the cap woke %v, want both greedy waiters", wake)
	}
	// Never over-commit: capacity 4, held by 1 greedy + 1 other + the two woken.
	for _, w := range []int{2, 3} {
		l.Acquire(nsReq("greedy", w))
	}
	used := 0
	for _, u := range l.Usage() {
		if u.Used > u.Capacity {
			t.Fatalf("host %s over-committed: %+v", u.Host, u)
		}
		used += u.Used
	}
	if used != 4 {
		t.Fatalf("%d slots used, want all 4", used)
	}
}

// BenchmarkHandOverManyNamespaces: as BenchmarkHandOver, with 10,000 waiters in 100
// namespaces, so every hand-over interleaves the namespaces' turns.
func BenchmarkHandOverManyNamespaces(b *testing.B) {
	handOver(b, func(i int) Request { return nsReq(fmt.Sprintf("ns%02d", i%100), i) }, 10200)
}

// The place in line a waiter is told is its place in the turns.
func TestPositionsFollowTheTurns(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	l.Acquire(nsReq("x", 0)) // x holds the slot and was served last
	for i, ns := range []string{"x", "x", "x", "y", "z", "z"} {
		l.Acquire(nsReq(ns, i+1))
	}
	// Turns: y (never served), z (never served, younger head), x; round 2: z, x; round 3: x.
	want := map[string]int{"y/t0004": 1, "z/t0005": 2, "x/t0001": 3, "z/t0006": 4, "x/t0002": 5, "x/t0003": 6}
	for name, pos := range want {
		ns, n, _ := strings.Cut(name, "/")
		var num int
		fmt.Sscanf(n, "t%d", &num)
		if g := l.Acquire(nsReq(ns, num)); g.Position != pos {
			t.Errorf("%s is told position %d, want %d", name, g.Position, pos)
		}
	}
}

// A host that the config moves to another platform takes its tasks along: they count
// against the cap of the platform they now run on, and no longer against the old one's.
func TestAHostMovedToAnotherPlatformTakesItsTasksCapAlong(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 2}, {Name: "b", Platform: "linux/s390x", Capacity: 2}})
	l.SetNamespaceCaps(map[string]int{"linux/s390x": 1, "linux/arm64": 1})
	if g := l.Acquire(nsReq("x", 0)); g.Host != "a" {
		t.Fatalf("x/t0000 got %+v, want a", g)
	}
	if g := l.Acquire(nsReq("x", 1)); g.Host != "" {
		t.Fatalf("x/t0001 got %+v beyond the cap", g)
	}
	// a moves to arm64 with its task; on s390x x holds nothing now, so its waiter runs on b.
	wake := l.SetHosts([]Host{{Name: "a", Platform: "linux/arm64", Capacity: 2}, {Name: "b", Platform: "linux/s390x", Capacity: 2}})
	if len(wake) != 1 || wake[0] != (Task{"x", "t0001"}) {
		t.Fatalf("moving a woke %v, want x/t0001", wake)
	}
	// On arm64, x holds a's task: at its cap there.
	arm := Request{Task: Task{"x", "arm"}, Platform: "linux/arm64", Created: t0}
	if g := l.Acquire(arm); g.Host != "" || g.Position != 1 {
		t.Fatalf("x on arm64 got %+v, want to wait for its cap", g)
	}
	if wake := l.Release(Task{"x", "t0000"}); len(wake) != 1 || wake[0] != arm.Task {
		t.Fatalf("releasing the moved task woke %v, want %v", wake, arm.Task)
	}
}
