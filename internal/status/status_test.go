package status

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) time.Time { return now.Add(-d) }

const s390x = "linux/s390x"

func waiting(ns, name string, queued time.Duration) Task {
	return Task{Namespace: ns, Name: name, Platform: s390x, Strategy: StrategyStatic, Waiting: true, Queued: ago(queued)}
}

func running(ns, name, host string, reserved, ready time.Duration) Task {
	return Task{Namespace: ns, Name: name, Platform: s390x, Strategy: StrategyStatic, Host: host,
		Queued: ago(reserved), ReservedAt: ago(reserved), ReadyAt: ago(ready)}
}

func staticHosts(slots ...int) []Host {
	var out []Host
	for i, n := range slots {
		out = append(out, Host{Name: fmt.Sprintf("s390x-%d", i+1), Platform: s390x, Slots: n, Configured: true, Since: ago(time.Hour)})
	}
	return out
}

// queueOf is "ns/name@position" for each waiter of the platform, in order.
func queueOf(r Report, platform string) string {
	var out []string
	for _, p := range r.Platforms {
		if p.Platform != platform {
			continue
		}
		for _, w := range p.Waiting {
			out = append(out, fmt.Sprintf("%s/%s@%d", w.Namespace, w.Name, w.Position))
		}
	}
	return strings.Join(out, " ")
}

func TestPositionsFollowTheLedger(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tasks []Task
		want  string
	}{
		{"one namespace: first queued, first served",
			[]Task{waiting("a", "late", time.Minute), waiting("a", "early", 3*time.Minute), waiting("a", "mid", 2*time.Minute)},
			"a/early@1 a/mid@2 a/late@3"},
		{"same second: by name",
			[]Task{waiting("a", "b", time.Minute), waiting("a", "a", time.Minute)},
			"a/a@1 a/b@2"},
		{"namespaces take turns, never served ones by their oldest waiter",
			[]Task{waiting("flood", "f1", 5*time.Minute), waiting("flood", "f2", 5*time.Minute), waiting("flood", "f3", 5*time.Minute),
				waiting("quiet", "q1", time.Minute)},
			"flood/f1@1 quiet/q1@2 flood/f2@3 flood/f3@4"},
		{"the namespace served least recently goes first",
			[]Task{running("flood", "r1", "s390x-1", 10*time.Minute, 9*time.Minute), running("quiet", "r2", "s390x-2", 20*time.Minute, 19*time.Minute),
				waiting("flood", "f1", 5*time.Minute), waiting("flood", "f2", 5*time.Minute), waiting("quiet", "q1", time.Minute)},
			"quiet/q1@1 flood/f1@2 flood/f2@3"},
		{"no waiters", []Task{running("a", "r", "s390x-1", time.Minute, time.Minute)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Summarize(Snapshot{Now: now, Platforms: []Platform{{Name: s390x, Strategy: StrategyStatic}},
				Hosts: staticHosts(1, 1), Tasks: tc.tasks})
			if got := queueOf(r, s390x); got != tc.want {
				t.Fatalf("queue %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHandOverIntervalAndETA(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ready []time.Duration // ago, oldest first
		want  time.Duration   // 0: unknown
	}{
		{"no history", nil, 0},
		{"one transition is no interval", []time.Duration{time.Minute}, 0},
		{"the mean interval", []time.Duration{100 * time.Second, 70 * time.Second, 40 * time.Second, 10 * time.Second}, 30 * time.Second},
		{"filled in one burst: the time since counts", []time.Duration{5 * time.Minute, 5 * time.Minute, 5 * time.Minute}, 5 * time.Minute},
		{"tasks stopped ending: the time since counts", []time.Duration{12 * time.Minute, 11 * time.Minute, 10 * time.Minute}, 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ready []time.Time
			for _, d := range tc.ready {
				ready = append(ready, ago(d))
			}
			got, known := HandOverInterval(ready, now)
			if known != (tc.want != 0) || got != tc.want {
				t.Fatalf("interval %s (known %v), want %s", got, known, tc.want)
			}
			if known && ETA(got, 3) != 3*tc.want {
				t.Fatalf("ETA of the third in line: %s, want %s", ETA(got, 3), 3*tc.want)
			}
		})
	}
}

// Only the latest RecentHandOvers Ready transitions of the platform count.
func TestETAComesFromRecentReadyTransitionsOfThePlatform(t *testing.T) {
	var tasks []Task
	for i := range 15 {
		// old ones 10 minutes apart, the recent ten a minute apart: the last 1 minute ago
		gap := time.Duration(i) * time.Minute
		if i >= 10 {
			gap = 9*time.Minute + time.Duration(i-9)*10*time.Minute
		}
		tasks = append(tasks, running("a", fmt.Sprintf("r%02d", i), "", time.Hour, time.Minute+gap))
	}
	other := running("a", "elsewhere", "", time.Second, time.Second)
	other.Platform = "linux/ppc64le"
	tasks = append(tasks, other, waiting("a", "w1", time.Minute), waiting("a", "w2", time.Minute))
	r := Summarize(Snapshot{Now: now, Platforms: []Platform{{Name: s390x, Strategy: StrategyStatic}}, Tasks: tasks})
	p := r.Platforms[1]
	if p.Platform != s390x || p.HandOverSeconds == nil || *p.HandOverSeconds != 60 {
		t.Fatalf("%s: hand-over %v s, want 60", p.Platform, deref(p.HandOverSeconds))
	}
	if len(p.Waiting) != 2 || deref(p.Waiting[0].ETASeconds) != int64(60) || deref(p.Waiting[1].ETASeconds) != int64(120) {
		t.Fatalf("ETAs %v and %v, want 60 and 120", deref(p.Waiting[0].ETASeconds), deref(p.Waiting[1].ETASeconds))
	}
	one := Summarize(Snapshot{Now: now, Platforms: []Platform{{Name: s390x, Strategy: StrategyStatic}},
		Tasks: []Task{running("a", "r", "", time.Minute, time.Minute), waiting("a", "w", time.Minute)}})
	if w := one.Platforms[0].Waiting[0]; w.ETASeconds != nil || one.Platforms[0].HandOverSeconds != nil {
		t.Fatalf("with one Ready transition the ETA must be unknown, got %v", deref(w.ETASeconds))
	}
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestPlatformSummaries(t *testing.T) {
	hosts := staticHosts(2, 1, 1)
	hosts[1].Quarantined, hosts[1].Reason = true, "less than 10Gi free"
	hosts[2].Drained = true
	hosts = append(hosts,
		Host{Name: "old-host", Platform: s390x, Slots: 1, Since: ago(2 * time.Hour)},   // left the config, still held
		Host{Name: "older-host", Platform: s390x, Slots: 1, Since: ago(2 * time.Hour)}, // left the config, free: not shown
		Host{Name: "vm-ready", Platform: "linux/arm64", Slots: 1, VM: &VM{State: "Ready"}, Since: ago(3 * time.Minute)},
		Host{Name: "vm-boot", Platform: "linux/arm64", Slots: 1, VM: &VM{State: "Booting", Booting: true}, Since: ago(time.Minute)},
		Host{Name: "vm-done", Platform: "linux/arm64", Slots: 1, VM: &VM{State: "Ready", Retired: "it served its task"}, Since: ago(10 * time.Minute)},
		Host{Name: "pool-1", Platform: "linux/ppc64le", Slots: 4, VM: &VM{State: "Ready", Pooled: true}, Since: ago(time.Hour)},
	)
	arm := func(name, host string) Task {
		return Task{Namespace: "a", Name: name, Platform: "linux/arm64", Strategy: StrategyDynamic, Host: host, ReservedAt: ago(time.Minute)}
	}
	tasks := []Task{
		running("a", "r1", "s390x-1", 5*time.Minute, 4*time.Minute),
		running("b", "r2", "old-host", 6*time.Minute, 5*time.Minute),
		{Namespace: "a", Name: "cleaning", Platform: s390x, SlotDebts: []string{"s390x-1"}, ReservedAt: ago(time.Hour)},
		{Namespace: "a", Name: "gone-host", Platform: s390x, SlotDebts: []string{"forgotten"}},
		waiting("a", "w1", 3*time.Minute), waiting("b", "w2", 2*time.Minute),
		arm("vm-task", "vm-ready"), arm("done-task", "vm-done"),
		{Namespace: "c", Name: "vm-wait", Platform: "linux/arm64", Strategy: StrategyDynamic, Waiting: true, Queued: ago(30 * time.Second)},
		{Namespace: "c", Name: "old", Platform: "linux/riscv64", Strategy: StrategyStatic, SlotDebts: []string{"riscv-1"}},
	}
	r := Summarize(Snapshot{Now: now, Tasks: tasks, Hosts: hosts, Platforms: []Platform{
		{Name: s390x, Strategy: StrategyStatic},
		{Name: "linux/arm64", Strategy: StrategyDynamic, MaxInstances: 4},
		{Name: "linux/ppc64le", Strategy: StrategyDynamicPool, MaxInstances: 2},
		{Name: "linux/amd64", Strategy: StrategyLocal},
	}})
	type row struct {
		platform, strategy, unit           string
		configured                         bool
		capacity, used, booting, run, wait int
		oldest                             any
	}
	var got []row
	for _, p := range r.Platforms {
		got = append(got, row{p.Platform, p.Strategy, p.CapacityUnit, p.Configured, p.Capacity, p.Used, p.Booting, p.Running, p.Queued, deref(p.OldestWaitSeconds)})
	}
	want := []row{
		{"linux/amd64", "local", "", true, 0, 0, 0, 0, 0, nil},
		{"linux/arm64", "dynamic", "instances", true, 4, 2, 1, 2, 1, int64(30)},
		{"linux/ppc64le", "dynamic-pool", "instances", true, 2, 1, 0, 0, 0, nil},
		{"linux/riscv64", "static", "slots", false, 0, 1, 0, 0, 0, nil},
		// 2+1+1 configured slots; s390x-1 holds r1 and a cleanup, old-host r2, forgotten a cleanup
		{s390x, "static", "slots", true, 4, 4, 0, 2, 2, int64(180)},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("platforms\n got %v\nwant %v", got, want)
	}
	var hostRows []string
	for _, p := range r.Platforms {
		for _, h := range p.Hosts {
			hostRows = append(hostRows, fmt.Sprintf("%s %s %s %d/%d %s %q %v", h.Name, h.Kind, h.State, h.SlotsUsed, h.Slots, h.Health, h.Reason, deref(h.AgeSeconds)))
		}
	}
	wantHosts := []string{
		`vm-boot vm Booting 0/1 ok "" 60`,
		`vm-done vm Ready 1/1 retired "it served its task" 600`,
		`vm-ready vm Ready 1/1 ok "" 180`,
		`pool-1 vm Ready 0/4 ok "" 3600`,
		`riscv-1 static  1/0 retired "not in the config any more; takes no new task" <nil>`,
		`forgotten static  1/0 retired "not in the config any more; takes no new task" <nil>`,
		`old-host static  1/1 retired "not in the config any more; takes no new task" 7200`,
		`s390x-1 static  2/2 ok "" 3600`,
		`s390x-2 static  0/1 quarantined "less than 10Gi free" 3600`,
		`s390x-3 static  0/1 drained "" 3600`,
	}
	if strings.Join(hostRows, "\n") != strings.Join(wantHosts, "\n") {
		t.Fatalf("hosts\n%s\nwant\n%s", strings.Join(hostRows, "\n"), strings.Join(wantHosts, "\n"))
	}
	// b was served least recently (r2 before r1), so its task goes first though queued later.
	if q := queueOf(r, s390x); q != "b/w2@1 a/w1@2" {
		t.Fatalf("queue %q", q)
	}
}

// The JSON field names are documented (docs/operating.md, `berth status --help`): they must not drift.
func TestReportFieldNames(t *testing.T) {
	r := Summarize(Snapshot{Now: now, Platforms: []Platform{{Name: s390x, Strategy: StrategyStatic}}, Hosts: staticHosts(1),
		Tasks: []Task{running("a", "r", "s390x-1", time.Minute, time.Minute), waiting("a", "w", time.Minute)}})
	r.Namespace = "berth-system"
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"namespace":"berth-system","time":"2026-03-01T12:00:00Z","platforms":[{"platform":"linux/s390x","strategy":"static",` +
		`"configured":true,"capacity":1,"capacityUnit":"slots","used":1,"booting":0,"running":1,"queued":1,"oldestWaitSeconds":60,` +
		`"handOverSeconds":null,"hosts":[{"name":"s390x-1","kind":"static","slotsUsed":1,"slots":1,"health":"ok","ageSeconds":3600}],` +
		`"waiting":[{"namespace":"a","name":"w","position":1,"waitedSeconds":60,"etaSeconds":null}]}]}`
	if string(data) != want {
		t.Fatalf("JSON\n got %s\nwant %s", data, want)
	}
}
