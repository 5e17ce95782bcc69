package hostops

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

func TestUpdateReportsAFullDisk(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[1]
	ctx := context.Background()
	// The host's /tmp is its own; a 4 MiB tmpfs there, filled up, is a full build disk.
	if _, err := h.Run(ctx, "mkdir -p /tmp/builds && mount -t tmpfs -o size=4m tmpfs /tmp/builds && (dd if=/dev/zero of=/tmp/builds/fill bs=64k 2>/dev/null; true)"); err != nil {
		t.Fatal(err)
	}
	defer h.Run(ctx, "umount /tmp/builds")

	full := Update(ctx, UpdateRequest{Target: adminTarget(f, h), DiskPath: "/tmp/builds", MinFreeBytes: 1 << 20})
	if full.Healthy || !strings.Contains(full.Reason, "free on /tmp/builds of host "+h.Address) || !strings.Contains(full.Reason, "1.0 MiB required") {
		t.Fatalf("a full disk must be unhealthy with the reason: %+v", full)
	}
	if full.TotalBytes != 4<<20 || full.FreeBytes >= 1<<20 {
		t.Fatalf("disk numbers %+v, want a 4 MiB disk with under 1 MiB free", full)
	}

	ok := Update(ctx, UpdateRequest{Target: adminTarget(f, h), DiskPath: "/home", MinFreeBytes: 1 << 20})
	if !ok.Healthy || ok.Reason != "" {
		t.Fatalf("a host with room must be healthy: %+v", ok)
	}
	// The host's /home is a directory on this machine's disk: both must see the same space,
	// however large (a 32-bit overflow once reported every disk as 2 GiB).
	var st syscall.Statfs_t
	if err := syscall.Statfs(h.HomeDir, &st); err != nil {
		t.Fatal(err)
	}
	total := st.Blocks * uint64(st.Bsize)
	if diff := int64(ok.TotalBytes) - int64(total); diff < -int64(total/100) || diff > int64(total/100) {
		t.Fatalf("the host reports a %d-byte disk, this machine sees %d bytes", ok.TotalBytes, total)
	}
}

func TestUpdateRemovesStaleUsersOnly(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[0]
	ctx := context.Background()
	gone := provision(t, f, h, "finished-long-ago", "")
	live := provision(t, f, h, "still-running", "")
	fresh := provision(t, f, h, "just-finished", "")
	// Both the gone and the live task's users are two days old; the fresh one is new.
	if _, err := h.Run(ctx, "touch -d '2 days ago' /var/lib/berth/users/"+gone.User+" /var/lib/berth/users/"+live.User); err != nil {
		t.Fatal(err)
	}
	exists := map[string]bool{"builds/still-running": true}
	report := Update(ctx, UpdateRequest{
		Target: adminTarget(f, h), MinFreeBytes: 1, StaleAfter: 24 * time.Hour,
		TaskRunExists: func(_ context.Context, ns, name string) (bool, error) { return exists[ns+"/"+name], nil },
	})
	if !report.Healthy || len(report.Removed) != 1 || report.Removed[0] != gone.User {
		t.Fatalf("want only %s removed, got %+v", gone.User, report)
	}
	if _, err := h.Run(ctx, "id "+gone.User); err == nil {
		t.Fatal("the stale user is still there")
	}
	for _, kept := range []*built{live, fresh} {
		if _, err := h.Run(ctx, "id "+kept.User); err != nil {
			t.Fatalf("%s was removed: its task is alive or it is too young", kept.User)
		}
	}
}

func TestUpdateRunsTheMaintenanceCommand(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[2]
	ctx := context.Background()
	report := Update(ctx, UpdateRequest{Target: adminTarget(f, h), MaintenanceCommand: "echo the podman store is corrupt >&2; exit 4"})
	if report.Healthy || !strings.Contains(report.Reason, "the podman store is corrupt") {
		t.Fatalf("a failing maintenance command must make the host unhealthy with its output: %+v", report)
	}
	if report := Update(ctx, UpdateRequest{Target: adminTarget(f, h), MaintenanceCommand: "true"}); !report.Healthy {
		t.Fatalf("a passing maintenance command: %+v", report)
	}
}

func TestUpdateOfACutHostIsUnhealthy(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[2]
	if err := h.Cut(); err != nil {
		t.Fatal(err)
	}
	defer h.Restore()
	target := adminTarget(f, h)
	target.DialTimeout = 2 * time.Second
	report := Update(context.Background(), UpdateRequest{Target: target})
	if report.Healthy || !strings.Contains(report.Reason, h.Address+" is unreachable") {
		t.Fatalf("%+v", report)
	}
}
