package capacity

import (
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
