package hostops

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// provisionIn creates a build user whose IDs come from ids (the default range when zero).
func provisionIn(t *testing.T, f *sshhosts.Fleet, h *sshhosts.Host, taskRun string, ids config.UIDRange) (*built, error) {
	t.Helper()
	uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", uids.Add(1), time.Now().UnixNano()&0xffffffffffff)
	p := newBuilt(t, UserName(uid, 1))
	dir, err := CreateUser(context.Background(), adminTarget(f, h), NewUser{Name: p.User, AuthorizedKey: p.authorized,
		Owner: "builds/" + taskRun + " " + uid, UIDs: ids})
	t.Cleanup(func() { _ = Clean(context.Background(), adminTarget(f, h), p.User) })
	if err != nil {
		return nil, err
	}
	p.Dir = dir
	return &p.built, nil
}

// hostUID is the build user's UID on the host.
func hostUID(t *testing.T, h *sshhosts.Host, p *built) int64 {
	t.Helper()
	out, err := asBuildUser(t, h, p, "id -u")
	if err != nil {
		t.Fatalf("logging in as %s: %v", p.User, err)
	}
	uid, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return uid
}

// processesIn lists "pid uid name" of every process on the host any of whose UIDs lies in
// [lo, hi].
func processesIn(t *testing.T, h *sshhosts.Host, lo, hi int64) string {
	t.Helper()
	out, err := h.ProcessesOfIDs(context.Background(), lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCleanEndsWhatRunsUnderSubordinateIDs: a build leaves processes whose kernel UIDs lie in
// its subordinate range and have no ancestor under its own UID (a rootless user namespace of
// its own making, and one started there by root as a container engine would). The clean must
// end them all and remove the user, its key and its files, and the host must take the next
// task. Against berth's earlier clean (pkill -u, then userdel) userdel refused forever.
func TestCleanEndsWhatRunsUnderSubordinateIDs(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[0]
	ctx := context.Background()
	p, err := provisionIn(t, f, h, "leaves-subuid-processes", config.UIDRange{})
	if err != nil {
		t.Fatal(err)
	}
	uid := hostUID(t, h, p)
	sub := fmt.Sprintf("%s:%d:%d", p.User, uid+1, config.IDsPerBuildUser-1)
	if out, err := h.Run(ctx, "cat /etc/subuid; echo; cat /etc/subgid"); err != nil || strings.Count(out, sub+"\n") != 2 {
		t.Fatalf("want the subordinate ranges %s in /etc/subuid and /etc/subgid: %q %v", sub, out, err)
	}

	// The build's own rootless namespace (--map-auto maps its IDs from 0 on to the subordinate
	// range): 1000 there is uid+1+1000 outside. It writes a file and lives on after the session.
	container := uid + 1 + 1000
	if out, err := asBuildUser(t, h, p, `setsid unshare --user --map-auto --setuid 1000 --setgid 1000 sh -c 'echo secret > /tmp/from-container; exec sleep 1000' </dev/null >/dev/null 2>&1 &
		for i in $(seq 50); do [ -e /tmp/from-container ] && break; sleep 0.1; done; stat -c %u /tmp/from-container`); err != nil || strings.TrimSpace(out) != fmt.Sprint(container) {
		t.Fatalf("the build's rootless namespace did not start: %q %v", out, err)
	}
	// One more, as root would start it for the user: nothing of it has the user's own UID.
	detached := uid + 54321
	if _, err := h.Run(ctx, fmt.Sprintf("setsid setpriv --reuid=%d --regid=%d --clear-groups sleep 1000 </dev/null >/dev/null 2>&1 &", detached, detached)); err != nil {
		t.Fatal(err)
	}
	before := processesIn(t, h, uid+1, uid+config.IDsPerBuildUser-1)
	if !strings.Contains(before, fmt.Sprintf(" %d sleep", container)) || !strings.Contains(before, fmt.Sprintf(" %d sleep", detached)) {
		t.Fatalf("want sleeps under UIDs %d and %d, got:\n%s", container, detached, before)
	}

	if err := Clean(ctx, adminTarget(f, h), p.User); err != nil {
		t.Fatalf("clean: %v", err)
	}
	if left := processesIn(t, h, uid, uid+config.IDsPerBuildUser-1); left != "" {
		t.Fatalf("processes of the user's IDs survived the clean:\n%s", left)
	}
	out, err := h.Run(ctx, fmt.Sprintf(`id %[1]s 2>/dev/null && echo user-left
		test -e /home/%[1]s && echo home-left; ls -a /home | grep -F %[1]s
		grep -h %[1]s /etc/subuid /etc/subgid /etc/group
		find /tmp /var/tmp /dev/shm -xdev -uid +%[2]d -uid -%[3]d
		ls /var/lib/berth/uids | grep -x %[4]d
		true`, p.User, uid-1, uid+config.IDsPerBuildUser, uid))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("left behind: %q %v", out, err)
	}
	if _, err := asBuildUser(t, h, p, "true"); err == nil {
		t.Fatal("the build user's key still logs in")
	}

	next, err := provisionIn(t, f, h, "after-the-subuid-processes", config.UIDRange{})
	if err != nil {
		t.Fatalf("the host's next task: %v", err)
	}
	if out, err := asBuildUser(t, h, next, "id -un"); err != nil || strings.TrimSpace(out) != next.User {
		t.Fatalf("the next task's user cannot work: %q %v", out, err)
	}
}

// TestFilesOfOneTaskNeverReachTheNext: what one build user leaves in /tmp, /var/tmp, /dev/shm
// and as SysV shared memory is gone before any other user gets its IDs; a slice whose clean
// found something left is never handed on, and one verified clean may be.
func TestFilesOfOneTaskNeverReachTheNext(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[1]
	ctx := context.Background()
	// Two slices of their own, so that the test decides who gets which.
	two := config.UIDRange{First: 0x74000000, Last: 0x74000000 + 2*config.IDsPerBuildUser - 1}

	a, err := provisionIn(t, f, h, "leaves-files", two)
	if err != nil {
		t.Fatal(err)
	}
	aUID := hostUID(t, h, a)
	shm, err := asBuildUser(t, h, a, `set -e
		echo a > /tmp/a-file; mkdir /var/tmp/a-dir; echo a > /var/tmp/a-dir/x; echo a > /dev/shm/a-shm
		chmod 777 /var/tmp/a-dir; ln -s /etc/passwd /tmp/a-link
		ipcmk -M 4096 | awk '{print $NF}'`)
	if err != nil {
		t.Fatal(err)
	}
	shm = strings.TrimSpace(shm)
	if _, err := h.Run(ctx, fmt.Sprintf("echo sub > /var/tmp/a-sub && chown %d:%d /var/tmp/a-sub", aUID+7, aUID+7)); err != nil {
		t.Fatal(err)
	}
	if out, _ := h.Run(ctx, "command -v crontab || echo none"); strings.TrimSpace(out) == "none" {
		t.Log("no crontab binary on the test hosts: cron and at removal are not exercised here")
	}
	// A path that will not go: a mount of the user's on /tmp, which root's rm cannot remove.
	if _, err := h.Run(ctx, fmt.Sprintf("mkdir /tmp/a-mount && mount -t tmpfs -o uid=%d tmpfs /tmp/a-mount", aUID)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = h.Run(ctx, "umount /tmp/a-mount; rmdir /tmp/a-mount") })

	err = Clean(ctx, adminTarget(f, h), a.User)
	var left *LeftoverError
	if !errors.As(err, &left) || left.User != a.User || left.Host != h.Address || !strings.Contains(left.What, "/tmp/a-mount") {
		t.Fatalf("the clean of a user whose mount stays: %v, want a LeftoverError naming /tmp/a-mount", err)
	}
	t.Logf("the clean said: %v", err)
	out, err := h.Run(ctx, fmt.Sprintf(`ls /tmp/a-file /tmp/a-link /var/tmp/a-dir /var/tmp/a-sub /dev/shm/a-shm 2>/dev/null
		awk '$2 == %q' /proc/sysvipc/shm; test -e /etc/passwd || echo passwd-gone; true`, shm))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("the clean left what it could remove: %q %v", out, err)
	}

	b, err := provisionIn(t, f, h, "after-a-dirty-one", two)
	if err != nil {
		t.Fatal(err)
	}
	bUID := hostUID(t, h, b)
	if bUID == aUID {
		t.Fatalf("user %s got UID %d, whose clean found leftovers", b.User, aUID)
	}
	if err := Clean(ctx, adminTarget(f, h), b.User); err != nil {
		t.Fatal(err)
	}
	c, err := provisionIn(t, f, h, "after-a-clean-one", two)
	if err != nil {
		t.Fatal(err)
	}
	if cUID := hostUID(t, h, c); cUID != bUID {
		t.Fatalf("user %s got UID %d; the only slice verified clean is %d's (the other, %d, is dirty)", c.User, cUID, bUID, aUID)
	}
	if out, err := asBuildUser(t, h, c, "find /tmp /var/tmp /dev/shm -xdev -user $(id -u) 2>/dev/null; true"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("the next user owns files it never made: %q %v", out, err)
	}
	if _, err := provisionIn(t, f, h, "no-room", two); err == nil || !strings.Contains(err.Error(), "no free build UID") {
		t.Fatalf("with one slice dirty and one in use, a provision must fail: %v", err)
	}

	// Once what it left can go, the clean succeeds and its slice is free again.
	if _, err := h.Run(ctx, "umount /tmp/a-mount"); err != nil {
		t.Fatal(err)
	}
	if err := Clean(ctx, adminTarget(f, h), a.User); err != nil {
		t.Fatalf("the clean after the mount went: %v", err)
	}
	e, err := provisionIn(t, f, h, "after-the-retry", two)
	if err != nil {
		t.Fatal(err)
	}
	if eUID := hostUID(t, h, e); eUID != aUID {
		t.Fatalf("user %s got UID %d, want the slice freed by the retried clean, %d", e.User, eUID, aUID)
	}
}

// TestUpdateRetriesUserlessClaims: a claimed slice whose user is gone (a provision or clean cut
// short) is cleaned by the host's periodic update once it is stale, and its files go with it.
func TestUpdateRetriesUserlessClaims(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[2]
	ctx := context.Background()
	p, err := provisionIn(t, f, h, "cut-short", config.UIDRange{})
	if err != nil {
		t.Fatal(err)
	}
	uid := hostUID(t, h, p)
	if _, err := h.Run(ctx, fmt.Sprintf(`set -e; echo x > /tmp/orphan-%[1]d; chown %[1]d /tmp/orphan-%[1]d
		userdel %[2]s; getent group %[2]s >/dev/null && groupdel %[2]s; touch -d '2 days ago' /var/lib/berth/uids/%[1]d`, uid, p.User)); err != nil {
		t.Fatal(err)
	}
	report := Update(ctx, UpdateRequest{Target: adminTarget(f, h), MinFreeBytes: 1, StaleAfter: 24 * time.Hour,
		TaskRunExists: func(context.Context, string, string) (bool, error) { return true, nil }})
	if !report.Healthy || len(report.Removed) != 1 || report.Removed[0] != p.User || len(report.Leftovers) != 0 {
		t.Fatalf("want the userless claim of %s cleaned, got %+v", p.User, report)
	}
	if out, err := h.Run(ctx, fmt.Sprintf("ls -d /tmp/orphan-%[1]d /var/lib/berth/uids/%[1]d 2>/dev/null; true", uid)); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("left: %q %v", out, err)
	}
}
