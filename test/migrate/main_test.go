//go:build stack

// Package migrate follows the switch-over runbook (docs/migrate-from-mpc.md) on the test
// ground: a real kube-apiserver, a real sshd host, the Tekton stand-in, and the built berth
// binary run as the Deployment runs it, starting from the state the upstream multi-platform
// controller leaves behind.
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
	stack *devstack.Stack
	// berthBin is the built berth, in a directory of its own that the runbook's commands find
	// it in (PATH).
	berthBin string
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
	stack, err = devstack.Up(context.Background(), devstack.Options{StateDir: filepath.Join(dir, "stack"), Hosts: 1})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: bringing up the stack:", err)
		return 1
	}
	defer func() {
		if err := stack.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "tearing the stack down:", err)
		}
	}()
	return m.Run()
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
