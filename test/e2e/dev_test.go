// Package e2e drives berth's binaries the way a person does.
package e2e

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// `make run` is `berth-dev dev`: it must come up, be reachable as printed, and leave nothing behind
// on Ctrl-C.
func TestDevStackComesUpAndLeavesNothingBehind(t *testing.T) {
	root, bin := buildBerthDev(t)

	stateDir := filepath.Join(t.TempDir(), "state")
	dev := exec.Command(bin, "dev", "--hosts", "1", "--metrics-bind-address", "0", "--state-dir", stateDir)
	dev.Dir = root
	stdout, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	dev.Stderr = &stderr
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() { _ = dev.Process.Kill() })

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- dev.Wait()
	}()
	var printed strings.Builder
	deadline := time.After(comeUpLimit)
	for !strings.Contains(printed.String(), "Press Ctrl-C") {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("berth dev exited before coming up:\n%s\nstderr:\n%s", printed.String(), stderr.String())
			}
			printed.WriteString(l + "\n")
		case <-deadline:
			t.Fatalf("berth dev did not come up in time:\n%s", printed.String())
		}
	}
	go func() {
		for range lines {
		}
	}()
	out := printed.String()

	kubeconfig := submatch(t, out, `export KUBECONFIG=(\S+)`)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = apiextensionsv1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := c.List(context.Background(), &crds); err != nil {
		t.Fatalf("listing CRDs with the printed KUBECONFIG: %v", err)
	}
	names := map[string]bool{}
	for _, crd := range crds.Items {
		names[crd.Name] = true
	}
	for _, want := range []string{"taskruns.tekton.dev", "tasks.tekton.dev", "pipelineruns.tekton.dev"} {
		if !names[want] {
			t.Errorf("CRD %s not served; have %v", want, names)
		}
	}

	// The printed ssh line works as printed: key file, known_hosts, root@address.
	m := regexp.MustCompile(`(berth-host-\d+)\s+ssh -i (\S+) -o UserKnownHostsFile=(\S+) root@(\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no ssh line in:\n%s", out)
	}
	hostName, keyPath, knownHostsPath, address := m[1], m[2], m[3], m[4]
	if got := sshRun(t, keyPath, knownHostsPath, address, "id -u"); got != "0" {
		t.Fatalf("id -u on %s printed %q, want 0", hostName, got)
	}

	children := descendants(dev.Process.Pid)
	if len(children) < 4 {
		t.Fatalf("expected etcd, kube-apiserver, kube-controller-manager and an sshd under berth dev, found pids %v", children)
	}
	if !runsBinary(children, "kube-controller-manager") {
		t.Fatalf("no kube-controller-manager under berth dev: owner references would never be followed there, nor deleted namespaces go")
	}
	// The host's slot (and so its name) may go to a stack of another test package the moment
	// berth dev frees it: what must not outlive berth dev is this namespace and these mounts,
	// told apart by the namespace's inode, held until the checks are done (HoldNamespace), and
	// the exact mountinfo lines.
	held, netnsIno, err := sshhosts.HoldNamespace(hostName)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ourMounts := linesWith(readFile(t, "/proc/self/mountinfo"), hostName)
	if len(ourMounts) == 0 {
		t.Fatalf("the host's network namespace is not mounted under /run/netns")
	}

	if err := dev.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("berth dev exited with %v after Ctrl-C; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("berth dev did not stop within a minute of Ctrl-C")
	}

	for _, pid := range children {
		if alive(pid) {
			t.Errorf("process %d (%s) outlived berth dev", pid, readFile(t, "/proc/"+strconv.Itoa(pid)+"/comm"))
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/run/netns", hostName), &st); err == nil && st.Ino == netnsIno {
		t.Errorf("network namespace %s outlived berth dev", hostName)
	}
	for _, line := range linesWith(readFile(t, "/proc/self/mountinfo"), hostName) {
		if slices.Contains(ourMounts, line) {
			t.Errorf("a mount of %s outlived berth dev: %s", hostName, line)
		}
	}
	if _, err := os.Stat(kubeconfig); !os.IsNotExist(err) {
		t.Errorf("the kubeconfig outlived berth dev (stat: %v)", err)
	}
}

// inode is the inode number of path (a network namespace's, for a bind mount under /run/netns).
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// linesWith returns the lines of text that contain s.
func linesWith(text, s string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

func submatch(t *testing.T, s, pattern string) string {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("%q not found in:\n%s", pattern, s)
	}
	return m[1]
}

func sshRun(t *testing.T, keyPath, knownHostsPath, address, command string) string {
	t.Helper()
	signer, err := ssh.ParsePrivateKey([]byte(readFile(t, keyPath)))
	if err != nil {
		t.Fatal(err)
	}
	hostKeys, err := knownhosts.New(knownHostsPath)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ssh.Dial("tcp", address+":22", &ssh.ClientConfig{
		User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKeys, Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatalf("ssh root@%s as printed: %v", address, err)
	}
	defer conn.Close()
	sess, err := conn.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out, err := sess.Output(command)
	if err != nil {
		t.Fatalf("%s on %s: %v", command, address, err)
	}
	return strings.TrimSpace(string(out))
}

// runsBinary tells whether one of the processes runs an executable of that name.
func runsBinary(pids []int, name string) bool {
	for _, pid := range pids {
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && filepath.Base(exe) == name {
			return true
		}
	}
	return false
}

// descendants lists every process below pid.
func descendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie has exited; only its parent's wait is missing.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(data)
}

// `make run ARGS=--once`: the samples run through berth and the command exits 0 with a summary.
func TestDevOnceRunsTheSamples(t *testing.T) {
	root, bin := buildBerthDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dev := exec.CommandContext(ctx, bin, "dev", "--once", "--hosts", "2", "--metrics-bind-address", "0", "--state-dir", filepath.Join(t.TempDir(), "state"))
	dev.Dir = root
	var stderr strings.Builder
	dev.Stderr = &stderr
	out, err := dev.Output()
	if err != nil {
		t.Fatalf("berth dev --once: %v\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	for _, want := range []string{
		"berth dev: 4 sample TaskRuns finished", "remote-build-s390x on berth-host-", "local-build-amd64 locally",
		"remote-build-arm64 on vm-linux-arm64-", "remote-build-ppc64le on vm-linux-ppc64le-",
		"[builds/remote-build-s390x build] uid=", "(u-", "[builds/local-build-amd64 build] building linux/amd64 here",
		"berth dev: ephemeral cluster ", // its steps of berth's image ran the berth beside berth-dev
		"stopped; nothing left running.",
		"berth dev: logs in ", "berth.log",
		"  berth controller", "leader (lease berth-system/berth-controller), caches synced, ready at http://",
		"controller as ServiceAccount berth-system/berth-controller",
		"taskrun  builds/remote-build-s390x", // one line per change of a sample's state
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{
		`taskrun  builds/remote-build-s390x +linux/s390x +(provisioning|running) +berth-host-\d +waited \d+\.\ds`,
		`taskrun  builds/remote-build-arm64 +linux/arm64 +done +vm-linux-arm64-`,
		`taskrun  builds/local-build-amd64 +linux/amd64 +done +local +waited -`,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("output has no line like %q:\n%s", want, out)
		}
	}
	assertReadable(t, string(out))
	assertReadable(t, stderr.String())
}

// buildBerthDev builds berth and berth-dev into one directory, as `make build` does for
// `make run` (berth-dev's steps of berth's image run the berth beside it), and returns the
// repository root and berth-dev. The dev stack's SSH hosts need root: without it the test
// skips, except in CI.
func buildBerthDev(t *testing.T) (root, bin string) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing.Skip(t, "the dev stack's SSH hosts need root")
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"berth", "berth-dev"} {
		if err := repo.Build("./cmd/"+name, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root, filepath.Join(dir, "berth-dev")
}

// With the metrics address held by another program, `make run ARGS=--once` cannot run berth's
// controller: it must say so and stop, not carry on without a controller. It exits non-zero
// well within a minute, its last lines naming the address, and never claims the controller runs.
func TestDevStopsWhenTheMetricsAddressIsTaken(t *testing.T) {
	root, bin := buildBerthDev(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	addr := held.Addr().String()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stateDir := filepath.Join(t.TempDir(), "state")
	dev := exec.CommandContext(ctx, bin, "dev", "--once", "--metrics-bind-address", addr, "--state-dir", stateDir)
	dev.Dir = root
	out, err := dev.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("berth dev --once was still running a minute later:\n%s", out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("berth dev --once with %s taken: %v, want a non-zero exit\n%s", addr, err, out)
	}
	last := lastLines(string(out), 3)
	if !strings.Contains(last, addr) || !strings.Contains(last, "address already in use") {
		t.Errorf("the last lines do not say %s is in use:\n%s", addr, last)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "  berth controller") || strings.Contains(line, "Press Ctrl-C") {
			t.Errorf("claims a running controller: %q", line)
		}
	}
	assertReadable(t, string(out))
	if _, err := os.Stat(filepath.Join(stateDir, "kubeconfig")); !os.IsNotExist(err) {
		t.Errorf("the stack was not torn down: its kubeconfig is still there (stat: %v)", err)
	}
}

// A component that dies under a running stack stops it: berth dev names the component, shows
// the end of its log where it keeps one, and exits non-zero.
func TestDevStopsWhenAComponentDies(t *testing.T) {
	root, bin := buildBerthDev(t)
	for _, tc := range []struct {
		program string // the victim's executable
		says    []string
	}{
		{"etcd", []string{"berth dev: etcd: exited", "last lines of ", "etcd.log"}},
		{"sshd", []string{"berth dev: sshd of berth-host-", "sshd exited", "last lines of ", "sshd.log"}},
	} {
		t.Run(tc.program, func(t *testing.T) {
			dev := exec.Command(bin, "dev", "--hosts", "1", "--clusters=false", "--metrics-bind-address", "0",
				"--state-dir", filepath.Join(t.TempDir(), "state"))
			dev.Dir = root
			var out syncBuffer
			dev.Stdout, dev.Stderr = &out, &out
			if err := dev.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = dev.Process.Kill() })
			exited := make(chan error, 1)
			go func() { exited <- dev.Wait() }()

			deadline := time.After(comeUpLimit)
			for !strings.Contains(out.String(), "Press Ctrl-C") {
				select {
				case err := <-exited:
					t.Fatalf("berth dev exited (%v) before coming up:\n%s", err, out.String())
				case <-deadline:
					t.Fatalf("berth dev did not come up in time:\n%s", out.String())
				case <-time.After(100 * time.Millisecond):
				}
			}
			// The VM cloud's hosts run sshd too, and a VM's sshd dying is a VM's end, not the
			// stack's; pids wrap around (pid_max may be 32768), so the first sshd found may be
			// a VM's. The static host's is the one in its network namespace.
			inNamespace := func(int) bool { return true }
			if tc.program == "sshd" {
				m := regexp.MustCompile(`(berth-host-\d+)\s+ssh -i `).FindStringSubmatch(out.String())
				if m == nil {
					t.Fatalf("no static host in:\n%s", out.String())
				}
				hostNs := inode(t, filepath.Join("/run/netns", m[1]))
				inNamespace = func(pid int) bool {
					var st syscall.Stat_t
					return syscall.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &st) == nil && st.Ino == hostNs
				}
			}
			victim := 0
			for _, pid := range descendants(dev.Process.Pid) {
				if runsBinary([]int{pid}, tc.program) && inNamespace(pid) {
					victim = pid
					break
				}
			}
			if victim == 0 {
				t.Fatalf("no %s under berth dev", tc.program)
			}
			if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}

			select {
			case err := <-exited:
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() == 0 {
					t.Errorf("berth dev exited with %v after %s died, want a non-zero exit", err, tc.program)
				}
			case <-time.After(time.Minute):
				t.Fatalf("berth dev still runs a minute after %s died:\n%s", tc.program, out.String())
			}
			text := out.String()
			at := 0
			for _, want := range tc.says {
				i := strings.Index(text[at:], want)
				if i < 0 {
					t.Fatalf("output lacks %q (after what came before it):\n%s", want, text)
				}
				at += i + len(want)
			}
			assertReadable(t, text)
		})
	}
}

// assertReadable fails if the terminal output has a JSON log line: logs go to berth.log.
func assertReadable(t *testing.T, out string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "{") {
			t.Errorf("a JSON line on the terminal: %s", line)
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// syncBuffer is a strings.Builder that a process's output and a test may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// comeUpLimit bounds the wait for the dev stack's "Press Ctrl-C": about 30 s on an idle machine,
// but more than 2 minutes once under CI's load, beside the quick bench; it bounds a hang only.
const comeUpLimit = 5 * time.Minute
