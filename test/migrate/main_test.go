//go:build stack

// Package migrate follows the switch-over runbook (docs/migrate-from-mpc.md) on the test
// ground: a real kube-apiserver, a real sshd host, the Tekton stand-in, and the built berth
// binary run as the Deployment runs it, starting from the state the upstream multi-platform
// controller leaves behind. Each path of the runbook (the default layout, the Konflux layout)
// runs on a stack of its own: berth adopts at its first start on a cluster, once.
package migrate

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

var (
	// stack is the running test's (upStack).
	stack *devstack.Stack
	// berthBin is the built berth, in a directory of its own that the runbook's commands find
	// it in (PATH).
	berthBin string
	// stateRoot holds the stacks' state, under a short path: their sockets live there.
	stateRoot string
	stacks    int
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if err := prerequisites(); err != nil {
		return missing.Main(err)
	}
	dir, err := os.MkdirTemp("", "berth-migrate-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins := filepath.Join(dir, "bin")
	if err := os.Mkdir(bins, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	berthBin = filepath.Join(bins, "berth")
	if err := repo.Build("./cmd/berth", berthBin); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	ctrl.SetLogger(logr.Discard()) // the stand-in's; berth's own log is the process's
	stateRoot = dir
	return m.Run()
}

// upStack brings up the test's own stack, with one SSH host, and tears it down when the test
// ends.
func upStack(t *testing.T) {
	t.Helper()
	stacks++
	s, err := devstack.Up(context.Background(), devstack.Options{StateDir: filepath.Join(stateRoot, fmt.Sprint("stack", stacks)), Hosts: 1})
	if err != nil {
		t.Fatalf("bringing up the stack: %v", err)
	}
	stack = s
	t.Cleanup(func() {
		if err := s.Down(); err != nil {
			t.Errorf("tearing the stack down: %v", err)
		}
	})
}

// prerequisites are root and sshd for the hosts, and jq, which the runbook's commands use.
func prerequisites() error {
	if err := sshhosts.Prerequisites(); err != nil {
		return fmt.Errorf("the SSH hosts need %w", err)
	}
	if _, err := exec.LookPath("jq"); err != nil {
		return fmt.Errorf("the runbook's commands need jq: %w", err)
	}
	return nil
}
