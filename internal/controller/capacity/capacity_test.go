package capacity

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/allocation"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func task(name string) allocation.Task { return allocation.Task{Namespace: "team", Name: name} }

// woken drains what Wake has sent so far.
func woken(c *Capacity) []string {
	var names []string
	for {
		select {
		case ev := <-c.wakeups:
			names = append(names, ev.Object.Name)
		default:
			return names
		}
	}
}

// oneSlot is a capacity of one host of one slot, held by "first", with "second" in line.
func oneSlot(t *testing.T) *Capacity {
	c := New()
	c.SetHosts([]allocation.Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}})
	if g := c.Acquire(allocation.Request{Task: task("first"), Platform: "linux/s390x", Created: t0}); g.Host != "a" {
		t.Fatalf("first got %+v, want host a", g)
	}
	if g := c.Acquire(allocation.Request{Task: task("second"), Platform: "linux/s390x", Created: t0.Add(time.Second)}); g.Host != "" {
		t.Fatalf("second got %+v, want to wait", g)
	}
	woken(c)
	return c
}

// Releasing a slot wakes the task next in line, with no wake-up asked by the caller.
func TestAReleaseWakesTheNextInLine(t *testing.T) {
	c := oneSlot(t)
	c.Release(task("first"))
	if got := woken(c); !slices.Equal(got, []string{"second"}) {
		t.Errorf("after the release, woken %v; want [second]", got)
	}
}

// A host back from quarantine, a new host and a raised cap wake whoever can go now.
func TestCapacityThatComesWakesItsWaiters(t *testing.T) {
	for name, free := range map[string]func(c *Capacity){
		"quarantine lifted": func(c *Capacity) {
			c.Quarantine("a", true)
			c.Release(task("first"))
			woken(c) // the slot freed on a host out of service: nobody can go
			c.Quarantine("a", false)
		},
		"a VM added": func(c *Capacity) {
			c.PutHost(allocation.Host{Name: "vm-1", Platform: "linux/s390x", Capacity: 1})
		},
		"the config adds a host": func(c *Capacity) {
			c.SetHosts([]allocation.Host{{Name: "a", Platform: "linux/s390x", Capacity: 1}, {Name: "b", Platform: "linux/s390x", Capacity: 1}})
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := oneSlot(t)
			free(c)
			if got := woken(c); !slices.Equal(got, []string{"second"}) {
				t.Errorf("woken %v; want [second]", got)
			}
		})
	}
}

// A cleanup debt holds a slot but is no TaskRun: waking it would reconcile a name no TaskRun
// has, which would release what the debt holds.
func TestDebtsAreNeverWoken(t *testing.T) {
	c := New()
	c.Wake(task(DebtPrefix+"uid/u-1"), task("build"))
	if got := woken(c); !slices.Equal(got, []string{"build"}) {
		t.Errorf("woken %v; want [build]", got)
	}
}

// A burst of wake-ups larger than the channel never blocks the caller and loses none.
func TestWakeNeverBlocksNorDrops(t *testing.T) {
	c := New()
	n := wakeBuffer + 100
	for i := range n {
		c.Wake(allocation.Task{Namespace: "team", Name: string(rune('a'+i%26)) + time.Duration(i).String()})
	}
	for got := 0; got < n; got++ {
		select {
		case <-c.wakeups:
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d wake-ups arrived", got, n)
		}
	}
}

// A host job's end, told by the provisioner as "namespace/name", wakes that task, apart from
// the other wake-ups (JobEnds queues it first).
func TestAHostJobsEndWakesItsTask(t *testing.T) {
	c := New()
	c.Notify("team/build-1")
	if got := woken(c); len(got) != 0 {
		t.Errorf("a job's end went with the other wake-ups: %v", got)
	}
	select {
	case ev := <-c.jobEnds:
		if ev.Object != (allocation.Task{Namespace: "team", Name: "build-1"}) {
			t.Errorf("woken %+v; want team/build-1", ev.Object)
		}
	default:
		t.Error("nothing woken")
	}
}

// A task woken and not yet reconciled is not sent again: each freed slot and each
// reservation tells every task that can go now, and the reconcile already on its way reads
// the ledger as it is when it starts. Once it starts, the next wake-up goes out again.
func TestAWokenTaskIsSentOnceUntilItsReconcileStarts(t *testing.T) {
	c := New()
	c.SetHosts([]allocation.Host{{Name: "a", Platform: "linux/s390x", Capacity: 3}})
	for i, name := range []string{"first", "second", "third", "fourth"} {
		c.Acquire(allocation.Request{Task: task(name), Platform: "linux/s390x", Created: t0.Add(time.Duration(i) * time.Second)})
	}
	woken(c)
	c.Release(task("first")) // fourth can go
	c.Release(task("second"))
	if got := woken(c); !slices.Equal(got, []string{"fourth"}) {
		t.Fatalf("after two releases, woken %v; want [fourth] once", got)
	}
	c.Reconciling(task("fourth"))
	c.Release(task("third"))
	if got := woken(c); !slices.Equal(got, []string{"fourth"}) {
		t.Errorf("after its reconcile started, woken %v; want [fourth] again", got)
	}
	c.Wake(task("fifth"), task("fifth"))
	if got := woken(c); !slices.Equal(got, []string{"fifth"}) {
		t.Errorf("woken %v; want [fifth] once", got)
	}
}

// BenchmarkHandOverOnABusyPlatform: a platform under a burst, its slots held by 70% of its
// capacity and the rest promised to the first tasks in line, which wait for their reconcile,
// with as many again behind them: at 50 hosts x 4 what the bench's `static --scale 1` shows,
// at 500 x 8 its `large` scenario. Each iteration is one hand-over: a holder's slot is freed,
// a task joins the line, and the first in line, reconciled, takes a slot. wakes/op counts
// what Wake sent on the channel, each of which the task controller's queue takes in.
func BenchmarkHandOverOnABusyPlatform(b *testing.B) {
	for _, size := range []struct{ hosts, slots int }{{50, 4}, {500, 8}} {
		b.Run(fmt.Sprintf("%dx%d", size.hosts, size.slots), func(b *testing.B) {
			benchmarkHandOver(b, size.hosts, size.slots)
		})
	}
}

func benchmarkHandOver(b *testing.B, hostCount, slots int) {
	const platform = "linux/s390x"
	c := New()
	hosts := make([]allocation.Host, hostCount)
	for i := range hosts {
		hosts[i] = allocation.Host{Name: fmt.Sprintf("h-%03d", i), Platform: platform, Capacity: slots}
	}
	c.SetHosts(hosts)
	capacity := hostCount * slots
	held, promised := capacity*7/10, capacity-capacity*7/10
	created := t0
	next := 0
	newTask := func() allocation.Request {
		next++
		created = created.Add(time.Millisecond)
		return allocation.Request{Task: task(fmt.Sprintf("t-%06d", next)), Platform: platform, Created: created}
	}
	var holders []allocation.Task
	for range held {
		req := newTask()
		if g := c.Acquire(req); g.Host == "" {
			b.Fatalf("%s got no slot", req.Task.Name)
		}
		holders = append(holders, req.Task)
	}
	var line []allocation.Request
	for range 2 * promised {
		req := newTask()
		c.Join(req)
		line = append(line, req)
	}
	for _, req := range line[:promised] {
		c.Wake(req.Task) // those that can go are woken, their reconciles queued
	}
	woken(c)
	wakes := 0
	b.ResetTimer()
	for range b.N {
		c.Release(holders[0])
		holders = holders[1:]
		first := line[0]
		line = append(line[1:], newTask())
		c.Join(line[len(line)-1])
		c.Reconciling(first.Task)
		if g := c.Acquire(first); g.Host == "" {
			b.Fatalf("%s, first in line, got no slot", first.Task.Name)
		}
		holders = append(holders, first.Task)
		wakes += len(woken(c))
	}
	b.ReportMetric(float64(wakes)/float64(b.N), "wakes/op")
}
