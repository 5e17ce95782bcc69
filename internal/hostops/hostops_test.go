package hostops

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/remote"
	"github.com/berth-ci/berth/internal/testground/sshhosts"
)

func TestMain(m *testing.M) {
	code := m.Run()
	sshhosts.CloseShared()
	os.Exit(code)
}

const hosts = 3

func adminTarget(f *sshhosts.Fleet, h *sshhosts.Host) remote.Target {
	return remote.Target{Address: h.Address, User: "root", Signer: f.AdminSigner,
		HostKeys: remote.Pinned{Key: h.HostKey}, DialTimeout: 5 * time.Second}
}

// asBuildUser logs in with the key from a provisioned secret and runs command.
func asBuildUser(t *testing.T, h *sshhosts.Host, p *Provisioned, command string) (string, error) {
	t.Helper()
	signer, err := ssh.ParsePrivateKey(p.PrivateKeyPEM)
	if err != nil {
		t.Fatalf("the provisioned private key does not parse: %v", err)
	}
	return h.RunAs(context.Background(), p.User, signer, command)
}

func provision(t *testing.T, f *sshhosts.Fleet, h *sshhosts.Host, taskRun, sudo string) *Provisioned {
	t.Helper()
	p, err := Provision(context.Background(), ProvisionRequest{
		Target: adminTarget(f, h), Namespace: "builds", TaskRun: taskRun, SudoCommands: sudo, Platform: "linux/s390x",
	})
	if err != nil {
		t.Fatalf("provision %s on %s: %v", taskRun, h.Name, err)
	}
	t.Cleanup(func() { _ = Clean(context.Background(), adminTarget(f, h), p.User) })
	return p
}

func TestProvisionedUserIsUnprivilegedWithExactSudo(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[0]
	p := provision(t, f, h, "build-s390x-abc12", "/usr/bin/whoami, /usr/bin/ls /root")

	if p.User != LegacyUserName("builds", "build-s390x-abc12") || p.Address != h.Address || p.Host() != p.User+"@"+h.Address {
		t.Fatalf("provisioned %+v", p)
	}
	if p.UserDir != "/home/"+p.User+"/build" {
		t.Fatalf("user-dir %q", p.UserDir)
	}
	id, err := asBuildUser(t, h, p, "id")
	if err != nil {
		t.Fatalf("logging in as the build user: %v", err)
	}
	if strings.Contains(id, "uid=0") || strings.Contains(id, "(root)") {
		t.Fatalf("the build user is root: %s", id)
	}
	for _, group := range []string{"sudo", "wheel", "adm"} {
		if strings.Contains(id, "("+group+")") {
			t.Fatalf("the build user is in group %s: %s", group, id)
		}
	}
	if out, err := asBuildUser(t, h, p, "sudo -n /usr/bin/whoami"); err != nil || strings.TrimSpace(out) != "root" {
		t.Fatalf("the allowed sudo command failed: %q %v", out, err)
	}
	if _, err := asBuildUser(t, h, p, "sudo -n /usr/bin/ls /root"); err != nil {
		t.Fatalf("the allowed sudo command with its argument failed: %v", err)
	}
	for _, denied := range []string{"sudo -n /usr/bin/id", "sudo -n /usr/bin/ls /etc", "sudo -n /bin/sh -c whoami"} {
		if out, err := asBuildUser(t, h, p, denied); err == nil {
			t.Errorf("%q was allowed: %s", denied, out)
		}
	}
	if out, err := asBuildUser(t, h, p, "ulimit -u; test -d "+p.UserDir+" && test -w "+p.UserDir+" && echo writable"); err != nil ||
		!strings.Contains(out, "4096") || !strings.Contains(out, "writable") {
		t.Fatalf("limits or build dir wrong: %q %v", out, err)
	}
	// The private key never touched the host: no private key file in the user's home.
	if out, err := h.Run(context.Background(), "grep -rl 'PRIVATE KEY' /home/"+p.User+" || true"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("private key material on the host: %q %v", out, err)
	}
	if _, err := os.Stat("/home/" + p.User); !os.IsNotExist(err) {
		t.Fatal("the build user's home appeared on this machine, not on the host")
	}
}

func TestRetriedProvisionReplacesTheKey(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[1]
	first := provision(t, f, h, "retried", "")
	second := provision(t, f, h, "retried", "")
	if first.User != second.User {
		t.Fatalf("a retry made a second user: %s, %s", first.User, second.User)
	}
	if _, err := asBuildUser(t, h, second, "true"); err != nil {
		t.Fatalf("the new key does not work: %v", err)
	}
	if _, err := asBuildUser(t, h, first, "true"); err == nil {
		t.Fatal("the key of the first attempt still works")
	}
	if _, err := asBuildUser(t, h, second, "sudo -n /usr/bin/whoami"); err == nil {
		t.Fatal("a user without SUDO_COMMANDS can sudo")
	}
}

func TestCleanRemovesUserHomeAndProcesses(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[2]
	ctx := context.Background()
	p := provision(t, f, h, "cleaned", "")
	uid, err := asBuildUser(t, h, p, "setsid sleep 600 </dev/null >/dev/null 2>&1 & id -u")
	if err != nil {
		t.Fatal(err)
	}
	uid = strings.TrimSpace(uid)
	if out, _ := h.Run(ctx, "pgrep -u "+uid+" sleep"); strings.TrimSpace(out) == "" {
		t.Fatal("the build's background process did not start")
	}
	if err := Clean(ctx, adminTarget(f, h), p.User); err != nil {
		t.Fatalf("clean: %v", err)
	}
	if out, err := h.Run(ctx, "id "+p.User); err == nil {
		t.Fatalf("user still exists: %s", out)
	}
	if out, _ := h.Run(ctx, "pgrep -u "+uid+"; test -e /home/"+p.User+" && echo home-left; ls /etc/sudoers.d /etc/security/limits.d /var/lib/berth/users | grep "+p.User+" || true"); strings.TrimSpace(out) != "" {
		t.Fatalf("left behind: %q", out)
	}
	if err := Clean(ctx, adminTarget(f, h), p.User); err != nil {
		t.Fatalf("a second clean must succeed: %v", err)
	}
}

func TestCleanRefusesNonBuildUsers(t *testing.T) {
	for _, user := range []string{"root", "u-../../etc", "u-123", "ubuntu"} {
		if err := Clean(context.Background(), remote.Target{}, user); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Errorf("Clean(%q) = %v, want a refusal", user, err)
		}
	}
}

type memoryKnownHosts struct {
	mu   sync.Mutex
	keys map[string]string
}

func (m *memoryKnownHosts) Lookup(_ context.Context, host string) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.keys[host]
	return k, ok, nil
}

func (m *memoryKnownHosts) Record(_ context.Context, host, key string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k, ok := m.keys[host]; ok {
		return k, nil
	}
	m.keys[host] = key
	return key, nil
}

func TestChangedHostKeyIsRefused(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h, other := f.Hosts[0], f.Hosts[1]
	ctx := context.Background()

	pinnedWrong := adminTarget(f, h)
	pinnedWrong.HostKeys = remote.Pinned{Key: other.HostKey}
	_, err := Provision(ctx, ProvisionRequest{Target: pinnedWrong, Namespace: "builds", TaskRun: "pinned", Platform: "linux/s390x"})
	var changed *remote.HostKeyChangedError
	if !errors.As(err, &changed) || changed.Host != h.Address || !strings.Contains(err.Error(), "not the pinned") {
		t.Fatalf("want a refusal naming %s, got %v", h.Address, err)
	}

	store := &memoryKnownHosts{keys: map[string]string{}}
	tofu := adminTarget(f, h)
	tofu.HostKeys = remote.TrustOnFirstUse{Store: store}
	if err := Clean(ctx, tofu, LegacyUserName("builds", "never-made")); err != nil {
		t.Fatalf("first contact must be accepted and recorded: %v", err)
	}
	if got := store.keys[h.Address]; got != strings.TrimSpace(string(ssh.MarshalAuthorizedKey(h.HostKey))) {
		t.Fatalf("recorded %q, want the host's key", got)
	}
	// The host is "rebuilt": the record now disagrees with what it presents.
	store.keys[h.Address] = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(other.HostKey)))
	err = Clean(ctx, tofu, LegacyUserName("builds", "never-made"))
	if !errors.As(err, &changed) || !strings.Contains(err.Error(), "host "+h.Address+" presented SSH host key") {
		t.Fatalf("want a refusal of the changed key, got %v", err)
	}
}

func TestUnreachableHostFailsInBoundedTimeNamingTheHost(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[2]
	if err := h.Cut(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := h.Restore(); err != nil {
			t.Fatal(err)
		}
	}()
	target := adminTarget(f, h)
	target.DialTimeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Provision(ctx, ProvisionRequest{Target: target, Namespace: "builds", TaskRun: "cut-off", Platform: "linux/s390x"})
	var unreachable *remote.UnreachableError
	if !errors.As(err, &unreachable) || !strings.Contains(err.Error(), h.Address) {
		t.Fatalf("want an UnreachableError naming %s, got %v", h.Address, err)
	}
	if ctx.Err() != nil {
		t.Fatal("the dial was not bounded by its timeout")
	}
}

func TestHostileInputsAreRejected(t *testing.T) {
	for _, tc := range []struct{ ns, name, sudo, want string }{
		{"builds", "a'b", "", "TASKRUN_NAME"},
		{"builds", "$(reboot)", "", "TASKRUN_NAME"},
		{"builds", "line\nbreak", "", "TASKRUN_NAME"},
		{"builds", strings.Repeat("a", 300), "", "TASKRUN_NAME"},
		{strings.Repeat("n", 300), "ok", "", "NAMESPACE"},
		{"bu;lds", "ok", "", "NAMESPACE"},
		{"builds", "ok", "/usr/bin/podman; rm -rf /", "SUDO_COMMANDS"},
		{"builds", "ok", "/usr/bin/podman\nALL ALL=(ALL) ALL", "SUDO_COMMANDS"},
		{"builds", "ok", "ALL", "SUDO_COMMANDS"},
		{"builds", "ok", "/usr/bin/$(id)", "SUDO_COMMANDS"},
		{"builds", "ok", strings.Repeat("/x", 200) + " 'q'", "SUDO_COMMANDS"},
	} {
		// The target is unusable: a request that got past validation would fail to dial instead.
		_, err := Provision(context.Background(), ProvisionRequest{Namespace: tc.ns, TaskRun: tc.name, SudoCommands: tc.sudo, Platform: "linux/s390x"})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ns=%.20q name=%.20q sudo=%.30q: want a rejection of %s, got %v", tc.ns, tc.name, tc.sudo, tc.want, err)
		}
	}
}

func TestPremadeUserPlatforms(t *testing.T) {
	p, err := Provision(context.Background(), ProvisionRequest{
		Target: remote.Target{Address: "mac-1.example.com", User: "builder"}, AdminKeyPEM: []byte("KEY"),
		Namespace: "builds", TaskRun: "mac-build", Platform: "darwin/arm64",
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.Host() != "builder@mac-1.example.com" || string(p.PrivateKeyPEM) != "KEY" || p.UserDir != "berth-builds/"+LegacyUserName("builds", "mac-build") {
		t.Fatalf("darwin task got %+v", p)
	}
}

func TestUserNameIsStableAndValid(t *testing.T) {
	a, b := LegacyUserName("builds", "x"), LegacyUserName("builds", "x")
	if a != b || !userNameRE.MatchString(a) || LegacyUserName("build", "sx") == a {
		t.Fatalf("UserName: %q %q", a, b)
	}
}
