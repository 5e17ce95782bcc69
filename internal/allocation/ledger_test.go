package allocation

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func task(n int) Task { return Task{Namespace: "ns", Name: fmt.Sprintf("t%02d", n)} }

func req(n int, exclude ...string) Request {
	return Request{Task: task(n), Platform: "linux/s390x", Created: t0.Add(time.Duration(n) * time.Second), Exclude: exclude}
}

func threeHosts() *Ledger {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 2}, {Name: "b", Platform: "linux/s390x", Capacity: 1}, {Name: "c", Platform: "linux/s390x", Capacity: 2}, {Name: "p", Platform: "linux/ppc64le", Capacity: 1}})
	return l
}

func TestMostFreeSlotsWinsTiesByName(t *testing.T) {
	l := threeHosts()
	var got []string
	for i := range 5 {
		got = append(got, l.Acquire(req(i)).Host)
	}
	// a(2) and c(2) tie → a; then c has 2 → c; then a, b, c tie at 1 → a; then b, c → b; then c.
	want := []string{"a", "c", "a", "b", "c"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("hosts %v, want %v", got, want)
	}
	if g := l.Acquire(req(5)); g.Host != "" || g.Position != 1 {
		t.Fatalf("a sixth task must wait first in line, got %+v", g)
	}
	if g := l.Acquire(req(0)); g.Host != "a" || !g.Held {
		t.Fatalf("asking again must return the held host, marked held, got %+v", g)
	}
}

func TestQueueIsFirstCreatedFirstServed(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	l.Acquire(req(0))
	// Tasks arrive out of creation order; the queue orders them by creation.
	for _, n := range []int{3, 1, 2} {
		if g := l.Acquire(req(n)); g.Host != "" {
			t.Fatalf("task %d got %s while the host is full", n, g.Host)
		}
	}
	if g := l.Acquire(req(3)); g.Position != 3 {
		t.Fatalf("position of the youngest = %d, want 3", g.Position)
	}
	for _, next := range []int{1, 2, 3} {
		holder := map[int]int{1: 0, 2: 1, 3: 2}[next]
		wake := l.Release(task(holder))
		if len(wake) != 1 || wake[0] != task(next) {
			t.Fatalf("releasing t%02d woke %v, want t%02d", holder, wake, next)
		}
		// A younger task asking first must not jump the queue.
		if next < 3 {
			if g := l.Acquire(req(3)); g.Host != "" {
				t.Fatalf("t03 took the slot promised to t%02d", next)
			}
		}
		if g := l.Acquire(req(next)); g.Host != "a" {
			t.Fatalf("t%02d did not get the freed slot: %+v", next, g)
		}
	}
}

func TestExcludedWaiterDoesNotBlockTheQueue(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}, {Name: "b", Platform: "linux/s390x", Capacity: 1}})
	l.Acquire(req(0))
	l.Acquire(req(1))
	l.Acquire(req(2, "a")) // failed on a before
	l.Acquire(req(3))
	wake := l.Release(task(0)) // a frees: t02 cannot use it, t03 can
	if len(wake) != 1 || wake[0] != task(3) {
		t.Fatalf("woke %v, want t03", wake)
	}
	if g := l.Acquire(req(3)); g.Host != "a" {
		t.Fatalf("t03 = %+v, want a", g)
	}
	if g := l.Acquire(req(2, "a")); g.Host != "" || g.Position != 1 {
		t.Fatalf("t02 = %+v, want to keep waiting, first", g)
	}
}

func TestTaskExcludedFromEveryHostIsBlocked(t *testing.T) {
	l := threeHosts()
	if g := l.Acquire(req(0, "a", "b", "c")); !g.Blocked || g.Host != "" {
		t.Fatalf("want Blocked, got %+v", g)
	}
	if n := l.Waiting()["linux/s390x"]; n != 0 {
		t.Fatalf("a blocked task must not stay queued, %d waiting", n)
	}
}

func TestRemovedHostKeepsItsTasksButTakesNoNewOnes(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}, {Name: "b", Platform: "linux/s390x", Capacity: 1}})
	l.Acquire(req(0)) // a
	l.SetHosts([]Host{{Name: "b", Platform: "linux/s390x", Capacity: 1}})
	if h, _ := l.Holder(task(0)); h != "a" {
		t.Fatal("removing a host from the config dropped the task running there")
	}
	if g := l.Acquire(req(1)); g.Host != "b" {
		t.Fatalf("got %+v, want b", g)
	}
	if g := l.Acquire(req(2)); g.Host != "" {
		t.Fatalf("the removed host took a new task: %+v", g)
	}
	l.Release(task(0))
	for _, u := range l.Usage() {
		if u.Host == "a" {
			t.Fatal("a retired host stays in the ledger after its last task")
		}
	}
}

func TestRestoreRebuildsHoldersEvenBeyondCapacity(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	l.Restore(task(0), "a", "linux/s390x")
	l.Restore(task(1), "a", "linux/s390x") // the config shrank while both ran
	if g := l.Acquire(req(2)); g.Host != "" {
		t.Fatalf("an over-full host took more: %+v", g)
	}
	if wake := l.Release(task(0)); len(wake) != 0 {
		t.Fatalf("one release of an over-full host must free nothing, woke %v", wake)
	}
	if wake := l.Release(task(1)); len(wake) != 1 {
		t.Fatalf("the second release frees the slot, woke %v", wake)
	}
}

func TestQuarantinedHostTakesNoTasksUntilReleased(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 2}})
	l.Quarantine("a", true)
	if g := l.Acquire(req(0)); g.Host != "" {
		t.Fatalf("a quarantined host took a task: %+v", g)
	}
	if wake := l.Quarantine("a", false); len(wake) != 1 || wake[0] != task(0) {
		t.Fatalf("lifting the quarantine woke %v", wake)
	}
}

func TestWaiterThatLeavesFreesItsTurn(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	l.Acquire(req(0))
	l.Acquire(req(1))
	l.Acquire(req(2))
	l.Release(task(1)) // t01 was deleted while waiting
	if wake := l.Release(task(0)); len(wake) != 1 || wake[0] != task(2) {
		t.Fatalf("woke %v, want t02", wake)
	}
}

// Many goroutines acquire and release at random; no host ever holds more than its capacity,
// and every task is eventually served.
func TestConcurrentUseNeverOvercommits(t *testing.T) {
	l := New()
	hosts := []Host{{Name: "a", Platform: "linux/s390x", Capacity: 2}, {Name: "b", Platform: "linux/s390x", Capacity: 2}, {Name: "c", Platform: "linux/s390x", Capacity: 2}}
	l.SetHosts(hosts)
	const tasks = 300
	var wg sync.WaitGroup
	served := make(chan Task, tasks)
	for i := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				g := l.Acquire(req(i))
				if g.Host != "" {
					for _, u := range l.Usage() {
						if u.Used > u.Capacity {
							t.Errorf("host %s holds %d of %d", u.Host, u.Used, u.Capacity)
						}
					}
					time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
					served <- task(i)
					l.Release(task(i))
					return
				}
				time.Sleep(50 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	close(served)
	if len(served) != tasks {
		t.Fatalf("served %d of %d", len(served), tasks)
	}
	if w := l.Waiting(); len(w) != 0 {
		t.Fatalf("waiters left: %v", w)
	}
}

// BenchmarkHandOver measures one slot changing hands on a busy platform: a task releases its
// slot, the next of 100 waiters is woken and claims it, and the finished task's name comes
// back as a new task at the end of the queue. 50 hosts x 4 slots, all busy.
func BenchmarkHandOver(b *testing.B) {
	handOver(b, func(i int) Request { return req(i) }, 300)
}

// handOver runs the hand-over benchmark on 50 hosts x 4 slots with tasks requests, of which
// 200 get a slot and the rest wait.
func handOver(b *testing.B, request func(int) Request, tasks int) {
	l := New()
	var hosts []Host
	for i := range 50 {
		hosts = append(hosts, Host{Name: fmt.Sprintf("h%02d", i), Platform: "linux/s390x", Capacity: 4})
	}
	l.SetHosts(hosts)
	var holders []Task
	for i := range tasks {
		r := request(i)
		if g := l.Acquire(r); g.Host != "" {
			holders = append(holders, r.Task)
		}
	}
	created := t0.Add(time.Hour)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		done := holders[i%len(holders)]
		wake := l.Release(done)
		if len(wake) != 1 {
			b.Fatalf("a release woke %d waiters, want 1", len(wake))
		}
		if g := l.Acquire(Request{Task: wake[0], Platform: "linux/s390x"}); g.Host == "" {
			b.Fatalf("the woken waiter got no slot: %+v", g)
		}
		holders[i%len(holders)] = wake[0]
		created = created.Add(time.Second)
		l.Acquire(Request{Task: done, Platform: "linux/s390x", Created: created})
	}
}

func TestEnqueuedWaitersKeepTheirTurnAfterARestart(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	// Restored: t00 holds a, t01 and t02 were waiting.
	l.Restore(task(0), "a", "linux/s390x")
	l.Enqueue(req(2))
	l.Enqueue(req(1))
	l.Release(task(0))
	if g := l.Acquire(req(5)); g.Host != "" || g.Position != 3 {
		t.Fatalf("a task first seen after the restart jumped the restored queue: %+v", g)
	}
	if g := l.Acquire(req(1)); g.Host != "a" {
		t.Fatalf("the oldest restored waiter did not get the slot: %+v", g)
	}
}

func TestTransferKeepsTheSlotBusy(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "h", Platform: "linux/arm64", Capacity: 1}})
	a, b := Task{Namespace: "ns", Name: "a"}, Task{Namespace: "ns", Name: "b"}
	debt := Task{Name: "debt/a"}
	if g := l.Acquire(Request{Task: a, Platform: "linux/arm64"}); g.Host != "h" {
		t.Fatalf("a got %+v, want h", g)
	}
	if !l.Transfer(a, debt) {
		t.Fatal("Transfer of a held slot reported nothing held")
	}
	if wake := l.Release(a); len(wake) != 0 {
		t.Fatalf("releasing the task after the transfer woke %v; its slot belongs to the debt", wake)
	}
	if g := l.Acquire(Request{Task: b, Platform: "linux/arm64"}); g.Host != "" {
		t.Fatalf("b got %s while the debt holds the only slot", g.Host)
	}
	if wake := l.Release(debt); len(wake) != 1 || wake[0] != b {
		t.Fatalf("paying the debt woke %v, want [b]", wake)
	}
	if l.Transfer(a, debt) {
		t.Fatal("Transfer from a task holding nothing reported success")
	}
}

func TestAdoptNeverOvercommits(t *testing.T) {
	l := threeHosts() // b takes 1
	if !l.Adopt(task(0), "b", "linux/s390x") {
		t.Fatal("adopting into a free slot was refused")
	}
	if !l.Adopt(task(0), "b", "linux/s390x") {
		t.Fatal("adopting the same task twice must be idempotent")
	}
	if l.Adopt(task(1), "b", "linux/s390x") {
		t.Fatal("a second task was adopted onto a full host")
	}
	if l.Adopt(task(2), "p", "linux/s390x") || l.Adopt(task(3), "nowhere", "linux/s390x") {
		t.Fatal("adopted onto a host of another platform, or an unknown one")
	}
	for _, u := range l.Usage() {
		if u.Used > u.Capacity {
			t.Fatalf("over-committed: %+v", u)
		}
	}
}

// TestRetiredVMStaysKnownUntilRemoved: after a restart, a VM retired before the crash is put
// back closed, whether or not a task still holds it (restored from its record first), and it
// stays known, free, once its last task goes: the planner terminates only VMs it sees free.
func TestRetiredVMStaysKnownUntilRemoved(t *testing.T) {
	vm := Host{Name: "vm-1", Platform: "linux/s390x", Capacity: 4}
	for _, held := range []bool{false, true} {
		l := New()
		if held {
			l.Restore(task(0), vm.Name, vm.Platform) // its task's record is read before the VM's
		}
		l.PutRetiredHost(vm)
		if g := l.Acquire(req(1)); g.Host != "" {
			t.Fatalf("held=%v: a retired VM took a new task: %+v", held, g)
		}
		l.Release(task(0))
		occ := l.HostOccupancy(vm.Name)
		if !occ.Known || !occ.Retired || occ.Used != 0 {
			t.Fatalf("held=%v: the retired VM after its last task: %+v, want known, retired and free", held, occ)
		}
		l.RemoveHost(vm.Name)
		if l.HostOccupancy(vm.Name).Known {
			t.Fatalf("held=%v: a removed VM is still known", held)
		}
	}
}

// A transfer onto a task that holds a slot already moves nothing: the slot the source holds by
// then (a new TaskRun of the same name) stays its own, and no slot is counted twice.
func TestTransferNeverTakesASecondSlot(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "h", Platform: "p", Capacity: 2}})
	task, debt := Task{Namespace: "ns", Name: "t"}, Task{Namespace: "ns", Name: "debt/t"}
	if g := l.Acquire(Request{Task: task, Platform: "p"}); g.Host != "h" {
		t.Fatalf("first: %+v", g)
	}
	if !l.Transfer(task, debt) {
		t.Fatal("the first transfer moved nothing")
	}
	if g := l.Acquire(Request{Task: task, Platform: "p"}); g.Host != "h" {
		t.Fatalf("the name's new TaskRun: %+v", g)
	}
	if l.Transfer(task, debt) {
		t.Fatal("a second transfer onto the debt took the new TaskRun's slot")
	}
	if _, held := l.Holder(task); !held {
		t.Fatal("the new TaskRun lost its slot")
	}
	l.Release(debt)
	if g := l.Acquire(Request{Task: Task{Namespace: "ns", Name: "other"}, Platform: "p"}); g.Host != "h" {
		t.Fatalf("the slot the debt freed was not free: %+v", g)
	}
}

func TestJoinTakesAPlaceInLineWithoutTakingASlot(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	if l.Knows(task(0), "linux/s390x") {
		t.Fatal("a task never seen is known to the ledger")
	}
	if !l.Join(req(0)) {
		t.Fatal("the first task joined an empty host's line and was not told it can go")
	}
	if !l.Knows(task(0), "linux/s390x") {
		t.Fatal("a task that joined is not known to the ledger")
	}
	if _, held := l.Holder(task(0)); held {
		t.Fatal("joining reserved a slot; only Acquire may")
	}
	if l.Join(req(0)) {
		t.Fatal("joining twice must leave the task as it is and wake nobody")
	}
	if g := l.Acquire(req(0)); g.Host != "a" {
		t.Fatalf("the joined task did not get the free slot: %+v", g)
	}
	if l.Join(req(0)) {
		t.Fatal("a holder that joins again must wake nobody")
	}
	if _, held := l.Holder(task(0)); !held || l.Waiting()["linux/s390x"] != 0 || !l.Knows(task(0), "linux/s390x") {
		t.Fatal("a holder that joins again must be left holding, not queued")
	}
	// Arrivals joined in any order wait in creation order, and only the first is told it can go.
	for _, n := range []int{3, 1, 2} {
		if l.Join(req(n)) {
			t.Fatalf("t%02d was told it can go while the host is full", n)
		}
	}
	wake := l.Release(task(0))
	if len(wake) != 1 || wake[0] != task(1) {
		t.Fatalf("the freed slot woke %v, want the oldest joined task t01", wake)
	}
	if g := l.Acquire(req(3)); g.Host != "" || g.Position != 3 {
		t.Fatalf("the youngest joined task jumped the line: %+v", g)
	}
	if g := l.Acquire(req(1)); g.Host != "a" {
		t.Fatalf("the oldest joined task did not get the slot: %+v", g)
	}
}
