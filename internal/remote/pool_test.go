package remote

import (
	"context"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
)

// pooledHost starts one SSH host that answers "ok" to every command, and returns it with a
// target that reaches it through pool.
func pooledHost(t *testing.T, pool *Pool) (*sshfake.Server, Target) {
	t.Helper()
	fleet, err := sshfake.StartFleet(1, func(sshfake.Command) sshfake.Reply { return sshfake.Reply{Stdout: "ok"} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	host := fleet.Servers[0]
	return host, Target{Address: host.Address, User: "root", Signer: fleet.AdminKey, HostKeys: Pinned{Key: host.HostKey}, Pool: pool}
}

// runJob dials target, runs one command and closes the connection (back to its pool).
func runJob(t *testing.T, target Target) {
	t.Helper()
	ctx := context.Background()
	c, err := Dial(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := c.Run(ctx, "a job", "true", nil); err != nil || string(out) != "ok" {
		t.Fatalf("run: %q, %v", out, err)
	}
}

func TestPoolReusesConnectionsAndRedialsDroppedOnes(t *testing.T) {
	pool := NewPool(time.Minute, 2)
	defer pool.Close()
	host, target := pooledHost(t, pool)
	for range 3 {
		runJob(t, target)
	}
	if got := host.Connections(); got != 1 {
		t.Errorf("three jobs in a row opened %d connections, want 1", got)
	}
	host.DropConnections()
	runJob(t, target)
	if got := host.Connections(); got != 2 {
		t.Errorf("after the host dropped the idle connection, %d connections in all, want 2 (one redial)", got)
	}
	if got := len(host.Commands()); got != 4 {
		t.Errorf("the host ran %d commands, want 4", got)
	}

	// Another admin key must not get the first key's connection.
	other, err := sshfake.StartFleet(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	target.Signer = other.AdminKey
	if c, err := Dial(context.Background(), target); err == nil {
		c.Close()
		t.Fatal("a connection opened with one admin key was lent to another key")
	}
}

// A connection given back starts its idle time anew: the timer of an earlier stay in the pool
// neither outlives that stay nor closes the connection early, and many jobs on one host leave
// one timer running, not one per job.
func TestPoolIdleTimeStartsAnewAtEachReturn(t *testing.T) {
	clock := testingclock.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	pool := NewPool(time.Minute, 2)
	pool.clock = clock
	defer pool.Close()
	host, target := pooledHost(t, pool)

	runJob(t, target)
	key := poolKey(target)
	first := pool.idle[key][0] // the first stay, which the next job ends
	for range 4 {
		runJob(t, target)
	}
	if got := host.Connections(); got != 1 {
		t.Fatalf("five jobs in a row opened %d connections, want 1", got)
	}
	if got := clock.Waiters(); got != 1 {
		t.Errorf("after five jobs %d idle timers still run, want 1 (the last return's)", got)
	}

	// The first stay's timer fires late, as a Stop that lost the race would let it: the
	// connection, idle again since, stays open and is lent to the next job.
	pool.expire(key, first)
	runJob(t, target)
	if got := host.Connections(); got != 1 {
		t.Errorf("an earlier stay's timer closed the connection: %d connections, want 1", got)
	}

	// The current stay's idle time passes: the connection is closed, and the next job dials.
	clock.Step(time.Minute)
	runJob(t, target)
	if got := host.Connections(); got != 2 {
		t.Errorf("after the idle time %d connections, want 2 (the idle one closed, one dialled)", got)
	}
}
