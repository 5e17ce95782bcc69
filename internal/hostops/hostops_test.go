package hostops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/remote"
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

// built is a build user made for a test, with the private half of its key.
type built struct {
	User, Dir string
	Key       []byte
}

// asBuildUser logs in with the build user's own key and runs command.
func asBuildUser(t *testing.T, h *sshhosts.Host, p *built, command string) (string, error) {
	t.Helper()
	signer, err := ssh.ParsePrivateKey(p.Key)
	if err != nil {
		t.Fatalf("the private key does not parse: %v", err)
	}
	return h.RunAs(context.Background(), p.User, signer, command)
}

var uids atomic.Int64

// provision creates a build user for a TaskRun named taskRun (a fresh UID each time).
func provision(t *testing.T, f *sshhosts.Fleet, h *sshhosts.Host, taskRun, sudo string) *built {
	t.Helper()
	var cmds []string
	if sudo != "" {
		cmds = strings.Split(sudo, ",")
	}
	uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", uids.Add(1), time.Now().UnixNano()&0xffffffffffff)
	p := newBuilt(t, UserName(uid, 1))
	dir, err := CreateUser(context.Background(), adminTarget(f, h), NewUser{Name: p.User, AuthorizedKey: p.authorized,
		Owner: "builds/" + taskRun + " " + uid, SudoCommands: cmds})
	if err != nil {
		t.Fatalf("creating a user for %s on %s: %v", taskRun, h.Name, err)
	}
	p.Dir = dir
	t.Cleanup(func() { _ = Clean(context.Background(), adminTarget(f, h), p.User) })
	return &p.built
}

type keyed struct {
	built
	authorized []byte
}

func newBuilt(t *testing.T, user string) *keyed {
	t.Helper()
	return newBuiltWith(t, user, config.DefaultKeyType)
}

func newBuiltWith(t *testing.T, user string, kt config.KeyType) *keyed {
	t.Helper()
	private, authorized, err := NewKey(kt, user)
	if err != nil {
		t.Fatal(err)
	}
	return &keyed{built: built{User: user, Key: private}, authorized: authorized}
}

func TestBuildUserIsUnprivilegedWithExactSudo(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[0]
	p := provision(t, f, h, "build-s390x-abc12", "/usr/bin/whoami, /usr/bin/ls /root")

	if p.Dir != "/home/"+p.User+"/build" {
		t.Fatalf("user-dir %q", p.Dir)
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
	if out, err := asBuildUser(t, h, p, "ulimit -u; test -d "+p.Dir+" && test -w "+p.Dir+" && echo writable"); err != nil ||
		!strings.Contains(out, "8192") || !strings.Contains(out, "writable") {
		t.Fatalf("limits or build dir wrong: %q %v", out, err)
	}
	// Nobody else may look into the home or the build directory; the key file is the user's.
	home := "/home/" + p.User
	modes, err := h.Run(context.Background(), "stat -c '%a %U %n' "+home+" "+p.Dir+" "+home+"/.ssh "+home+"/.ssh/authorized_keys")
	if err != nil {
		t.Fatal(err)
	}
	want := "700 " + p.User + " " + home + "\n700 " + p.User + " " + p.Dir + "\n700 " + p.User + " " + home + "/.ssh\n600 " + p.User + " " + home + "/.ssh/authorized_keys"
	if strings.TrimSpace(modes) != want {
		t.Errorf("modes and owners:\n%s\nwant:\n%s", modes, want)
	}
	// The private key never touched the host: no private key file in the user's home.
	if out, err := h.Run(context.Background(), "grep -rl 'PRIVATE KEY' "+home+" || true"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("private key material on the host: %q %v", out, err)
	}
	if _, err := os.Stat(home); !os.IsNotExist(err) {
		t.Fatal("the build user's home appeared on this machine, not on the host")
	}
}

func TestCreatingAnExistingUserChangesNothing(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[1]
	first := provision(t, f, h, "created-once", "")
	again := newBuilt(t, first.User)
	_, err := CreateUser(context.Background(), adminTarget(f, h), NewUser{Name: first.User, AuthorizedKey: again.authorized, Owner: "builds/created-once x"})
	if !errors.Is(err, ErrUserExists) {
		t.Fatalf("creating %s again: %v, want ErrUserExists", first.User, err)
	}
	if _, err := asBuildUser(t, h, first, "true"); err != nil {
		t.Fatalf("the first key no longer works: %v", err)
	}
	if _, err := asBuildUser(t, h, &again.built, "true"); err == nil {
		t.Fatal("the second key was installed")
	}
	// A home left without its user (a provision cut short) is not reused either.
	orphan := newBuilt(t, UserName("7d0c7e36-63b5-4b8c-9c4e-2b7f6f3d1a55", 3))
	if _, err := h.Run(context.Background(), "mkdir -p /home/"+orphan.User); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Clean(context.Background(), adminTarget(f, h), orphan.User) })
	_, err = CreateUser(context.Background(), adminTarget(f, h), NewUser{Name: orphan.User, AuthorizedKey: orphan.authorized})
	if !errors.Is(err, ErrUserExists) {
		t.Fatalf("creating a user over a leftover home: %v, want ErrUserExists", err)
	}
}

func hostTree(t *testing.T, h *sshhosts.Host) string {
	t.Helper()
	tree, err := h.Fingerprint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// TestPlantedLinksNeverTurnRootAgainstTheHost: a build user plants links to root's files in
// its home; creating a user of that name again must fail and change nothing, and removing it
// must leave /etc and /root exactly as they were before the user existed.
func TestPlantedLinksNeverTurnRootAgainstTheHost(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[2]
	ctx := context.Background()
	if _, err := h.Run(ctx, "mkdir -p /etc/sudoers.d && touch /etc/sudoers.d/keep && echo secret > /root/keep"); err != nil {
		t.Fatal(err)
	}
	before := hostTree(t, h)
	p := provision(t, f, h, "plants-links", "")
	plant := `set -e; cd ~; rm -rf build; ln -s /etc build; ln -s /root rootlink
mv .ssh/authorized_keys keys; ln -s /etc/sudoers.d/x .ssh/authorized_keys.new; ln -s /etc/shadow .ssh/known_hosts
ln -s /etc/sudoers.d/keep .ssh/rc; cp keys .ssh/authorized_keys`
	if out, err := asBuildUser(t, h, p, plant); err != nil {
		t.Fatalf("planting links: %v %s", err, out)
	}
	again := newBuilt(t, p.User)
	if _, err := CreateUser(ctx, adminTarget(f, h), NewUser{Name: p.User, AuthorizedKey: again.authorized}); !errors.Is(err, ErrUserExists) {
		t.Fatalf("creating over the planted home: %v, want ErrUserExists", err)
	}
	if err := Clean(ctx, adminTarget(f, h), p.User); err != nil {
		t.Fatal(err)
	}
	if after := hostTree(t, h); after != before {
		t.Errorf("files outside the build user's home changed:\n%s", diffLines(before, after))
	}
	if out, err := h.Run(ctx, "test -e /home/"+p.User+" && echo left; cat /root/keep; test -e /etc/sudoers.d/keep && echo kept"); err != nil ||
		strings.TrimSpace(out) != "secret\nkept" {
		t.Fatalf("after the clean: %q %v", out, err)
	}
}

// diffLines lists the lines only one of a and b has.
func diffLines(a, b string) string {
	in := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		in[l]++
	}
	var d []string
	for _, l := range strings.Split(b, "\n") {
		if in[l] > 0 {
			in[l]--
			continue
		}
		d = append(d, "+ "+l)
	}
	for l, n := range in {
		for range n {
			d = append(d, "- "+l)
		}
	}
	return strings.Join(d, "\n")
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
	u := newBuilt(t, UserName("3f1d8a52-9b7e-4c2a-8d6f-1e5b7c9a0d24", 1))
	_, err := CreateUser(ctx, pinnedWrong, NewUser{Name: u.User, AuthorizedKey: u.authorized})
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
	u := newBuilt(t, UserName("5e2c9d71-4a8b-4f3e-b6c1-7d9a2e4f8b13", 1))
	_, err := CreateUser(ctx, target, NewUser{Name: u.User, AuthorizedKey: u.authorized})
	var unreachable *remote.UnreachableError
	if !errors.As(err, &unreachable) || !strings.Contains(err.Error(), h.Address) {
		t.Fatalf("want an UnreachableError naming %s, got %v", h.Address, err)
	}
	if ctx.Err() != nil {
		t.Fatal("the dial was not bounded by its timeout")
	}
}

func TestHostileInputsAreRejected(t *testing.T) {
	good := newBuilt(t, UserName("9c4e1b27-5d3a-4e8f-a2b6-0f7d1c3e5a98", 1))
	for _, tc := range []struct {
		u    NewUser
		want string
	}{
		{NewUser{Name: "root", AuthorizedKey: good.authorized}, "not a berth build user name"},
		{NewUser{Name: "u-../../etc", AuthorizedKey: good.authorized}, "not a berth build user name"},
		{NewUser{Name: LegacyUserName("builds", "x"), AuthorizedKey: good.authorized}, "not a berth build user name"},
		{NewUser{Name: good.User, AuthorizedKey: []byte("ssh-ed25519 AAAA; rm -rf /")}, "not exactly one public key"},
		{NewUser{Name: good.User, AuthorizedKey: append(append([]byte{}, good.authorized...), good.authorized...)}, "not exactly one public key"},
		{NewUser{Name: good.User, AuthorizedKey: good.authorized, Owner: "builds/x\nALL ALL=(ALL) ALL"}, "control character"},
		{NewUser{Name: good.User, AuthorizedKey: good.authorized, SudoCommands: []string{"/usr/bin/podman; rm -rf /"}}, "sudo"},
		{NewUser{Name: good.User, AuthorizedKey: good.authorized, SudoCommands: []string{"ALL"}}, "sudo"},
		{NewUser{Name: good.User, AuthorizedKey: good.authorized, SudoCommands: []string{"/usr/bin/$(id)"}}, "sudo"},
	} {
		// The target is unusable: a request that got past validation would fail to dial instead.
		_, err := CreateUser(context.Background(), remote.Target{}, tc.u)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.60q: want a rejection with %q, got %v", fmt.Sprintf("%+v", tc.u), tc.want, err)
		}
	}
}

func TestUserNameIsStableAndValid(t *testing.T) {
	a, b := LegacyUserName("builds", "x"), LegacyUserName("builds", "x")
	if a != b || !userNameRE.MatchString(a) || LegacyUserName("build", "sx") == a {
		t.Fatalf("UserName: %q %q", a, b)
	}
}
