//go:build linux

package realtekton

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
)

// netnsEnv tells the test binary it runs in the network namespace IsolateNetwork made.
const netnsEnv = "BERTH_REALTEKTON_NETNS"

// RunTests runs a test package against real Tekton and returns its exit code: in a network
// namespace of its own (IsolateNetwork), it starts a control plane with ControlPlaneOptions and
// opts into *cp and Tekton on it into *tekton, runs the tests, and stops both. Use it from
// TestMain: os.Exit(realtekton.RunTests(m, &cp, &tekton)). Without root it skips the package,
// except in CI (CI=true), where it fails; a missing binary always fails, with the command that
// builds it.
func RunTests(m *testing.M, cp **controlplane.ControlPlane, tekton **Tekton, opts ...controlplane.Option) int {
	if code, done := IsolateNetwork(); done {
		return code
	}
	// controller-runtime, in envtest, prints a stack to stderr once it has logged with no logger
	// set; this package has nothing of its own to say there.
	ctrllog.SetLogger(logr.Discard())
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "FAIL: %s: %v\n", what, err)
		return 1
	}
	base, err := ControlPlaneOptions()
	if err != nil {
		return fail("no control plane for real Tekton", err)
	}
	started, err := controlplane.Start(append(base, opts...)...)
	if err != nil {
		return fail("no test control plane", err)
	}
	defer func() {
		if err := started.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the test control plane: %v\n", err)
		}
	}()
	t, err := Start(context.Background(), started)
	if err != nil {
		return fail("no real Tekton", err)
	}
	*cp, *tekton = started, t
	code := m.Run()
	// A program that died during the tests failed them, whatever they said.
	if err := t.Stop(); err != nil {
		return fail("stopping real Tekton", err)
	}
	return code
}

// IsolateNetwork runs this test binary again in a new network namespace, with only loopback, and
// returns that run's exit code with done set; in that second run it brings loopback up and
// returns done unset, and the tests go on there. Tekton binds fixed ports (443, 8080, …), which
// would clash with another test package's Tekton or anything of the machine's.
//
// It takes root. Without, it says so and returns 0 (the package is skipped), except in CI
// (CI=true), where tests run as root and a skip would hide that they did not run.
func IsolateNetwork() (code int, done bool) {
	if os.Getenv(netnsEnv) == "1" {
		if err := loopbackUp(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: bringing loopback up in the test's network namespace: %v\n", err)
			return 1, true
		}
		return 0, false
	}
	if os.Geteuid() != 0 {
		const why = "real Tekton runs in a network namespace of the test's own, which takes root"
		return missing.Main(why), true
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: finding the test binary: %v\n", err)
		return 1, true
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	// Should this process be killed, the kernel kills the second run too (its own children it
	// leaves to the next control plane's start, see controlplane.RecordProcesses). The signal
	// comes when the thread that started it ends, so that thread is kept.
	runtime.LockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	// Signals meant for the tests (go test's SIGQUIT at its timeout, a SIGTERM) go to the run
	// that has them.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	defer signal.Stop(signals)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: running the tests in a network namespace of their own: %v\n", err)
		return 1, true
	}
	go func() {
		for s := range signals {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, true
	case errors.As(err, &exit):
		if status, ok := exit.Sys().(syscall.WaitStatus); ok && status.Signaled() {
			return 128 + int(status.Signal()), true
		}
		return exit.ExitCode(), true
	default:
		fmt.Fprintf(os.Stderr, "FAIL: waiting for the tests in their network namespace: %v\n", err)
		return 1, true
	}
}

// loopbackUp sets lo up, as `ip link set lo up` does: a new network namespace has it down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
