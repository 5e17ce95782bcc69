package allocation

import (
	"fmt"
	"testing"
)

// Queue lists the waiters in the order the ledger serves them, and agrees with Position (and
// so with the place Acquire tells a waiter).
func TestQueueIsTheServingOrder(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	l.Acquire(nsReq("x", 0))
	// x queues three, y two, z one; x was served last, so y and z go before it in each round.
	for _, r := range []Request{nsReq("x", 1), nsReq("x", 2), nsReq("x", 3), nsReq("y", 4), nsReq("y", 5), nsReq("z", 6)} {
		l.Acquire(r)
	}
	var got []string
	for _, task := range l.Queue("linux/s390x") {
		got = append(got, task.String())
	}
	want := "[y/t0004 z/t0006 x/t0001 y/t0005 x/t0002 x/t0003]"
	if fmt.Sprint(got) != want {
		t.Fatalf("queue %v, want %s", got, want)
	}
	for i, task := range l.Queue("linux/s390x") {
		if p := l.Position("linux/s390x", task); p != i+1 {
			t.Errorf("%v: Position %d, Queue index %d", task, p, i)
		}
	}
	if p := l.Position("linux/s390x", Task{"x", "t0000"}); p != 0 {
		t.Errorf("the holder has position %d, want 0", p)
	}
	// The slot goes to the head of the queue.
	if wake := l.Release(Task{"x", "t0000"}); len(wake) != 1 || wake[0] != (Task{"y", "t0004"}) {
		t.Fatalf("the freed slot woke %v, want y/t0004", wake)
	}
}

// A ledger rebuilt from records, told whose turn came when, orders its queue as the ledger
// that served those turns did.
func TestRestoredTurnsOrderTheQueueLikeServedOnes(t *testing.T) {
	live := New()
	live.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 2}})
	live.Acquire(nsReq("y", 0)) // y served first, then x
	live.Acquire(nsReq("x", 1))
	rebuilt := New()
	rebuilt.RestoreTurn("linux/s390x", "y")
	rebuilt.RestoreTurn("linux/s390x", "x")
	for _, r := range []Request{nsReq("x", 2), nsReq("y", 3), nsReq("x", 4)} {
		live.Acquire(r)
		rebuilt.Enqueue(r)
	}
	if a, b := fmt.Sprint(live.Queue("linux/s390x")), fmt.Sprint(rebuilt.Queue("linux/s390x")); a != b || a != "[y/t0003 x/t0002 x/t0004]" {
		t.Fatalf("live queue %s, rebuilt %s, want [y/t0003 x/t0002 x/t0004]", a, b)
	}
}
