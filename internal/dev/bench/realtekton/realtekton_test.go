//go:build linux

// Package realtekton_test runs the bench on real Tekton (bench --tekton real) at a small scale,
// as make test's quick bench runs the simulation: in a network namespace of its own, where
// Tekton's fixed ports are free. It fails only on correctness.
package realtekton_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/berth-ci/berth/internal/dev/bench"
	"github.com/berth-ci/berth/internal/dev/testground/realtekton"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
)

func TestMain(m *testing.M) {
	if code, done := realtekton.IsolateNetwork(); done {
		os.Exit(code)
	}
	// controller-runtime, used by the harness, prints a stack once it has logged with no
	// logger set; the run's logs are the programs' own, in its log directory.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// The static scenario with Tekton's controller and kwok's pods in the loop: berth serves every
// task, never over-commits, and Tekton's own writes are counted apart from berth's. On
// idle-cluster the unrelated TaskRuns are finished history, which Tekton leaves alone: not one
// write of Tekton's goes to them, or its pace would be spent there and not on the tasks.
func TestQuickBenchOnRealTekton(t *testing.T) {
	berthDev := filepath.Join(t.TempDir(), "berth-dev")
	if err := repo.Build("./cmd/berth-dev", berthDev); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		scenario string
		// scale: static's 40 tasks on 1 host of 4 slots; idle-cluster's 5 tasks on 1 host of 2,
		// beside 1,000 unrelated TaskRuns.
		scale float64
	}{{"static", 0.02}, {"idle-cluster", 0.05}} {
		t.Run(tc.scenario, func(t *testing.T) {
			sc, err := bench.ScenarioNamed(tc.scenario, tc.scale)
			if err != nil {
				t.Fatal(err)
			}
			dir, err := os.MkdirTemp("", "berth-quick-bench-tekton-")
			if err != nil {
				t.Fatal(err)
			}
			res, err := bench.Run(context.Background(), sc, bench.Options{Controller: bench.BerthController(berthDev, "ssh"),
				LogDir: filepath.Join(dir, "logs"), Log: testWriter{t}, RealTekton: true})
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case res.Incomplete != "":
				t.Fatalf("incomplete: %s (logs in %s)", res.Incomplete, dir)
			case res.Served != res.Tasks || res.ErrorSecrets > 0:
				t.Fatalf("served %d of %d tasks, %d error secrets (logs in %s)", res.Served, res.Tasks, res.ErrorSecrets, dir)
			case res.Violations > 0:
				t.Fatalf("%d over-commit violations (logs in %s)", res.Violations, dir)
			case res.Tekton == "" || res.TektonWrites == 0:
				t.Fatalf("Tekton %q made %d writes: the run was not on real Tekton", res.Tekton, res.TektonWrites)
			case res.TektonHistoryWrites > 0:
				t.Fatalf("Tekton wrote %d times to the %d finished unrelated TaskRuns (logs in %s)", res.TektonHistoryWrites, res.Unrelated, dir)
			}
			os.RemoveAll(dir)
			line := fmt.Sprintf("quick bench on %s Tekton, %s at scale %g: %d tasks, creation→secret p50 %.0f ms p99 %.0f ms, slot freed→next p50 %.0f ms, %.1f berth writes per allocation, %d of Tekton's own",
				res.Tekton, tc.scenario, tc.scale, res.Tasks, res.SecretLatency.P50, res.SecretLatency.P99, res.HandOver.P50, res.WritesPerAllocation, res.TektonWrites)
			t.Log(line)
			if path := os.Getenv("QUICK_BENCH_REPORT"); path != "" {
				f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				fmt.Fprintln(f, line)
			}
		})
	}
}

// testWriter sends the bench's progress lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
