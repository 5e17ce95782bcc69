package bench

import (
	"context"
	"testing"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/remote"
)

// TestSimulatedHostsAnswerBerthsHostCommands runs berth's own host side against a simulated
// host: if the host commands change so that the simulation no longer recognises them, the
// bench in SSH mode would measure failures, and this fails first.
func TestSimulatedHostsAnswerBerthsHostCommands(t *testing.T) {
	var answers hostAnswers
	fleet, err := sshfake.StartFleet(1, answers.answer)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	h := fleet.Servers[0]
	target := remote.Target{Address: h.Address, User: "root", Signer: fleet.AdminKey, HostKeys: remote.Pinned{Key: h.HostKey}}
	_, authorized, err := hostops.NewKey(config.DefaultKeyType, "bench")
	if err != nil {
		t.Fatal(err)
	}
	user := hostops.UserName("0b5e2a8c-3f7d-4c1e-9a6b-2d4f8e1c7a90", 1)
	side := provision.Hostops{MinFreeBytes: 1 << 30}
	ctx := context.Background()

	dir, err := side.CreateUser(ctx, target, provision.Job{User: user, AuthorizedKey: authorized})
	if err != nil {
		t.Fatalf("provisioning on the simulated host: %v", err)
	}
	if want := "/home/" + user + "/build"; dir != want {
		t.Errorf("user dir %q, want %q", dir, want)
	}
	if err := side.RemoveUser(ctx, target, "linux/s390x", user); err != nil {
		t.Fatalf("cleaning on the simulated host: %v", err)
	}
	if health := side.Check(ctx, target, "linux/s390x"); !health.Healthy {
		t.Fatalf("the simulated host is unhealthy: %s", health.Reason)
	}
	if p, c, k := answers.provisions.Load(), answers.cleans.Load(), answers.checks.Load(); p != 1 || c != 1 || k != 1 {
		t.Errorf("the host saw %d provisions, %d cleans, %d checks; want one each", p, c, k)
	}
	if got := len(h.Commands()); got < 3 {
		t.Errorf("the host recorded %d commands, want at least 3", got)
	}
}
