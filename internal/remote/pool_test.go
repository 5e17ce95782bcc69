package remote_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
	"github.com/berth-ci/berth/internal/remote"
)

func TestPoolReusesConnectionsAndRedialsDroppedOnes(t *testing.T) {
	fleet, err := sshfake.StartFleet(1, func(sshfake.Command) sshfake.Reply { return sshfake.Reply{Stdout: "ok"} })
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	host := fleet.Servers[0]
	pool := remote.NewPool(time.Minute, 2)
	defer pool.Close()
	target := remote.Target{Address: host.Address, User: "root", Signer: fleet.AdminKey, HostKeys: remote.Pinned{Key: host.HostKey}, Pool: pool}
	ctx := context.Background()
	job := func() {
		t.Helper()
		c, err := remote.Dial(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if out, err := c.Run(ctx, "a job", "true", nil); err != nil || string(out) != "ok" {
			t.Fatalf("run: %q, %v", out, err)
		}
	}
	for range 3 {
		job()
	}
	if got := host.Connections(); got != 1 {
		t.Errorf("three jobs in a row opened %d connections, want 1", got)
	}
	host.DropConnections()
	job()
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
	if c, err := remote.Dial(ctx, target); err == nil {
		c.Close()
		t.Fatal("a connection opened with one admin key was lent to another key")
	}
}
