//go:build linux

package sshhosts

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

const (
	sshdPath = "/usr/sbin/sshd"
	sshPort  = "22"

	// DefaultDialTimeout bounds Dial when the host has no DialTimeout of its own.
	DefaultDialTimeout = 10 * time.Second

	readyTimeout = 15 * time.Second
)

// Host is one test host: an sshd with its own network, mount, PID, UTS and IPC namespaces.
type Host struct {
	// Name is the host's network namespace and hostname: berth-host-N.
	Name string
	// Slot is N: the host is 198.18.N.2, this machine is 198.18.N.1 on link berthN.
	Slot int
	// Address is the host's IP; sshd listens on Address:22 only.
	Address string
	// HostKey is the key the host's sshd proves itself with; Dial accepts nothing else.
	HostKey ssh.PublicKey

	// Dir holds all of the host's files on this machine; Close removes it.
	Dir string
	// EtcDir is what the host sees as /etc: a copy of this machine's /etc taken at Start.
	EtcDir string
	// HomeDir is what the host sees as /home, empty at Start.
	HomeDir string
	// RootHomeDir is what the host sees as /root, empty at Start.
	RootHomeDir string
	// LogPath is sshd's log (-e, LogLevel VERBOSE): logins, refused keys, StrictModes
	// complaints.
	LogPath string

	// DialTimeout bounds Dial (connect and handshake), and so Run's login, on top of their
	// context; DefaultDialTimeout when zero.
	DialTimeout time.Duration

	admin  ssh.Signer
	lock   *slotLock
	cmd    *exec.Cmd
	exited chan struct{} // closed once the host's process tree is gone

	closeOnce sync.Once
	closeErr  error
}

// Addr is the host's sshd address, for ssh.Dial and the like.
func (h *Host) Addr() string { return net.JoinHostPort(h.Address, sshPort) }

// Each private directory is bind-mounted over the path the host sees. /etc and /home are the
// point of the exercise: useradd and friends on a host must never reach this machine's
// accounts. The others keep what a host's users and root write (root's dotfiles, temp files,
// lastlog and mail from useradd, sudo's timestamps in /run) on that host, as on a real one.
var privateMounts = []struct {
	source, target string
	mode           os.FileMode
}{
	{"home", "/home", 0o755},
	{"root", "/root", 0o700},
	{"var-tmp", "/var/tmp", 0o777 | os.ModeSticky},
	{"var-log", "/var/log", 0o755},
	{"var-mail", "/var/mail", 0o775 | os.ModeSetgid},
	{"run", "/run", 0o755},
	{"tmp", "/tmp", 0o777 | os.ModeSticky},
}

// startHost prepares a claimed slot and starts its sshd; it returns once sshd answers.
func startHost(ctx context.Context, lock *slotLock, admin ssh.Signer) (*Host, error) {
	slot := lock.slot
	h := &Host{
		Name:    netnsName(slot),
		Slot:    slot,
		Address: hostIP(slot),
		admin:   admin,
		lock:    lock,
	}
	dir, err := os.MkdirTemp("", h.Name+"-")
	if err != nil {
		return h, fmt.Errorf("%s: %w", h.Name, err)
	}
	h.Dir = dir
	h.EtcDir = filepath.Join(dir, "etc")
	h.HomeDir = filepath.Join(dir, "home")
	h.RootHomeDir = filepath.Join(dir, "root")
	h.LogPath = filepath.Join(dir, "sshd.log")
	if err := lock.write(slotRecord{pid: os.Getpid(), dir: dir}); err != nil {
		return h, err
	}

	if err := h.prepareFiles(ctx); err != nil {
		return h, fmt.Errorf("%s: %w", h.Name, err)
	}
	if err := createNetwork(ctx, slot); err != nil {
		return h, err
	}
	if err := h.launch(); err != nil {
		return h, err
	}
	if err := h.waitReady(ctx, readyTimeout); err != nil {
		return h, err
	}
	return h, nil
}

func (h *Host) prepareFiles(ctx context.Context) error {
	if err := runCommand(ctx, "cp", "-a", "/etc", h.EtcDir); err != nil {
		return err
	}
	// The copy carries this machine's own host keys; a host has its own, and this machine's
	// private keys have no business in a test host's tree.
	oldKeys, _ := filepath.Glob(filepath.Join(h.EtcDir, "ssh", "ssh_host_*"))
	for _, k := range oldKeys {
		if err := os.Remove(k); err != nil {
			return err
		}
	}

	for _, m := range privateMounts {
		if m.target == "/var/mail" {
			if _, err := os.Stat("/var/mail"); err != nil {
				continue
			}
		}
		p := filepath.Join(h.Dir, m.source)
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		if err := os.Chmod(p, m.mode); err != nil {
			return err
		}
	}
	if st, err := os.Stat("/var/mail"); err == nil {
		// Debian's mail spool is group mail, and tools that write it check that.
		gid := int(st.Sys().(*syscall.Stat_t).Gid)
		if err := os.Chown(filepath.Join(h.Dir, "var-mail"), 0, gid); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		{"run/sshd", 0o755}, // sshd's privilege separation directory; it insists on root 0755
		{"run/lock", 0o777 | os.ModeSticky},
	} {
		p := filepath.Join(h.Dir, d.path)
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}

	if err := os.WriteFile(filepath.Join(h.Dir, podmanStandInFile), podmanStandIn, 0o755); err != nil {
		return err
	}

	hostKey, err := h.writeHostKey()
	if err != nil {
		return err
	}
	h.HostKey = hostKey

	// The admin key lives in the host's /etc rather than in root's ~/.ssh, so whatever a test
	// does to a host's /root (which starts empty) cannot lock the fleet out.
	keysDir := filepath.Join(h.EtcDir, "ssh", "authorized_keys")
	if err := os.Mkdir(keysDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(keysDir, "root"), ssh.MarshalAuthorizedKey(h.admin.PublicKey()), 0o644); err != nil {
		return err
	}

	if err := os.WriteFile(filepath.Join(h.EtcDir, "ssh", "berth_sshd_config"), []byte(h.sshdConfig()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(h.EtcDir, "hostname"), []byte(h.Name+"\n"), 0o644); err != nil {
		return err
	}
	// sudo looks its own hostname up; without this line the lookup goes to DNS, which a host
	// cannot reach, and every sudo prints "unable to resolve host".
	hostsPath := filepath.Join(h.EtcDir, "hosts")
	hosts, err := os.ReadFile(hostsPath)
	if err != nil {
		return err
	}
	if len(hosts) > 0 && !bytes.HasSuffix(hosts, []byte("\n")) {
		hosts = append(hosts, '\n')
	}
	hosts = fmt.Appendf(hosts, "%s\t%s\n", h.Address, h.Name)
	return os.WriteFile(hostsPath, hosts, 0o644)
}

func (h *Host) writeHostKey() (ssh.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	pemBytes, err := marshalPrivateKey(priv, "root@"+h.Name)
	if err != nil {
		return nil, err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, err
	}
	keyPath := filepath.Join(h.EtcDir, "ssh", "berth_host_ed25519_key")
	if err := os.WriteFile(keyPath, pemBytes, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyPath+".pub", ssh.MarshalAuthorizedKey(sshPub), 0o644); err != nil {
		return nil, err
	}
	return sshPub, nil
}

// sshdConfig is the whole config: nothing is included from the copied /etc/ssh, so the host
// behaves the same whatever this machine's sshd_config says.
//
// UsePAM yes is Debian's default and matters for later work: without PAM, sshd refuses any
// account whose shadow password starts with "!", which is every account useradd creates, so
// key logins for new users would fail until their password field was changed.
func (h *Host) sshdConfig() string {
	return fmt.Sprintf(`# Written by berth's sshhosts for test host %[1]s.
ListenAddress %[2]s
HostKey /etc/ssh/berth_host_ed25519_key
PidFile /run/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile /etc/ssh/authorized_keys/%%u .ssh/authorized_keys
UsePAM yes
StrictModes yes
UseDNS no
PrintMotd no
LogLevel VERBOSE
MaxStartups 100:30:200
MaxSessions 100
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
`, h.Name, h.Addr())
}

// launchScript runs inside the host's fresh namespaces. Its working directory is the host's
// Dir, and the mount sources are relative to it, so mounting over /tmp (where Dir may live)
// cannot hide the sources still to come.
func (h *Host) launchScript() string {
	var b strings.Builder
	b.WriteString("set -e\n")
	fmt.Fprintf(&b, "hostname %s\n", h.Name)
	b.WriteString("mount --bind etc /etc\n")
	// berth keeps its own state under /var/lib/berth, and a host's root may write anywhere
	// in /var/lib (sudo's lecture marks, a rootful podman's image store), so the host's
	// /var/lib is private: an empty berth directory and an empty stand-in of each of this
	// machine's entries, so the usual layout is there and nothing reaches this machine.
	b.WriteString(`mkdir -p varlib/berth
for e in /var/lib/*; do
	[ -e "$e" ] || continue
	n=${e##*/}
	[ "$n" = berth ] && continue
	if [ -d "$e" ]; then mkdir -p "varlib/$n"; else : > "varlib/$n"; fi
done
mount --bind varlib /var/lib
`)
	b.WriteString(localBinScript)
	for _, m := range privateMounts {
		if _, err := os.Stat(filepath.Join(h.Dir, m.source)); err != nil {
			continue
		}
		fmt.Fprintf(&b, "mount --bind %s %s\n", m.source, m.target)
	}
	b.WriteString("mount -t tmpfs -o mode=1777 tmpfs /dev/shm\n")
	b.WriteString("cd /\n")
	fmt.Fprintf(&b, "exec %s -D -e -f /etc/ssh/berth_sshd_config\n", sshdPath)
	return b.String()
}

// launch starts `ip netns exec berth-host-N unshare ... sshd`. ip execs unshare in place, so
// h.cmd.Process is unshare. unshare forks the host's PID 1 (the shell, then sshd) and, with
// --kill-child, takes it down when unshare itself dies; when PID 1 dies the kernel kills
// every other process in the PID namespace. So killing h.cmd.Process brings the whole host
// down, and a pkill on a host can only ever reach that host's processes.
func (h *Host) launch() error {
	logFile, err := os.OpenFile(h.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: %w", h.Name, err)
	}
	defer logFile.Close() // the child has its own copy

	cmd := exec.Command("ip", "netns", "exec", h.Name,
		"unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc",
		"--propagation", "private",
		"sh", "-c", h.launchScript())
	cmd.Dir = h.Dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// If this test process dies without Close (SIGKILL, a panic in another goroutine, go
	// test's timeout), the host dies with it rather than holding its address and slot.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	h.cmd = cmd
	h.exited = make(chan struct{})

	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that started the child exits, not the process, and
		// Go may retire idle threads. Holding this goroutine on its thread until the child is
		// gone ties the signal to this process's life.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(h.exited)
			return
		}
		started <- nil
		cmd.Wait()
		close(h.exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("%s: start sshd: %w", h.Name, err)
	}
	return nil
}

// waitReady waits until sshd answers with its banner, or fails with the end of its log.
func (h *Host) waitReady(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var lastErr error
	for {
		select {
		case <-h.exited:
			return fmt.Errorf("%s: sshd exited during start; end of %s:\n%s", h.Name, h.LogPath, h.LogTail(20))
		default:
		}
		if lastErr = h.probe(ctx); lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: sshd not answering on %s: %w (last try: %v); end of %s:\n%s",
				h.Name, h.Addr(), ctx.Err(), lastErr, h.LogPath, h.LogTail(20))
		case <-h.exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// probe connects once and reads the SSH banner.
func (h *Host) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", h.Addr())
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	banner, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading banner: %w", err)
	}
	if !strings.HasPrefix(banner, "SSH-2.0-") {
		return fmt.Errorf("unexpected banner %q", banner)
	}
	return nil
}

// LogTail returns up to the last n lines of sshd's log, for failure messages.
func (h *Host) LogTail(n int) string {
	data, err := os.ReadFile(h.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Dial logs in as user with signer, accepting only h.HostKey. It is bounded by ctx and by
// the host's DialTimeout, handshake included.
func (h *Host) Dial(ctx context.Context, user string, signer ssh.Signer) (*ssh.Client, error) {
	timeout := h.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", h.Addr())
	if err != nil {
		return nil, fmt.Errorf("%s: dial %s: %w", h.Name, h.Addr(), err)
	}
	// The SSH handshake knows no context: the deadline stops a host that accepts TCP and then
	// goes quiet, and closing the connection on cancel covers the rest.
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	config := &ssh.ClientConfig{
		User:              user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback:   ssh.FixedHostKey(h.HostKey),
		HostKeyAlgorithms: []string{h.HostKey.Type()},
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, h.Addr(), config)
	if !stop() {
		if err == nil {
			c.Close()
		}
		return nil, fmt.Errorf("%s: ssh handshake as %s: %w", h.Name, user, ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: ssh handshake as %s: %w", h.Name, user, err)
	}
	conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// ProcessesOfIDs lists "pid uid name" of every live process on the host (read from /proc in
// its PID namespace) any of whose real, effective, saved or filesystem UIDs lies in [lo, hi],
// one a line.
func (h *Host) ProcessesOfIDs(ctx context.Context, lo, hi int64) (string, error) {
	out, err := h.Run(ctx, fmt.Sprintf(`cat /proc/[0-9]*/status 2>/dev/null | awk -v lo=%d -v hi=%d '
		$1 == "Name:" { name = $2 } $1 == "Pid:" { pid = $2 } $1 == "State:" { st = $2 }
		$1 == "Uid:" { for (i = 2; i <= 5; i++) if ($i + 0 >= lo && $i + 0 <= hi && st != "Z") { print pid, $i, name; break } }'`, lo, hi))
	return strings.TrimSpace(out), err
}

// Run runs command as root with the fleet's admin key and returns its stdout. A failing
// command's error carries its stderr.
func (h *Host) Run(ctx context.Context, command string) (string, error) {
	return h.RunAs(ctx, "root", h.admin, command)
}

// RunAs runs command as user, logging in with signer.
func (h *Host) RunAs(ctx context.Context, user string, signer ssh.Signer, command string) (string, error) {
	client, err := h.Dial(ctx, user, signer)
	if err != nil {
		return "", err
	}
	defer client.Close()
	stop := context.AfterFunc(ctx, func() { client.Close() })
	defer stop()

	session, err := client.NewSession()
	if err != nil {
		return "", fmt.Errorf("%s: new session: %w", h.Name, err)
	}
	defer session.Close()
	var stdout, stderr bytes.Buffer
	session.Stdout = &stdout
	session.Stderr = &stderr
	if err := session.Run(command); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return stdout.String(), fmt.Errorf("%s: run %q: %w; stderr: %s", h.Name, command, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Cut makes the host silently unreachable, as if it had died: its side of the veth goes
// down, so berthN loses carrier. The route to 198.18.N.0/24 stays on berthN, so packets for
// the host are dropped on this machine; they never take the default route. A dial sees no
// reply and times out, or gets EHOSTUNREACH once ARP gives up (about 3 s). The host keeps
// running and keeps its state, and established connections hang rather than reset.
func (h *Host) Cut() error {
	if err := runCommand(nil, "ip", "-n", h.Name, "link", "set", "eth0", "down"); err != nil {
		return fmt.Errorf("%s: cut: %w", h.Name, err)
	}
	dev, err := routeDevice(h.Address)
	if err == nil && dev != vethName(h.Slot) {
		err = fmt.Errorf("traffic for %s would leave through %s", h.Address, dev)
	}
	if err != nil {
		// Better a reachable host than packets for it escaping this machine.
		return errors.Join(fmt.Errorf("%s: cut: %w", h.Name, err), h.Restore())
	}
	return nil
}

// Restore undoes Cut and returns once sshd answers again.
func (h *Host) Restore() error {
	if err := runCommand(nil, "ip", "-n", h.Name, "link", "set", "eth0", "up"); err != nil {
		return fmt.Errorf("%s: restore: %w", h.Name, err)
	}
	// Forget the failed ARP lookups from while the host was cut, so the next dial asks again
	// at once.
	if err := runCommand(nil, "ip", "neigh", "flush", "dev", vethName(h.Slot)); err != nil {
		return fmt.Errorf("%s: restore: %w", h.Name, err)
	}
	if err := h.waitReady(context.Background(), readyTimeout); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}

// stop takes the host down and gives its slot back. It is safe on a half-started host, and
// must run once only (Close sees to that).
func (h *Host) stop() error {
	var errs []error
	if h.cmd != nil && h.cmd.Process != nil {
		errs = append(errs, h.killProcessTree())
	}
	// clearSlot also kills whatever is left in the namespace and waits for it to go.
	errs = append(errs, clearSlot(h.Slot, h.lock.read()), h.lock.release())
	return errors.Join(errs...)
}

// killProcessTree kills the host's PID 1, which takes every process in the host with it, and
// waits for unshare to collect it and exit. Killing unshare first would work too, but would
// leave PID 1 a zombie for this machine's init to reap, and a container's init may never.
func (h *Host) killProcessTree() error {
	select {
	case <-h.exited:
		return nil
	default:
	}
	unshare := h.cmd.Process.Pid
	children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", unshare, unshare))
	for field := range strings.FieldsSeq(string(children)) {
		if pid, err := strconv.Atoi(field); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	select {
	case <-h.exited:
		return nil
	case <-time.After(5 * time.Second):
	}
	if err := h.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: kill unshare (pid %d): %w", h.Name, unshare, err)
	}
	select {
	case <-h.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s: unshare (pid %d) did not exit", h.Name, unshare)
	}
}
