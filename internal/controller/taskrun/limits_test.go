//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// manyProcesses is how many processes the build keeps alive at once: more than the 4096 berth
// allowed a build user before (hard nproc 4096, TasksMax=4096), fewer than the 8192 of the
// upstream controller's soft nproc, berth's default now (config.DefaultBuildLimits).
const manyProcesses = 6000

// holdProcesses starts up to n sleeps as the build user and leaves them running (their
// output goes nowhere, so the session ends without them); it prints "started <n>" if it got
// through. A fork past the user's nproc fails (bash gives up after its retries) and ends the
// script there.
func holdProcesses(n int) string {
	return fmt.Sprintf(`i=0
while [ $i -lt %d ]; do
	sleep 600 </dev/null >/dev/null 2>&1 &
	i=$((i + 1))
done
echo "started $i"`, n)
}

// runAsBuildUser logs in with the task's secret as its build user and runs command on host.
func runAsBuildUser(t *testing.T, host *sshhosts.Host, secretData map[string][]byte, command string) (string, error) {
	t.Helper()
	user, _, _ := strings.Cut(string(secretData["host"]), "@")
	signer, err := ssh.ParsePrivateKey(secretData["id_rsa"])
	if err != nil {
		t.Fatalf("id_rsa does not parse: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return host.RunAs(ctx, user, signer, command)
}

// buildHost is the test host of the task's secret.
func buildHost(t *testing.T, secretData map[string][]byte) *sshhosts.Host {
	t.Helper()
	_, address, ok := strings.Cut(string(secretData["host"]), "@")
	if !ok {
		t.Fatalf("the secret's host %q is not user@address; error: %s", secretData["host"], secretData["error"])
	}
	for _, h := range stack.Fleet.Hosts {
		if h.Address == address || h.Addr() == address {
			return h
		}
	}
	t.Fatalf("no test host has address %s", address)
	return nil
}

// sleepsAlive counts, as root (the build user may have no process left to spare), the sleeps
// of uid alive on host.
func sleepsAlive(t *testing.T, host *sshhosts.Host, uid int64) int {
	t.Helper()
	out, err := host.ProcessesOfIDs(context.Background(), uid, uid)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "sleep" {
			n++
		}
	}
	return n
}

// buildUID is the build user's UID.
func buildUID(t *testing.T, host *sshhosts.Host, secretData map[string][]byte) int64 {
	t.Helper()
	out, err := runAsBuildUser(t, host, secretData, "id -u")
	if err != nil {
		t.Fatal(err)
	}
	uid, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("id -u printed %q", out)
	}
	return uid
}

// A build that keeps 6,000 processes alive at once, as large parallel builds do, runs with
// the default limits (berth's old nproc 4096 stopped it).
func TestABuildKeepsSixThousandProcessesWithTheDefaultLimits(t *testing.T) {
	applyConfig(t, 1, nil)
	ns := namespace(t)
	tr := create(t, userTaskRun(ns, "many-processes", platform, ""))
	secret := secretOf(t, tr)
	host := buildHost(t, secret.Data)
	uid := buildUID(t, host, secret.Data)
	out, err := runAsBuildUser(t, host, secret.Data, holdProcesses(manyProcesses))
	if err != nil || strings.TrimSpace(out) != fmt.Sprintf("started %d", manyProcesses) {
		t.Errorf("the build did not start its %d processes: %q, %v", manyProcesses, out, err)
	}
	if alive := sleepsAlive(t, host, uid); alive != manyProcesses {
		t.Errorf("%d of the build's %d processes are alive at once", alive, manyProcesses)
	}
	finish(t, tr)
	settled(t, ns)
	noBuildUsersLeft(t)
}

// A lower nproc in the config holds: the same build is refused past it.
func TestAConfiguredLowerNprocHolds(t *testing.T) {
	const limit = 1000
	extra := map[string]string{}
	for _, h := range stack.Fleet.Hosts {
		extra["host."+h.Name+".nproc-hard"] = strconv.Itoa(limit)
	}
	applyConfig(t, 1, extra)
	defer applyConfig(t, 1, nil)
	ns := namespace(t)
	tr := create(t, userTaskRun(ns, "too-many-processes", platform, ""))
	secret := secretOf(t, tr)
	host := buildHost(t, secret.Data)
	if out, err := runAsBuildUser(t, host, secret.Data, "ulimit -Su; ulimit -Hu"); err != nil || strings.Join(strings.Fields(out), " ") != fmt.Sprintf("%d %d", limit, limit) {
		t.Fatalf("the build user's nproc is %q (%v), want %d soft and hard", out, err, limit)
	}
	uid := buildUID(t, host, secret.Data)
	out, err := runAsBuildUser(t, host, secret.Data, holdProcesses(manyProcesses))
	if err == nil || strings.Contains(out, "started") {
		t.Errorf("the build started all its %d processes past nproc %d: %q, %v", manyProcesses, limit, out, err)
	}
	if alive := sleepsAlive(t, host, uid); alive > limit || alive == 0 {
		t.Errorf("%d of the build's processes are alive at once, want some, at most the configured nproc %d", alive, limit)
	}
	finish(t, tr)
	settled(t, ns)
	noBuildUsersLeft(t)
}

// The test hosts run sshd in their own namespaces with a private /run and no systemd, so no
// slice bounds a build there: the host check says so on each host's record, and the hosts keep
// taking builds. (Where systemd runs, the slice's properties are what
// internal/hostops.TestSliceLimitsSetTheSlicesProperties checks the provision asks systemctl
// for; the test ground has no systemd to show them applied.)
func TestAHostWithoutSystemdIsMarkedUnbounded(t *testing.T) {
	o := controllerOptions()
	o.HostCheckInterval = time.Second
	restartController(t, o)
	defer restartController(t, controllerOptions())
	applyConfig(t, 1, nil)
	for _, h := range hostsByName() {
		eventually(t, "the record of "+h.Name+" says its builds are not bounded as a whole", func() (bool, error) {
			// The record is made with the host's first check, a moment after the config.
			var bh berthv1.BuildHost
			if err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: berthv1.BuildHostName(h.Name)}, &bh); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			cond, current := hostCondition(t, h.Name, berthv1.HostBuildsBounded)
			ready, _ := hostCondition(t, h.Name, berthv1.HostReady)
			return current && cond.Status == metav1.ConditionFalse && cond.Reason == berthv1.BuildsUnbounded &&
				strings.Contains(cond.Message, "systemd does not run") && ready.Status == metav1.ConditionTrue, nil
		})
		eventually(t, "a BuildsUnbounded event for "+h.Name, func() (bool, error) {
			return controllerEvent("BuildsUnbounded", "systemd does not run on host "+h.Address)
		})
	}
}
