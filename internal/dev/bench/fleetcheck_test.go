package bench

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// inst is an instance of record rec launched at launched (seconds) and ended at ended (0: up).
func inst(id, token, rec string, launched, ended int) vmcloud.Instance {
	i := vmcloud.Instance{ID: id, Token: token, Tags: map[string]string{tagRecord: rec}, LaunchedAt: at(launched),
		State: vmcloud.Running, RunningAt: at(launched + 1)}
	if ended > 0 {
		i.State, i.TerminatedAt = vmcloud.Gone, at(ended)
	}
	return i
}

func TestLeakedInstances(t *testing.T) {
	maxAge := 10 * time.Minute
	now := at(3600)
	vanished := inst("i-vanished", "t9", "r9", 0, 5)
	vanished.Vanished = true
	instances := []vmcloud.Instance{
		inst("i-pool", "t1", "r1", 0, 0),          // a pool VM with its record: kept for the next tasks
		inst("i-gone", "t2", "r2", 0, 100),        // ended: never a leak
		inst("i-orphan", "t3", "r3", 0, 0),        // its record is gone
		inst("i-spent", "t4", "r4", 0, 0),         // served its task, retired, still up
		inst("i-old", "t5", "r5", 0, 0),           // ready for longer than max-age
		inst("i-launching", "t6", "r6", 0, 0),     // the record has not saved its id yet
		inst("i-stranger", "t7", "r7", 0, 0),      // its record holds another instance
		inst("i-untagged", "t8", "", 0, 0),        // no record tag at all
		vanished,                                  // lost by the cloud: nothing to end
		inst("i-terminating", "t10", "r10", 0, 0), // being terminated, not yet gone
	}
	records := []vmRecord{
		{Name: "r1", InstanceID: "i-pool", ReadyAt: at(3000)},
		{Name: "r4", InstanceID: "i-spent", Retired: true, ReadyAt: at(3000)},
		{Name: "r5", InstanceID: "i-old", ReadyAt: at(100)},
		{Name: "r6"},
		{Name: "r7", InstanceID: "i-other"},
		{Name: "r10", InstanceID: "i-terminating", Retired: true},
	}
	got := leakedInstances(instances, records, maxAge, now)
	var ids []string
	for _, l := range got {
		ids = append(ids, strings.Fields(l)[0])
	}
	want := []string{"i-orphan", "i-spent", "i-old", "i-stranger", "i-untagged", "i-terminating"}
	if !slices.Equal(ids, want) {
		t.Errorf("leaks %v, want %v (%q)", ids, want, got)
	}
	// Without max-age (a dynamic platform without min-idle), age alone is no leak.
	if got := leakedInstances(instances[4:5], records, 0, now); len(got) != 0 {
		t.Errorf("without max-age: leaks %q, want none", got)
	}
}

func TestDoubleLaunches(t *testing.T) {
	for _, tc := range []struct {
		name      string
		instances []vmcloud.Instance
		want      int
	}{
		{"one instance per record", []vmcloud.Instance{inst("a", "r1-1", "r1", 0, 10), inst("b", "r2-1", "r2", 0, 0)}, 0},
		{"a token launched twice", []vmcloud.Instance{inst("a", "r1-1", "r1", 0, 0), inst("b", "r1-1", "r1", 1, 0)}, 1},
		{"a relaunch after the first instance was lost", []vmcloud.Instance{inst("a", "r1-1", "r1", 0, 5), inst("b", "r1-2", "r1", 6, 0)}, 0},
		{"a second instance while the first is up", []vmcloud.Instance{inst("a", "r1-1", "r1", 0, 0), inst("b", "r1-2", "r1", 6, 0)}, 1},
		{"launched at the instant the first ended", []vmcloud.Instance{inst("a", "r1-1", "r1", 0, 6), inst("b", "r1-2", "r1", 6, 0)}, 0},
		{"three at once", []vmcloud.Instance{inst("a", "r1-1", "r1", 0, 0), inst("b", "r1-2", "r1", 1, 0), inst("c", "r1-3", "r1", 2, 0)}, 2},
		{"untagged instances", []vmcloud.Instance{inst("a", "x-1", "", 0, 0), inst("b", "y-1", "", 0, 0)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := doubleLaunches(tc.instances); got != tc.want {
				t.Errorf("doubleLaunches = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestInstancePeak(t *testing.T) {
	instances := []vmcloud.Instance{
		inst("a", "1", "r1", 0, 10),
		inst("b", "2", "r2", 1, 5),
		inst("c", "3", "r3", 5, 0), // launched as b ends: the end counts first
		inst("d", "4", "r4", 6, 8),
		inst("e", "5", "r5", 7, 0),
	}
	// Up: 0s a; 1s a b; 5s a c; 6s a c d; 7s a c d e (4); 8s a c e; 10s c e.
	peak, over := instancePeak(instances, 3)
	if peak != 4 || over != 1 {
		t.Errorf("peak %d, launches above 3: %d; want 4 and 1", peak, over)
	}
	if peak, over := instancePeak(instances, 4); peak != 4 || over != 0 {
		t.Errorf("limit 4: peak %d, over %d; want 4 and 0", peak, over)
	}
	if peak, over := instancePeak(nil, 1); peak != 0 || over != 0 {
		t.Errorf("no instances: peak %d, over %d", peak, over)
	}
}

func TestReadyToSecret(t *testing.T) {
	booting := inst("c", "3", "r3", 0, 0)
	booting.RunningAt = time.Time{}
	instances := []vmcloud.Instance{inst("a", "1", "r1", 0, 0), inst("b", "2", "r2", 0, 0), booting, inst("d", "4", "r4", 0, 0)}
	tasksOn := map[string][]string{
		"r1": {"t1", "t2"}, // a pool VM: its first secret counts
		"r2": {"t3"},
		"r3": {"t4"},
		"r4": {"t5"}, // assigned, never got its secret
	}
	secretAt := map[string]time.Time{"t1": at(5), "t2": at(3), "t3": at(11), "t4": at(2)}
	got := readyToSecret(instances, tasksOn, secretAt)
	want := []time.Duration{2 * time.Second, 10 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("ready→secret %v, want %v", got, want)
	}
}

func TestChaosPointsSpreadOverTheRun(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	points := chaosPoints(10, 500, rnd)
	if len(points) != 10 || !slices.IsSorted(points) {
		t.Fatalf("points %v: want 10, sorted", points)
	}
	if points[0] < 1 || points[9] > 499 || len(slices.Compact(slices.Clone(points))) != 10 {
		t.Errorf("points %v: want 10 distinct in [1, 499]", points)
	}
	if got := chaosPoints(5, 3, rnd); len(got) != 5 || slices.Min(got) < 1 || slices.Max(got) > 2 {
		t.Errorf("more kills than tasks: %v", got)
	}
	if got := chaosPoints(0, 100, rnd); got != nil {
		t.Errorf("no chaos: %v", got)
	}
}
