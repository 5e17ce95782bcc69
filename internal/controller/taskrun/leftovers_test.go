//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// TestABuildUsersLeftoversCostOnlyItsOwnSlot: a build user leaves on its host what its clean
// cannot remove (here a mount of its own on /tmp, which root's rm cannot take away). Its clean
// fails again and again, past the count that quarantines a host, yet the host stays in service
// and serves another tenant; the user's slot stays owed and counts against its namespace's
// max-tasks-per-namespace, so the dirty tenant's next task waits though the host has a free
// slot. The host's record and an Event on it say what was left. Once what was left can go,
// the retried clean removes the user and the tenant's next task runs.
func TestABuildUsersLeftoversCostOnlyItsOwnSlot(t *testing.T) {
	o := controllerOptions()
	// Quarantine for cleans is on only with host checks; one check at start, none after.
	o.HostCheckInterval = time.Hour
	restartController(t, o)
	defer restartController(t, controllerOptions())
	applyConfig(t, 2, map[string]string{"max-tasks-per-namespace": "1"})
	hosts := hostsByName()
	host := hosts[0]
	for _, h := range hosts[1:] {
		mustBerthHost(t, "drain", h.Name)
	}
	defer func() {
		for _, h := range hosts[1:] {
			if _, err := berthHost(t, "undrain", h.Name); err != nil {
				t.Errorf("undrain %s: %v", h.Name, err)
			}
		}
	}()
	dirtyNS := namespace(t)
	otherNS := secondNamespace(t, "other")
	ctx := context.Background()

	first := create(t, userTaskRun(dirtyNS, "leaves-a-mount", platform, ""))
	rec := ready(t, first)
	if rec.Status.Login.Host != host.Name {
		t.Fatalf("the task went to %s; only %s is not drained", rec.Status.Login.Host, host.Name)
	}
	user := rec.Status.BuildUser
	mount, unmount := leaveAMount(t, host, user)
	defer unmount()
	finish(t, first)

	eventually(t, "the clean of "+user+" failed more often than quarantines a host, and the host's record says why", func() (bool, error) {
		r := recordOf(t, first)
		var bh berthv1.BuildHost
		if err := c().Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: berthv1.BuildHostName(host.Name)}, &bh); err != nil {
			return false, err
		}
		i := slices.IndexFunc(bh.Status.Leftovers, func(l berthv1.Leftover) bool { return l.BuildUser == user })
		if i < 0 {
			return false, fmt.Errorf("clean failures %d, message %q, leftovers on the record %+v", r.Status.CleanFailures, r.Status.Message, bh.Status.Leftovers)
		}
		l := bh.Status.Leftovers[i]
		if l.TaskRun != dirtyNS+"/"+first.Name || !strings.Contains(l.What, mount) {
			return false, fmt.Errorf("the record says %+v", l)
		}
		return r.Status.CleanFailures > 3 && l.Failures > 3, nil
	})
	if ok, err := controllerEvent("BuildUserLeftovers", "build user "+user+" of "+dirtyNS+"/"+first.Name+" left "); !ok || err != nil {
		t.Errorf("no Event on the host says what %s left (%v)", user, err)
	}
	if bh := buildHostRecord(t, host.Name); bh.Status.Quarantined {
		t.Fatalf("the host was quarantined for what one build user left: %s", bh.Status.QuarantineReason)
	}
	if got := metricValue("berth_host_quarantined", "host", host.Name); got == 1 {
		t.Fatal("the ledger took the host out of service")
	}

	// The dirty tenant's owed slot is its one task: its next one waits, though the host has a
	// free slot, which another tenant's task then gets.
	second := create(t, userTaskRun(dirtyNS, "after-the-mount", platform, ""))
	waiting(t, second)
	other := create(t, userTaskRun(otherNS, "other-tenant", platform, ""))
	if got := ready(t, other).Status.Login.Host; got != host.Name {
		t.Fatalf("the other tenant's task went to %s, want %s", got, host.Name)
	}
	if handedOver, _, err := stacktest.StateOf(ctx, c(), second); err != nil || handedOver {
		t.Fatalf("the dirty tenant's next task was served while its owed slot held its one allowed (%v)", err)
	}
	finish(t, other)
	settled(t, otherNS)

	// What was left can go now: the retried clean removes the user, its slot is free, and the
	// tenant's next task runs.
	unmount()
	// The clean's retries back off, doubling from a second up to MaxCleanBackoff: on a loaded
	// machine the steps above take long enough for the next retry to lie past Patience, so
	// the wait allows for the longest backoff too.
	stacktest.EventuallyWithin(t, stacktest.Patience+taskrun.MaxCleanBackoff, 250*time.Millisecond, "the retried clean removed "+user, func() (bool, error) {
		bh := buildHostRecord(t, host.Name)
		return len(bh.Status.Leftovers) == 0 && !userExists(t, host, user), fmt.Errorf("leftovers %+v", bh.Status.Leftovers)
	})
	ready(t, second)
	finish(t, second)
	settled(t, dirtyNS)
	if bh := buildHostRecord(t, host.Name); bh.Status.Quarantined {
		t.Fatalf("the host is quarantined: %s", bh.Status.QuarantineReason)
	}
}

// leaveAMount leaves on host what the clean script reports as a leftover of user: a tmpfs the
// user owns, mounted at a path of its own, which will not go. It returns the path and a func
// that unmounts it (once; later calls do nothing).
func leaveAMount(t *testing.T, host *sshhosts.Host, user string) (string, func()) {
	t.Helper()
	ctx := context.Background()
	mount := "/tmp/berth-test-" + user
	uid, err := host.Run(ctx, "id -u "+user)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.Run(ctx, fmt.Sprintf("mkdir %s && mount -t tmpfs -o uid=%s tmpfs %s", mount, strings.TrimSpace(uid), mount)); err != nil {
		t.Fatal(err)
	}
	unmounted := false
	return mount, func() {
		if !unmounted {
			unmounted = true
			// The clean's next retry may remove the emptied mount point first.
			if _, err := host.Run(ctx, "umount "+mount+"; rmdir "+mount+" 2>/dev/null || [ ! -e "+mount+" ]"); err != nil {
				t.Errorf("removing the leftover: %v", err)
			}
		}
	}
}
