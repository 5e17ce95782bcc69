package remote

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
)

// timers is a clock the test drives: each timer the pool starts is kept, and fires only when
// the test says so.
type timers struct {
	mu  sync.Mutex
	all []*timer
}

type timer struct {
	fire    func()
	stopped bool
}

func (ts *timers) after(_ time.Duration, f func()) func() bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := &timer{fire: f}
	ts.all = append(ts.all, t)
	return func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

func (ts *timers) started() []*timer {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]*timer(nil), ts.all...)
}

func (ts *timers) running() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	n := 0
	for _, t := range ts.all {
		if !t.stopped {
			n++
		}
	}
	return n
}

// A connection given back starts its idle time anew: the timer of an earlier stay in the pool
// neither outlives that stay nor closes the connection early, and many jobs on one host leave
// one timer running, not one per job.
func TestPoolIdleTimeStartsAnewAtEachReturn(t *testing.T) {
	fleet, err := sshfake.StartFleet(1, func(sshfake.Command) sshfake.Reply { return sshfake.Reply{Stdout: "ok"} })
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	host := fleet.Servers[0]
	clock := &timers{}
	pool := NewPool(time.Minute, 2)
	pool.after = clock.after
	defer pool.Close()
	target := Target{Address: host.Address, User: "root", Signer: fleet.AdminKey, HostKeys: Pinned{Key: host.HostKey}, Pool: pool}
	ctx := context.Background()
	job := func() {
		t.Helper()
		c, err := Dial(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := c.Run(ctx, "a job", "true", nil); err != nil || string(out) != "ok" {
			t.Fatalf("run: %q, %v", out, err)
		}
		c.Close()
	}

	for range 5 {
		job()
	}
	if got := host.Connections(); got != 1 {
		t.Fatalf("five jobs in a row opened %d connections, want 1", got)
	}
	started := clock.started()
	if len(started) != 5 {
		t.Fatalf("five returns to the pool started %d timers, want 5", len(started))
	}
	if got := clock.running(); got != 1 {
		t.Errorf("after five jobs %d idle timers still run, want 1 (the last return's)", got)
	}

	// The first stay's timer fires late, as a Stop that lost the race would let it: the
	// connection, idle again since, stays open and is lent to the next job.
	started[0].fire()
	job()
	if got := host.Connections(); got != 1 {
		t.Errorf("an earlier stay's timer closed the connection: %d connections, want 1", got)
	}

	// The current stay's timer ends it: the connection is closed, and the next job dials.
	last := clock.started()
	last[len(last)-1].fire()
	job()
	if got := host.Connections(); got != 2 {
		t.Errorf("after the idle time %d connections, want 2 (the idle one closed, one dialled)", got)
	}
}
