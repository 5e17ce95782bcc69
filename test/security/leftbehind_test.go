package security_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// leaveBehind is what a hostile build runs before its task ends: a rootless user namespace of
// its own (--map-auto maps its IDs from 0 on to the user's subordinate range) whose process
// switches to 1000 there, uid+1+1000 outside, has no ancestor under the user's own UID, writes
// a file and lives on; and files of the user's own in /tmp, /var/tmp and /dev/shm, one a link
// to a file of root's. It prints the container's UID as the kernel sees it.
const leaveBehind = `set -e
setsid unshare --user --map-auto --setuid 1000 --setgid 1000 sh -c 'echo secret > /tmp/from-container; exec sleep 100000' </dev/null >/dev/null 2>&1 &
for i in $(seq 100); do [ -s /tmp/from-container ] && break; sleep 0.1; done
echo left > /tmp/left; mkdir -p /var/tmp/left-dir; echo left > /var/tmp/left-dir/x; chmod 777 /var/tmp/left-dir
echo left > /dev/shm/left; ln -s /etc/passwd /tmp/left-link
stat -c %u /tmp/from-container`

// TestWhatABuildLeavesIsGoneBeforeTheNext: a build leaves a process under a UID of its
// subordinate range with no ancestor of its own UID, another started by root under that range
// as a container engine would, and files in /tmp, /var/tmp and /dev/shm. When its task ends,
// berth's clean succeeds: no process, user, key or file of those IDs is left where berth
// cleans, the host is not quarantined (host checks on, so quarantine can happen), and the next
// task of another tenant on the same host gets a working user that owns none of it. Against
// the clean berth ran before (pkill -u, then userdel) userdel refused on every try: the user,
// its key and its slot stayed, and after three tries the host was quarantined for everyone.
func TestWhatABuildLeavesIsGoneBeforeTheNext(t *testing.T) {
	o := controllerOptions()
	o.HostCheckInterval = time.Hour // quarantine for failed cleans is on only with host checks
	restartInProcess(t, o)
	t.Cleanup(func() { restartInProcess(t, controllerOptions()) })
	h := hostsByName()[0]
	onlyHost(t, h)
	ctx := context.Background()

	hostile := newTenant(t, "leaves")
	tr := hostile.create(t, hostile.taskRun("leaves-processes", platform))
	rec := ready(t, tr)
	user := rec.Status.BuildUser
	s := servedWithKey(t, tr, rec)
	out, err := h.Run(ctx, "id -u "+user)
	if err != nil {
		t.Fatal(err)
	}
	uid, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	last := uid + config.IDsPerBuildUser - 1
	out, err = loginWith(t, h, user, s, leaveBehind)
	if container := uid + 1 + 1000; err != nil || strings.TrimSpace(out) != fmt.Sprint(container) {
		t.Fatalf("the build's rootless namespace did not start (want its process under UID %d): %q %v", container, out, err)
	}
	detached := uid + 54321
	if _, err := h.Run(ctx, fmt.Sprintf("setsid setpriv --reuid=%d --regid=%d --clear-groups sleep 100000 </dev/null >/dev/null 2>&1 &", detached, detached)); err != nil {
		t.Fatal(err)
	}
	if left := idsProcesses(t, h, uid+1, last); strings.Count(left, "sleep") != 2 {
		t.Fatalf("want two sleeps under the subordinate UIDs, got:\n%s", left)
	}

	finish(t, tr)
	settled(t, hostile.ns)
	if left := idsProcesses(t, h, uid, last); left != "" {
		t.Errorf("processes of the build user's IDs outlived its clean:\n%s", left)
	}
	out, err = h.Run(ctx, fmt.Sprintf(`id %[1]s >/dev/null 2>&1 && echo user-left
		ls -a /home | grep -F %[1]s; grep -h %[1]s /etc/subuid /etc/subgid /etc/group /etc/passwd
		find /tmp /var/tmp /dev/shm -xdev \( -uid +%[2]d -uid -%[3]d \) -o \( -gid +%[2]d -gid -%[3]d \)
		true`, user, uid-1, last+1))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("the clean left behind: %q %v", out, err)
	}
	if _, err := loginWith(t, h, user, s, "true"); err == nil {
		t.Error("the build user's key still logs in after its task")
	}
	// Quarantine writes the host's record (creating it if none yet); none means never.
	if bh := buildHost(t, h.Name); bh != nil && (bh.Status.Quarantined || len(bh.Status.Leftovers) > 0) {
		t.Errorf("host %s was quarantined (%q) or holds leftovers %v", h.Name, bh.Status.QuarantineReason, bh.Status.Leftovers)
	}

	next := newTenant(t, "next")
	tr = next.create(t, next.taskRun("after-the-leftovers", platform))
	rec = ready(t, tr)
	if rec.Status.Login.Host != h.Name {
		t.Fatalf("the next task went to %s; the config has only %s", rec.Status.Login.Host, h.Name)
	}
	s = servedWithKey(t, tr, rec)
	if out, err := loginWith(t, h, rec.Status.BuildUser, s, "find /tmp /var/tmp /dev/shm -xdev -user $(id -u) 2>/dev/null; true"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("the next task's user owns files it never made: %q %v", out, err)
	}
	finish(t, tr)
	settled(t, next.ns)
}

// onlyHost puts in force a config in which h alone serves the platform, one task at a time.
func onlyHost(t *testing.T, h *sshhosts.Host) {
	t.Helper()
	data := stack.StaticHostConfig(platform, 1)
	for k := range data {
		if strings.HasPrefix(k, "host.") && !strings.HasPrefix(k, "host."+h.Name+".") {
			delete(data, k)
		}
	}
	applyConfigData(t, data)
}

// idsProcesses lists "pid uid name" of every live process of h any of whose UIDs lies in
// [lo, hi].
func idsProcesses(t *testing.T, h *sshhosts.Host, lo, hi int64) string {
	t.Helper()
	out, err := h.ProcessesOfIDs(context.Background(), lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// buildHost is berth's record of the host named name; nil if it has none.
func buildHost(t *testing.T, name string) *berthv1.BuildHost {
	t.Helper()
	var bh berthv1.BuildHost
	err := admin().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: berthv1.BuildHostName(name)}, &bh)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &bh
}

// restartInProcess runs the package's in-process controller again with o.
func restartInProcess(t *testing.T, o controller.Options) {
	t.Helper()
	if err := stack.StopController(); err != nil {
		t.Fatal(err)
	}
	if err := stack.StartController(o); err != nil {
		t.Fatal(err)
	}
}
