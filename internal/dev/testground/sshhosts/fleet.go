//go:build linux

// Package sshhosts starts real OpenSSH servers on this machine for tests to use as remote
// hosts. Each host is an sshd in namespaces of its own: a network namespace with its own
// address in 198.18.0.0/15, a mount namespace whose /etc, /home, /root, /tmp, /var/tmp,
// /var/log, /var/mail, /var/lib and /run are private directories (so useradd on a host never
// touches this machine's accounts), and a PID namespace (so pkill on a host never reaches another
// host's processes or this machine's). root logs in with the fleet's admin key. Every host can
// take a remote build as the buildah-remote Tasks (and the Tasks `berth taskgen` makes) send
// it: rsync, and a podman stand-in that builds a real image or runs a step (see PodmanPath).
//
// It needs root, /usr/sbin/sshd (Debian's openssh-server, which `make test` installs),
// iproute2 and util-linux; see Prerequisites. A remote build also needs rsync and buildah;
// see BuildPrerequisites.
package sshhosts

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/dev/testground/missing"
)

// Fleet is a set of hosts started together; they share one admin key.
type Fleet struct {
	Hosts []*Host
	// AdminSigner logs in as root on every host.
	AdminSigner ssh.Signer
	// AdminKeyPEM is AdminSigner's private key (ed25519) as an OpenSSH PEM file, the form ssh
	// and a Kubernetes Secret's id_rsa entry take.
	AdminKeyPEM []byte

	closeOnce sync.Once
	closeErr  error
}

// Start starts n hosts and returns once each sshd answers. It first clears what killed test
// processes left behind (hosts whose owner is gone); hosts of live processes, such as other
// test packages running alongside, are left alone.
func Start(ctx context.Context, n int) (*Fleet, error) {
	if n < 1 || n > maxSlot {
		return nil, fmt.Errorf("sshhosts: %d hosts requested, want 1 to %d", n, maxSlot)
	}
	if err := prepareMachine(); err != nil {
		return nil, err
	}

	signer, pemBytes, err := newAdminKey()
	if err != nil {
		return nil, fmt.Errorf("sshhosts: admin key: %w", err)
	}
	f := &Fleet{AdminSigner: signer, AdminKeyPEM: pemBytes}

	locks, err := claimSlots(n)
	if err != nil {
		return nil, fmt.Errorf("sshhosts: %w", err)
	}
	f.Hosts = make([]*Host, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, lock := range locks {
		wg.Go(func() {
			f.Hosts[i], errs[i] = startHost(ctx, lock, signer)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return f, nil
}

// Close stops every host and removes its namespace, veth and files. Later calls return the
// first call's result.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		errs := make([]error, len(f.Hosts))
		var wg sync.WaitGroup
		for i, h := range f.Hosts {
			if h == nil {
				continue
			}
			wg.Go(func() { errs[i] = h.Close() })
		}
		wg.Wait()
		f.closeErr = errors.Join(errs...)
	})
	return f.closeErr
}

// StartHost starts one host whose root logs in with admin and returns once its sshd answers;
// Close stops it. It is for callers that bring hosts up and down one at a time, at their own
// pace and in parallel, such as a VM cloud whose VMs are hosts. Like Start, it first clears
// what killed test processes left behind.
func StartHost(ctx context.Context, admin ssh.Signer) (*Host, error) {
	if admin == nil {
		return nil, errors.New("sshhosts: StartHost needs an admin signer")
	}
	if err := prepareMachine(); err != nil {
		return nil, err
	}
	locks, err := claimSlots(1)
	if err != nil {
		return nil, fmt.Errorf("sshhosts: %w", err)
	}
	h, err := startHost(ctx, locks[0], admin)
	if err != nil {
		return nil, errors.Join(err, h.Close())
	}
	return h, nil
}

// Exited is closed once the host's sshd (its whole process tree) is gone: after Close, or when
// it died.
func (h *Host) Exited() <-chan struct{} { return h.exited }

// Close stops the host and removes its namespace, veth and files, giving its slot back.
// Later calls return the first call's result: a slot given back may already be another
// host's, so it is cleared only once.
func (h *Host) Close() error {
	h.closeOnce.Do(func() { h.closeErr = h.stop() })
	return h.closeErr
}

// machineChecked is set once Prerequisites has passed in this process; a cloud starting hosts
// one by one need not fork a test unshare before each.
var machineChecked struct {
	sync.Mutex
	ok bool
}

// prepareMachine makes sure hosts can run here and clears leftovers of dead test processes.
func prepareMachine() error {
	machineChecked.Lock()
	if !machineChecked.ok {
		if err := Prerequisites(); err != nil {
			machineChecked.Unlock()
			return err
		}
		machineChecked.ok = true
	}
	machineChecked.Unlock()
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return fmt.Errorf("sshhosts: %w", err)
	}
	if err := removeLeftovers(); err != nil {
		return fmt.Errorf("sshhosts: removing leftovers of earlier runs: %w", err)
	}
	return nil
}

func newAdminKey() (ssh.Signer, []byte, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	pemBytes, err := marshalPrivateKey(priv, "berth-test-admin")
	if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, nil, err
	}
	return signer, pemBytes, nil
}

func marshalPrivateKey(key ed25519.PrivateKey, comment string) ([]byte, error) {
	block, err := ssh.MarshalPrivateKey(key, comment)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(block), nil
}

// Prerequisites says what this machine lacks to run hosts, and how to get it; nil when
// nothing.
func Prerequisites() error {
	var missing []error
	if os.Geteuid() != 0 {
		missing = append(missing, errors.New("not running as root: network and mount namespaces need it (run the tests as root, as CI does)"))
	}
	if _, err := os.Stat(sshdPath); err != nil {
		missing = append(missing, fmt.Errorf("%s is missing: `make test` installs it, or run `apt-get install -y --no-install-recommends openssh-server`", sshdPath))
	}
	tools := []struct{ name, pkg string }{
		{"ip", "iproute2"},
		{"unshare", "util-linux"},
		{"mount", "mount"},
		{"hostname", "hostname"},
		{"cp", "coreutils"},
		{"sh", "dash"},
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool.name); err != nil {
			missing = append(missing, fmt.Errorf("%s is missing: apt-get install -y %s", tool.name, tool.pkg))
		}
	}
	if len(missing) == 0 {
		// Containers often forbid namespaces even to root; find out now rather than halfway
		// through a host.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "unshare", "--net", "--mount", "--uts", "--ipc", "--pid", "--fork", "--mount-proc", "true").CombinedOutput()
		if err != nil {
			missing = append(missing, fmt.Errorf("cannot create namespaces here (unshare: %v: %s); run on a machine or container that allows them (privileged)", err, out))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("sshhosts cannot run test hosts: %w", errors.Join(missing...))
	}
	return nil
}

// StartForTest starts n hosts for t and stops them when t ends. When this machine cannot run
// hosts it skips t, saying why, except in CI (CI=true), where that is a failure.
func StartForTest(t testing.TB, n int) *Fleet {
	t.Helper()
	if err := Prerequisites(); err != nil {
		missing.Skip(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := Start(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			f.LogTails(t, 30)
		}
		if err := f.Close(); err != nil {
			t.Errorf("closing test hosts: %v", err)
		}
	})
	return f
}

// LogTails logs the end of each host's sshd log to t, which is where a refused login
// explains itself. Call it before Close, which deletes the logs.
func (f *Fleet) LogTails(t testing.TB, lines int) {
	t.Helper()
	for _, h := range f.Hosts {
		t.Logf("%s: end of %s:\n%s", h.Name, h.LogPath, h.LogTail(lines))
	}
}

var sharedHosts struct {
	sync.Mutex
	fleet *Fleet
	err   error
}

// Shared returns one fleet of n hosts for the whole test binary, started on first use, so the
// tests of a package pay for starting hosts once. Call CloseShared from TestMain after m.Run.
// Tests sharing hosts must not leave state on them that another test would trip over.
func Shared(t testing.TB, n int) *Fleet {
	t.Helper()
	sharedHosts.Lock()
	defer sharedHosts.Unlock()
	if sharedHosts.fleet == nil && sharedHosts.err == nil {
		if sharedHosts.err = Prerequisites(); sharedHosts.err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			sharedHosts.fleet, sharedHosts.err = Start(ctx, n)
			cancel()
		}
	}
	if sharedHosts.err != nil {
		missing.Skip(t, sharedHosts.err)
	}
	f := sharedHosts.fleet
	if len(f.Hosts) < n {
		t.Fatalf("the shared fleet has %d hosts, this test wants %d", len(f.Hosts), n)
	}
	t.Cleanup(func() {
		if t.Failed() {
			f.LogTails(t, 30) // a refused login explains itself in sshd's log
		}
	})
	return f
}

// CloseShared stops the fleet Shared started, if any.
func CloseShared() {
	sharedHosts.Lock()
	defer sharedHosts.Unlock()
	if sharedHosts.fleet != nil {
		_ = sharedHosts.fleet.Close()
		sharedHosts.fleet = nil
	}
}
