package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// quickScale is the quick bench's scale: small enough for every `make test`.
const quickScale = 0.05

// TestQuickBench runs each scenario but large at quickScale against berth-dev's controller,
// and static also against the floor (bench --floor), and fails only on correctness: every
// task served, no error secret, no over-commit, no Warning on a user task, and on VM
// platforms no leaked VM, no double launch, no launch above max-instances, no single-use VM
// reused. Timings on a shared CI machine say little; they are
// printed (t.Log, and into $QUICK_BENCH_REPORT when set, which make test prints) so that a
// broken harness shows. The static run also profiles the controller, checking
// --pprof-bind-address and the profiles end to end.
//
// The controller is a berth-dev built for the test (or make test's, see repo.Build).
func TestQuickBench(t *testing.T) {
	berthDev := buildBerthDev(t)
	// The scenarios run at once: they wait on simulated task runs and VM boots far more than
	// they compute, and each has a control plane, hosts and a cloud of its own. (Parallel
	// subtests would run only GOMAXPROCS at a time.)
	type quickRun struct {
		name, dir, skip string
		o               Options
		res             *Result
		err             error
		took            time.Duration
	}
	var runs []*quickRun
	var wg sync.WaitGroup
	// The floors (bench --floor, --safe-floor) run static too: the harness's calibrations
	// must serve as well.
	for _, name := range []string{"static", "idle-cluster", "dynamic", "dynamic-pool", "static-floor", "static-safe-floor"} {
		scenario, safe := strings.CutSuffix(name, "-safe-floor")
		scenario, floor := strings.CutSuffix(scenario, "-floor")
		sc, err := ScenarioNamed(scenario, quickScale)
		if err != nil {
			t.Fatal(err)
		}
		q := &quickRun{name: name}
		runs = append(runs, q)
		if sc.vms() {
			if err := sshhosts.Prerequisites(); err != nil {
				q.skip = fmt.Sprintf("the %s scenario runs real SSH hosts: %v", name, err)
				continue
			}
		}
		// Kept when the test fails: the controller's log says why.
		if q.dir, err = os.MkdirTemp("", "berth-quick-bench-"); err != nil {
			t.Fatal(err)
		}
		q.o = Options{Controller: BerthController(berthDev, "ssh"),
			LogDir: filepath.Join(q.dir, "logs"), Log: testWriter{t}}
		switch {
		case floor:
			q.o.Controller = berthDev + " bench-floor"
		case safe:
			q.o.Controller = berthDev + " bench-floor --safe"
		}
		if name == "static" {
			addr, err := FreeLoopbackAddress()
			if err != nil {
				t.Fatal(err)
			}
			q.o.Controller += " --pprof-bind-address=" + addr
			q.o.Pprof = &Pprof{Address: addr, Dir: filepath.Join(q.dir, "pprof")}
		}
		wg.Go(func() {
			began := time.Now()
			q.res, q.err = Run(context.Background(), sc, q.o)
			q.took = time.Since(began)
		})
	}
	wg.Wait()

	var report bytes.Buffer
	for _, q := range runs {
		t.Run(q.name, func(t *testing.T) {
			if q.skip != "" {
				missing.Skip(t, q.skip)
			}
			if q.err != nil {
				t.Fatalf("%v (logs in %s)", q.err, q.dir)
			}
			var table bytes.Buffer
			PrintTable(&table, []*Result{q.res})
			fmt.Fprintf(&report, "quick bench: %s at scale %g in %s\n%s\n", q.name, quickScale, q.took.Round(time.Second), &table)
			t.Logf("\n%s", &table)
			problems := quickProblems(q.res)
			if strings.HasSuffix(q.name, "-safe-floor") {
				// Its point is the work berth cannot leave out: a record created and deleted
				// around the label, the secret and the label's removal, and the build users.
				if q.res.WritesPerTaskNoWait != 5 || q.res.Provisioner != "ssh" {
					problems = append(problems, fmt.Sprintf("the safe floor wrote %g times per task and reached the hosts by %q; want 5 writes and ssh",
						q.res.WritesPerTaskNoWait, q.res.Provisioner))
				}
			}
			if len(problems) > 0 {
				t.Fatalf("%s (logs in %s)", strings.Join(problems, "; "), q.dir)
			}
			if q.o.Pprof != nil {
				for _, p := range []string{"cpu.pprof", "heap.pprof", apiServerCPUProfile} {
					checkProfile(t, filepath.Join(q.o.Pprof.Dir, p))
				}
			}
			os.RemoveAll(q.dir)
		})
	}
	if path := os.Getenv("QUICK_BENCH_REPORT"); path != "" {
		if err := os.WriteFile(path, report.Bytes(), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// quickProblems lists what is wrong with a run, whatever its timings.
func quickProblems(r *Result) []string {
	var out []string
	check := func(bad bool, format string, args ...any) {
		if bad {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	check(r.Incomplete != "", "incomplete: %s", r.Incomplete)
	check(r.Served != r.Tasks, "served %d of %d tasks", r.Served, r.Tasks)
	check(r.ErrorSecrets > 0, "%d tasks got an error secret", r.ErrorSecrets)
	check(r.Violations > 0, "%d over-commit violations", r.Violations)
	check(r.userWarnings() > 0, "Warning events on user tasks: %v", r.UserWarnings)
	check(r.CreationSeconds >= r.MakespanSeconds || (r.Tasks >= 50 && r.CreationSeconds == 0),
		"the tasks were created over %.3f s, which should be within the makespan of %.3f s", r.CreationSeconds, r.MakespanSeconds)
	if v := r.VMResult; v != nil {
		check(v.LeakedInstances > 0, "leaked VMs: %v", v.Leaks)
		check(v.DoubleLaunches > 0, "%d double launches", v.DoubleLaunches)
		check(v.MaxInstancesExceeded > 0, "%d launches above max-instances", v.MaxInstancesExceeded)
		check(v.SingleUseReused > 0, "%d single-use VMs reused", v.SingleUseReused)
	}
	return out
}

func buildBerthDev(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "berth-dev")
	if err := repo.Build("./cmd/berth-dev", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

func checkProfile(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.ParseData(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(p.Sample) == 0 {
		t.Errorf("%s has no samples", path)
	}
}

// testWriter sends the bench's progress lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
