package bench

import (
	"fmt"
	"time"
)

// Scenario is a workload.
type Scenario struct {
	Name string
	// Scale is what the counts were multiplied by (ScenarioNamed).
	Scale       float64
	Hosts       int // static hosts of linux/s390x
	Concurrency int // tasks at once per host (per VM on a VM platform)
	Tasks       int // user TaskRuns, created in one burst
	Unrelated   int // TaskRuns of no concern to the controller, present before it starts
	MinRun      time.Duration
	MaxRun      time.Duration
	// MaxInstances > 0 makes linux/s390x a dynamic platform with that max-instances, served
	// from a local VM cloud in the bench process: a VM per task, or with Pooled a
	// dynamic-pool platform whose VMs take Concurrency tasks each.
	MaxInstances int
	Pooled       bool
	// Chaos is how many times the controller is killed (SIGKILL) during the run, at random
	// moments, and started again at once.
	Chaos int
}

// ScenarioNames are the scenarios ScenarioNamed knows.
var ScenarioNames = []string{"static", "idle-cluster", "large", "dynamic", "dynamic-pool"}

// vms tells whether the scenario's platform is served by VMs.
func (sc Scenario) vms() bool { return sc.MaxInstances > 0 }

// slots is how many tasks the platform runs at once.
func (sc Scenario) slots() int {
	if sc.vms() {
		return sc.MaxInstances * sc.Concurrency
	}
	return sc.Hosts * sc.Concurrency
}

// ScenarioNamed returns a scenario, its counts multiplied by scale.
func ScenarioNamed(name string, scale float64) (Scenario, error) {
	var s Scenario
	switch name {
	case "static":
		s = Scenario{Hosts: 50, Concurrency: 4, Tasks: 2000, MinRun: time.Second, MaxRun: 3 * time.Second}
	case "idle-cluster":
		s = Scenario{Hosts: 10, Concurrency: 2, Tasks: 100, Unrelated: 20000, MinRun: time.Second, MaxRun: 3 * time.Second}
	case "large":
		// Growth: a cluster five times idle-cluster's, and a fleet ten times static's at the
		// upstream controller's highest concurrency.
		s = Scenario{Hosts: 500, Concurrency: 8, Tasks: 10000, Unrelated: 100000, MinRun: time.Second, MaxRun: 3 * time.Second}
	case "dynamic":
		// Every task waits for a VM of its own to boot (a real sshd host, about 1.5 s).
		s = Scenario{MaxInstances: 20, Concurrency: 1, Tasks: 200, MinRun: time.Second, MaxRun: 3 * time.Second}
	case "dynamic-pool":
		s = Scenario{MaxInstances: 12, Pooled: true, Concurrency: 4, Tasks: 2000, MinRun: time.Second, MaxRun: 3 * time.Second}
	default:
		return s, fmt.Errorf("unknown scenario %q: static, idle-cluster, large, dynamic or dynamic-pool", name)
	}
	if scale <= 0 {
		return s, fmt.Errorf("scale %g: want more than 0", scale)
	}
	s.Name, s.Scale = name, scale
	scaled := func(n int) int { return max(1, int(float64(n)*scale+0.5)) }
	s.Hosts, s.Tasks = scaled(s.Hosts), scaled(s.Tasks)
	if s.vms() {
		s.Hosts = 0
		// Two VMs at least, so that tasks are spread and hand-overs happen.
		s.MaxInstances = max(2, scaled(s.MaxInstances))
	}
	if s.Unrelated > 0 {
		s.Unrelated = scaled(s.Unrelated)
	}
	return s, nil
}

// describe is the scenario in one line, as a run starts.
func (sc Scenario) describe() string {
	what := fmt.Sprintf("%d tasks on %d hosts x %d", sc.Tasks, sc.Hosts, sc.Concurrency)
	if sc.vms() {
		kind := "dynamic"
		if sc.Pooled {
			kind = "dynamic-pool"
		}
		what = fmt.Sprintf("%d tasks on a %s platform of at most %d VMs x %d", sc.Tasks, kind, sc.MaxInstances, sc.Concurrency)
	}
	if sc.Unrelated > 0 {
		what += fmt.Sprintf(", %d unrelated TaskRuns present", sc.Unrelated)
	}
	return fmt.Sprintf("%s at scale %g: %s", sc.Name, sc.Scale, what)
}

// Generous limits, so that a slow controller is measured rather than cut short: the upstream
// controller reconciles every TaskRun of the cluster at start with a GET at its client's
// default 20 requests/s, and serves about one task a second.
const (
	// warmUpBase plus warmUpPerUnrelated for each unrelated TaskRun bound the wait for the
	// first (warm-up) task to finish.
	warmUpBase         = 5 * time.Minute
	warmUpPerUnrelated = 50 * time.Millisecond
	// runBase plus runPerTask for each task bound the measured part; a run that makes no
	// progress (no secret, no completion) for stallLimit ends sooner.
	runBase    = 5 * time.Minute
	runPerTask = 2 * time.Second
	stallLimit = 5 * time.Minute
	// quietLimit bounds the wait, after the last task, for the controller's cleanups: until
	// quietFor passes without a write of the controller.
	quietLimit = 30 * time.Second
	quietFor   = 2 * time.Second
)

func (sc Scenario) warmUpLimit() time.Duration {
	return warmUpBase + time.Duration(sc.Unrelated)*warmUpPerUnrelated
}

func (sc Scenario) runLimit() time.Duration {
	return runBase + time.Duration(sc.Tasks)*runPerTask + time.Duration(sc.Chaos)*30*time.Second
}
