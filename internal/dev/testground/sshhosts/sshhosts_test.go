//go:build linux

package sshhosts

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/dev/testground/missing"
)

// The package's tests share one fleet of two hosts (Shared); the tests that need a fleet of
// their own (Close, leftovers) start a small one.
func TestMain(m *testing.M) {
	code := m.Run()
	CloseShared()
	os.Exit(code)
}

func sharedFleet(t *testing.T) *Fleet { return Shared(t, 2) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestRootLogsInWithAdminKey(t *testing.T) {
	f := sharedFleet(t)
	ctx := testContext(t)
	if len(f.Hosts) != 2 {
		t.Fatalf("got %d hosts, want 2", len(f.Hosts))
	}
	if a, b := f.Hosts[0].Address, f.Hosts[1].Address; a == b {
		t.Fatalf("both hosts have address %s", a)
	}
	// The PEM form is what ends up in a Secret: it must be the same key, usable on its own.
	fromPEM, err := ssh.ParsePrivateKey(f.AdminKeyPEM)
	if err != nil {
		t.Fatalf("AdminKeyPEM does not parse: %v", err)
	}
	if !bytes.Equal(fromPEM.PublicKey().Marshal(), f.AdminSigner.PublicKey().Marshal()) {
		t.Fatal("AdminKeyPEM is not AdminSigner's key")
	}
	for _, h := range f.Hosts {
		out, err := h.Run(ctx, "id -u")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out); got != "0" {
			t.Errorf("%s: id -u = %q, want 0", h.Name, got)
		}
		client, err := h.Dial(ctx, "root", fromPEM)
		if err != nil {
			t.Fatalf("%s: the PEM key does not log in: %v", h.Name, err)
		}
		client.Close()
	}
}

func TestHostsHaveOwnNamespaces(t *testing.T) {
	f := sharedFleet(t)
	ctx := testContext(t)
	for _, h := range f.Hosts {
		out, err := h.Run(ctx, "hostname; cat /proc/1/comm")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.Fields(out), []string{h.Name, "sshd"}; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("%s: hostname and PID 1 are %q, want %q", h.Name, got, want)
		}
	}

	// A process on this machine with a name no one else uses: a pkill on a host that could
	// see this machine's processes would kill it.
	canary := "berth-sshhosts-canary-" + rand.Text()
	sleeper := &exec.Cmd{Path: "/bin/sleep", Args: []string{canary, "300"}}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sleeper.Process.Kill()
		sleeper.Wait()
	}()
	// pkill exits 1 when it matched nothing, which is the outcome wanted here.
	_, err := f.Hosts[0].Run(ctx, "pkill -KILL -f "+canary)
	var exit *ssh.ExitError
	if !errors.As(err, &exit) || exit.ExitStatus() != 1 {
		t.Fatalf("pkill on %s: %v, want exit status 1 (no match)", f.Hosts[0].Name, err)
	}
	if err := sleeper.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the canary on this machine died: %v", err)
	}
}

func TestUseraddStaysOnItsHost(t *testing.T) {
	f := sharedFleet(t)
	ctx := testContext(t)
	h1, h2 := f.Hosts[0], f.Hosts[1]
	realFiles := []string{"/etc/passwd", "/etc/shadow", "/etc/group"}
	before := map[string][]byte{}
	for _, p := range realFiles {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		before[p] = data
	}

	if _, err := h1.Run(ctx, "useradd -m buildtest"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := h1.Run(context.Background(), "userdel -r buildtest"); err != nil {
			t.Errorf("leaving %s as found: %v", h1.Name, err)
		}
	})

	out, err := h1.Run(ctx, "id buildtest")
	if err != nil || !strings.Contains(out, "(buildtest)") {
		t.Fatalf("id buildtest on %s: %q, %v", h1.Name, out, err)
	}
	if out, err := h2.Run(ctx, "id buildtest"); err == nil {
		t.Fatalf("buildtest exists on %s too: %q", h2.Name, out)
	}
	for _, p := range realFiles {
		after, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(after, before[p]) {
			t.Errorf("this machine's %s changed", p)
		}
		if bytes.Contains(after, []byte("buildtest:")) {
			t.Errorf("this machine's %s has buildtest", p)
		}
	}
	if st, err := os.Stat(filepath.Join(h1.HomeDir, "buildtest")); err != nil || !st.IsDir() {
		t.Errorf("no home for buildtest under %s: %v", h1.HomeDir, err)
	}
	if _, err := os.Lstat("/home/buildtest"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/home/buildtest on this machine: %v, want it absent", err)
	}

	// useradd leaves the password locked ("!"). sshd without PAM refuses locked accounts even
	// for keys; with UsePAM, as configured, a key is enough, as on a stock Debian server.
	shadow, err := h1.Run(ctx, "getent shadow buildtest")
	if err != nil || !strings.HasPrefix(shadow, "buildtest:!") {
		t.Fatalf("buildtest's shadow entry: %q, %v; want a locked password", shadow, err)
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(f.AdminSigner.PublicKey())))
	script := fmt.Sprintf("install -d -m 700 -o buildtest -g buildtest ~buildtest/.ssh && echo '%s' > ~buildtest/.ssh/authorized_keys && chown buildtest: ~buildtest/.ssh/authorized_keys", pub)
	if _, err := h1.Run(ctx, script); err != nil {
		t.Fatal(err)
	}
	client, err := h1.Dial(ctx, "buildtest", f.AdminSigner)
	if err != nil {
		t.Fatalf("key login of a fresh useradd user: %v", err)
	}
	defer client.Close()
	session, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	whoami, err := session.Output("id -un")
	if err != nil || strings.TrimSpace(string(whoami)) != "buildtest" {
		t.Fatalf("id -un as buildtest: %q, %v", whoami, err)
	}
}

func TestWrongHostKeyIsRefused(t *testing.T) {
	f := sharedFleet(t)
	ctx := testContext(t)
	// Host 1's address, host 2's key: what a client sees when an address is taken over.
	impostor := &Host{Name: "impostor", Address: f.Hosts[0].Address, HostKey: f.Hosts[1].HostKey}
	client, err := impostor.Dial(ctx, "root", f.AdminSigner)
	if err == nil {
		client.Close()
		t.Fatal("dial with the wrong host key succeeded")
	}
	if !strings.Contains(err.Error(), "host key mismatch") {
		t.Fatalf("dial with the wrong host key: %v, want a host key mismatch", err)
	}
}

func TestCutAndRestore(t *testing.T) {
	f := sharedFleet(t)
	ctx := testContext(t)
	h := f.Hosts[1]
	if _, err := h.Run(ctx, "echo survived > /root/mark"); err != nil {
		t.Fatal(err)
	}

	if err := h.Cut(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Restore(); err != nil {
			t.Errorf("restore on cleanup: %v", err)
		}
	})
	// While cut, packets for the host must still go to its veth, where they die.
	if dev, err := routeDevice(h.Address); err != nil || dev != vethName(h.Slot) {
		t.Fatalf("route to %s while cut: %q, %v; want %s", h.Address, dev, err, vethName(h.Slot))
	}
	dialCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	client, err := h.Dial(dialCtx, "root", f.AdminSigner)
	if err == nil {
		client.Close()
		t.Fatal("dial to a cut host succeeded")
	}
	t.Logf("dial to cut host failed after %v: %v", time.Since(start).Round(time.Millisecond), err)

	if err := h.Restore(); err != nil {
		t.Fatal(err)
	}
	out, err := h.Run(ctx, "cat /root/mark")
	if err != nil {
		t.Fatalf("after restore: %v", err)
	}
	if strings.TrimSpace(out) != "survived" {
		t.Fatalf("after restore, /root/mark = %q; the host lost its state", out)
	}
}

// holdNetns returns the inode of the host's network namespace and holds the namespace open
// until the test ends (HoldNamespace), so a check by inode after Close sees this host only.
func holdNetns(t *testing.T, name string) uint64 {
	t.Helper()
	held, ino, err := HoldNamespace(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	return ino
}

// processesInNetns lists every process on this machine in the network namespace with inode
// ino, whether or not the namespace still has a name.
func processesInNetns(ino uint64) []string {
	want := fmt.Sprintf("net:[%d]", ino)
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "net"))
		if err != nil || link != want {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		found = append(found, e.Name()+" "+strings.TrimSpace(string(comm)))
	}
	return found
}

func TestCloseRemovesEverything(t *testing.T) {
	if err := Prerequisites(); err != nil {
		missing.Skip(t, err)
	}
	ctx := testContext(t)
	f, err := Start(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := f.Hosts[0]
	ino := holdNetns(t, h.Name)
	running := processesInNetns(ino)
	if !strings.Contains(strings.Join(running, "\n"), " sshd") {
		t.Fatalf("no sshd among the host's processes %q", running)
	}

	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if left := processesInNetns(ino); len(left) > 0 {
		t.Errorf("processes left in %s after Close: %q", h.Name, left)
	}
	if _, err := os.Stat(h.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there: %v", h.Dir, err)
	}
	// Another test process may take the slot the moment it is free; what must not be there
	// is anything of ours.
	lock, err := tryLockSlot(h.Slot)
	if err != nil {
		t.Fatal(err)
	}
	if lock == nil {
		if _, err := os.Stat(lockPath(h.Slot)); err == nil {
			rec := (&slotLock{slot: h.Slot}).read()
			if rec.pid == os.Getpid() {
				t.Errorf("slot %d is still recorded as ours", h.Slot)
			}
		}
		return
	}
	defer lock.release()
	if _, err := os.Stat(filepath.Join(netnsDir, h.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns %s still there: %v", h.Name, err)
	}
	if _, err := net.InterfaceByName(vethName(h.Slot)); err == nil {
		t.Errorf("link %s still there", vethName(h.Slot))
	}
}

func TestLeftoversOfDeadOwnerAreReclaimed(t *testing.T) {
	if err := Prerequisites(); err != nil {
		missing.Skip(t, err)
	}
	ctx := testContext(t)
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		t.Fatal(err)
	}

	// Build what a test process killed mid-run leaves: a slot with its netns and veth, a
	// process in the netns, a temp dir, and a lock file naming a PID that no longer runs.
	locks, err := claimSlots(1)
	if err != nil {
		t.Fatal(err)
	}
	lock := locks[0]
	slot, ns := lock.slot, netnsName(lock.slot)
	t.Cleanup(func() {
		// Only matters when the test fails before Start reclaims the slot.
		lock.file.Close()
		if l, err := tryLockSlot(slot); err == nil && l != nil {
			clearSlot(slot, l.read())
			l.release()
		}
	})
	if err := createNetwork(ctx, slot); err != nil {
		t.Fatal(err)
	}
	if err := runCommand(ctx, "ip", "-n", ns, "link", "add", "stale0", "type", "veth", "peer", "name", "stale1"); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", ns+"-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("ip", "netns", "exec", ns, "sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	sleeperDone := make(chan struct{})
	go func() { sleeper.Wait(); close(sleeperDone) }()
	defer sleeper.Process.Kill()
	// ip netns exec enters the namespace after Start returns; on a busy machine the owner
	// could "die" and be reclaimed before its process is there to find.
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		if len(strings.TrimSpace(string(out))) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leftover process never entered %s", ns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := lock.write(slotRecord{pid: gone.Process.Pid, dir: dir}); err != nil {
		t.Fatal(err)
	}
	// The owner "dies": the kernel drops a dead process's flock, and so does this.
	lock.file.Close()

	f, err := Start(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	select {
	case <-sleeperDone:
	case <-time.After(10 * time.Second):
		t.Error("the leftover process in the netns is still running")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the leftover temp dir %s is still there: %v", dir, err)
	}
	if f.Hosts[0].Slot == slot {
		// The usual case: the cleared slot was the lowest free one, and the new host is in it.
		if err := runCommand(ctx, "ip", "-n", ns, "link", "show", "stale0"); err == nil {
			t.Errorf("%s is the old namespace, not a fresh one", ns)
		}
		if _, err := f.Hosts[0].Run(ctx, "true"); err != nil {
			t.Errorf("the host in the reclaimed slot: %v", err)
		}
		t.Logf("slot %d reclaimed and reused", slot)
		return
	}
	// In a parallel run another test process may have taken it; either way it is no longer
	// the dead owner's.
	if l, err := tryLockSlot(slot); err == nil && l != nil {
		defer l.release()
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("netns %s of the dead owner is still there", ns)
		}
	}
	t.Logf("slot %d cleared; this fleet got slot %d", slot, f.Hosts[0].Slot)
}

func TestVarLibBerthIsPrivateToEachHost(t *testing.T) {
	f := sharedFleet(t)
	ctx := testContext(t)
	if _, err := f.Hosts[0].Run(ctx, "mkdir -p /var/lib/berth/users && echo mine > /var/lib/berth/users/probe"); err != nil {
		t.Fatal(err)
	}
	if out, _ := f.Hosts[1].Run(ctx, "cat /var/lib/berth/users/probe 2>/dev/null || echo absent"); strings.TrimSpace(out) != "absent" {
		t.Fatalf("host 2 sees host 1's /var/lib/berth: %q", out)
	}
	if _, err := os.Stat("/var/lib/berth"); !os.IsNotExist(err) {
		t.Fatalf("/var/lib/berth appeared on this machine (stat: %v)", err)
	}
	if out, err := f.Hosts[0].Run(ctx, "test -d /var/lib/dpkg && echo there"); err != nil || strings.TrimSpace(out) != "there" {
		t.Fatalf("the layout of /var/lib must be there on hosts: %q %v", out, err)
	}
	// Nothing a host writes elsewhere in /var/lib reaches this machine either.
	if _, err := f.Hosts[0].Run(ctx, "echo host > /var/lib/dpkg/berth-host-probe"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/var/lib/dpkg/berth-host-probe"); !os.IsNotExist(err) {
		os.Remove("/var/lib/dpkg/berth-host-probe")
		t.Fatalf("a host's write to /var/lib/dpkg reached this machine (stat: %v)", err)
	}
}

func TestStartHostAloneWithGivenAdminKey(t *testing.T) {
	if err := Prerequisites(); err != nil {
		missing.Skip(t, err)
	}
	ctx := testContext(t)
	admin, _, err := newAdminKey()
	if err != nil {
		t.Fatal(err)
	}
	h, err := StartHost(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if want := fmt.Sprintf("198.18.%d.2", h.Slot); h.Address != want {
		t.Errorf("address %s, want %s", h.Address, want)
	}
	// The key given is the one root takes, and the host proves its own host key.
	client, err := h.Dial(ctx, "root", admin)
	if err != nil {
		t.Fatal(err)
	}
	client.Close()
	other, _, err := newAdminKey()
	if err != nil {
		t.Fatal(err)
	}
	if client, err := h.Dial(ctx, "root", other); err == nil {
		client.Close()
		t.Fatal("root logged in with a key that is not the admin key")
	}

	ino := holdNetns(t, h.Name)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if left := processesInNetns(ino); len(left) > 0 {
		t.Errorf("processes left in %s after Close: %q", h.Name, left)
	}
	if _, err := os.Stat(h.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there: %v", h.Dir, err)
	}
	if client, err := h.Dial(ctx, "root", admin); err == nil {
		client.Close()
		t.Fatal("the host still answers after Close")
	}
}
