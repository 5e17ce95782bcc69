// Package status tells people how berth's platforms stand: per platform its capacity and what
// is used of it, per host its slots and health, per waiting task its place in line and an
// estimate of when it is served. It is plain Go: the caller reads berth's records and config
// into a Snapshot. Occupancy and queue order come from the allocation ledger itself, rebuilt
// from the snapshot as the controller rebuilds it from the records, so what is shown is what
// the ledger does.
package status

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/berth-ci/berth/internal/allocation"
)

// Strategies, as the config names them.
const (
	StrategyLocal       = "local"
	StrategyStatic      = "static"
	StrategyDynamic     = "dynamic"
	StrategyDynamicPool = "dynamic-pool"
)

// Units of a platform's capacity.
const (
	UnitSlots     = "slots"     // static hosts: the sum of their concurrency
	UnitInstances = "instances" // dynamic platforms: max-instances
)

// Health of a host.
const (
	HealthOK          = "ok"
	HealthQuarantined = "quarantined" // a check or its cleanups failed; takes no new task
	HealthDrained     = "drained"     // an operator drained it; takes no new task
	HealthRetired     = "retired"     // left the config, or a VM being retired; takes no new task
)

// RecentHandOvers is how many of a platform's latest hand-overs the ETA is taken from.
const RecentHandOvers = 10

// Snapshot is what berth's config and records say at one moment.
type Snapshot struct {
	Now       time.Time
	Platforms []Platform
	Hosts     []Host
	Tasks     []Task
}

// Platform is a platform of the config in force.
type Platform struct {
	Name     string
	Strategy string
	// MaxInstances bounds the VMs of a dynamic platform.
	MaxInstances int
}

// Host is a static host of the config, or a VM berth launched, with what its BuildHost record
// says.
type Host struct {
	Name     string
	Platform string
	Slots    int
	// Configured static hosts are in the config in force; one that left it still holds its
	// tasks until they end, and is shown until then.
	Configured bool
	// VM is set for a VM berth launched.
	VM          *VM
	Drained     bool
	Quarantined bool
	Reason      string
	// Since is when berth recorded the host; zero when it has not yet.
	Since time.Time
}

// VM is what berth knows of one of its VMs.
type VM struct {
	// State is the record's phase: Launching, Booting, Ready, Terminating.
	State string
	// Booting VMs (launching or booting) take no task yet.
	Booting bool
	Pooled  bool
	// Retired says why the VM takes no new task; empty when it does.
	Retired string
}

// Task is a user TaskRun berth serves, from its Allocation record.
type Task struct {
	Namespace, Name string
	Platform        string
	// Strategy is how the platform was served when the task came (the record's).
	Strategy string
	Waiting  bool
	// Host is the host the task holds a slot of (provisioning or ready).
	Host string
	// SlotDebts are the hosts whose slot a cleanup still owed by the record holds.
	SlotDebts []string
	Queued    time.Time
	// ReservedAt is when the task last got a slot; ReadyAt when its build user became ready
	// (zero when not yet).
	ReservedAt, ReadyAt time.Time
}

// Report is what `berth status` prints; -o json and -o yaml print it with these field names.
type Report struct {
	Namespace string           `json:"namespace"`
	Time      time.Time        `json:"time"`
	Platforms []PlatformStatus `json:"platforms"`
}

// PlatformStatus is one platform.
type PlatformStatus struct {
	Platform string `json:"platform"`
	Strategy string `json:"strategy"`
	// Configured is false for a platform that left the config but still has hosts or tasks.
	Configured bool `json:"configured"`
	// Capacity is counted in CapacityUnit: slots of static hosts, or max-instances of a
	// dynamic platform; 0 and "" for a local one.
	Capacity     int    `json:"capacity"`
	CapacityUnit string `json:"capacityUnit"`
	// Used is in CapacityUnit: slots held (by tasks, and by cleanups still owed), or VMs up
	// (ready or terminating). Booting counts VMs launching or booting: together with Used they
	// count against max-instances.
	Used    int `json:"used"`
	Booting int `json:"booting"`
	// Running counts the tasks that hold a host; Queued those that wait.
	Running           int    `json:"running"`
	Queued            int    `json:"queued"`
	OldestWaitSeconds *int64 `json:"oldestWaitSeconds"`
	// HandOverSeconds is the interval the ETAs are counted in (see ETA); null without history.
	HandOverSeconds *int64       `json:"handOverSeconds"`
	Hosts           []HostStatus `json:"hosts"`
	// Waiting lists the waiting tasks in serving order.
	Waiting []WaitingTask `json:"waiting"`
}

// HostStatus is one host or VM.
type HostStatus struct {
	Name string `json:"name"`
	// Kind is "static" or "vm".
	Kind string `json:"kind"`
	// State is a VM's phase (Launching, Booting, Ready, Terminating); empty for a static host.
	State     string `json:"state,omitempty"`
	SlotsUsed int    `json:"slotsUsed"`
	Slots     int    `json:"slots"`
	Health    string `json:"health"`
	// Reason says why a host is quarantined or retired.
	Reason string `json:"reason,omitempty"`
	// AgeSeconds counts from berth's first record of the host; null when it has none yet.
	AgeSeconds *int64 `json:"ageSeconds"`
}

// WaitingTask is one task in a platform's queue.
type WaitingTask struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Position is the place in line, 1 = next.
	Position      int   `json:"position"`
	WaitedSeconds int64 `json:"waitedSeconds"`
	// ETASeconds is when the task should be served, from now; null when unknown.
	ETASeconds *int64 `json:"etaSeconds"`
}

// Summarize tells how every platform stands.
func Summarize(s Snapshot) Report {
	sum := summary{Snapshot: s, ledger: rebuildLedger(s), used: map[string]int{}, platforms: map[string]*PlatformStatus{}}
	for _, u := range sum.ledger.Usage() {
		sum.used[u.Host] = u.Used
	}
	sum.addPlatforms()
	sum.addHosts()
	sum.addTasks()
	return sum.report()
}

// summary is a Report being put together.
type summary struct {
	Snapshot
	ledger    *allocation.Ledger
	used      map[string]int // slots held per host, as the ledger counts them
	platforms map[string]*PlatformStatus
}

func (sum *summary) platform(name string) *PlatformStatus {
	if p := sum.platforms[name]; p != nil {
		return p
	}
	p := &PlatformStatus{Platform: name, Hosts: []HostStatus{}, Waiting: []WaitingTask{}}
	sum.platforms[name] = p
	return p
}

func (sum *summary) addPlatforms() {
	for _, cfg := range sum.Platforms {
		p := sum.platform(cfg.Name)
		p.Strategy, p.Configured = cfg.Strategy, true
		if cfg.Strategy == StrategyDynamic || cfg.Strategy == StrategyDynamicPool {
			p.Capacity = cfg.MaxInstances
		}
	}
}

// addHosts counts static slots and VMs into their platforms' capacity and use.
func (sum *summary) addHosts() {
	hosts := slices.Clone(sum.Hosts)
	named := map[string]bool{}
	for _, h := range hosts {
		named[h.Name] = true
	}
	for _, u := range sum.ledger.Usage() {
		if !named[u.Host] && u.Used > 0 {
			// Held by records, named by neither the config nor a BuildHost record any more.
			hosts = append(hosts, Host{Name: u.Host, Platform: u.Platform})
		}
	}
	for _, h := range hosts {
		used := sum.used[h.Name]
		if h.VM == nil && !h.Configured && used == 0 {
			continue // left the config, and its last task is gone
		}
		p := sum.platform(h.Platform)
		p.Hosts = append(p.Hosts, hostStatus(h, used, sum.Now))
		switch {
		case h.VM == nil:
			if h.Configured {
				p.Capacity += h.Slots
			}
			p.Used += used
		case h.VM.Booting:
			p.Booting++
		default:
			p.Used++
		}
	}
}

func (sum *summary) addTasks() {
	for _, t := range sum.Tasks {
		p := sum.platform(t.Platform)
		if p.Strategy == "" {
			p.Strategy = t.Strategy // a platform that left the config: as its tasks were served
		}
		if t.Host != "" {
			p.Running++
		}
		if t.Waiting {
			p.Queued++
			waited := seconds(sum.Now.Sub(t.Queued))
			if p.OldestWaitSeconds == nil || waited > *p.OldestWaitSeconds {
				p.OldestWaitSeconds = &waited
			}
		}
	}
}

// report lists the platforms by name, each with its queue in the ledger's order and ETAs.
func (sum *summary) report() Report {
	queued := map[allocation.Task]time.Time{}
	for _, t := range sum.Tasks {
		queued[allocation.Task{Namespace: t.Namespace, Name: t.Name}] = t.Queued
	}
	out := Report{Time: sum.Now, Platforms: []PlatformStatus{}}
	for _, name := range slices.Sorted(maps.Keys(sum.platforms)) {
		p := sum.platforms[name]
		switch p.Strategy {
		case StrategyStatic:
			p.CapacityUnit = UnitSlots
		case StrategyDynamic, StrategyDynamicPool:
			p.CapacityUnit = UnitInstances
		}
		handOver, known := HandOverInterval(readyTimes(sum.Tasks, name), sum.Now)
		if known {
			p.HandOverSeconds = ptr(seconds(handOver))
		}
		for i, task := range sum.ledger.Queue(name) {
			w := WaitingTask{Namespace: task.Namespace, Name: task.Name, Position: i + 1, WaitedSeconds: seconds(sum.Now.Sub(queued[task]))}
			if known {
				w.ETASeconds = ptr(seconds(ETA(handOver, w.Position)))
			}
			p.Waiting = append(p.Waiting, w)
		}
		slices.SortFunc(p.Hosts, func(a, b HostStatus) int { return strings.Compare(a.Name, b.Name) })
		out.Platforms = append(out.Platforms, *p)
	}
	return out
}

// rebuildLedger puts the snapshot into a ledger the way the controller restores its own from
// the records: hosts and their service, who holds which slot, which cleanups hold slots, who
// waits; and whose turn came when, from the reservation times.
func rebuildLedger(s Snapshot) *allocation.Ledger {
	l := allocation.New()
	var static []allocation.Host
	for _, h := range s.Hosts {
		if h.VM == nil && h.Configured {
			static = append(static, allocation.Host{Name: h.Name, Platform: h.Platform, Capacity: h.Slots})
		}
	}
	l.SetHosts(static)
	for _, h := range s.Hosts {
		if h.VM == nil || h.VM.Booting {
			continue
		}
		vm := allocation.Host{Name: h.Name, Platform: h.Platform, Capacity: h.Slots, SingleUse: !h.VM.Pooled}
		if h.VM.Retired != "" {
			l.PutRetiredHost(vm)
		} else {
			l.PutHost(vm)
		}
	}
	for _, h := range s.Hosts {
		l.Quarantine(h.Name, h.Drained || h.Quarantined)
	}
	reserved := slices.Clone(s.Tasks)
	slices.SortStableFunc(reserved, func(a, b Task) int { return a.ReservedAt.Compare(b.ReservedAt) })
	for _, t := range reserved {
		if !t.ReservedAt.IsZero() {
			l.RestoreTurn(t.Platform, t.Namespace)
		}
	}
	for _, t := range s.Tasks {
		task := allocation.Task{Namespace: t.Namespace, Name: t.Name}
		if t.Host != "" {
			l.Restore(task, t.Host, t.Platform)
		}
		for i, host := range t.SlotDebts {
			// A name no TaskRun can have, as the controller's own debt holders.
			l.Restore(allocation.Task{Namespace: t.Namespace, Name: fmt.Sprintf("debt/%s/%d", t.Name, i)}, host, t.Platform)
		}
		if t.Waiting {
			l.Enqueue(allocation.Request{Task: task, Platform: t.Platform, Created: t.Queued})
		}
	}
	return l
}

func hostStatus(h Host, used int, now time.Time) HostStatus {
	out := HostStatus{Name: h.Name, Kind: "static", SlotsUsed: used, Slots: h.Slots, Health: HealthOK}
	if h.VM != nil {
		out.Kind, out.State = "vm", h.VM.State
	}
	switch {
	case h.Quarantined:
		out.Health, out.Reason = HealthQuarantined, h.Reason
	case h.Drained:
		out.Health = HealthDrained
	case h.VM == nil && !h.Configured:
		out.Health, out.Reason = HealthRetired, "not in the config any more; takes no new task"
	case h.VM != nil && h.VM.Retired != "":
		out.Health, out.Reason = HealthRetired, h.VM.Retired
	}
	if !h.Since.IsZero() {
		out.AgeSeconds = ptr(seconds(now.Sub(h.Since)))
	}
	return out
}

// readyTimes are the platform's latest hand-overs of a slot the records hold, oldest first:
// when a task's build user became ready where a record says so (ReadyAt, which berth writes
// no more), else when its slot was reserved.
func readyTimes(tasks []Task, platform string) []time.Time {
	var out []time.Time
	for _, t := range tasks {
		at := t.ReadyAt
		if at.IsZero() {
			at = t.ReservedAt
		}
		if t.Platform == platform && !at.IsZero() {
			out = append(out, at)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out[max(0, len(out)-RecentHandOvers):]
}

// HandOverInterval is how long a slot takes to pass from one task to the next on a platform,
// judged from its recent Ready transitions (oldest first): the mean interval between them, or
// the time since the last one when that is longer (a platform that filled in one burst, or
// whose tasks stopped ending, is not handing over that fast). Fewer than two: unknown.
func HandOverInterval(ready []time.Time, now time.Time) (time.Duration, bool) {
	if len(ready) < 2 {
		return 0, false
	}
	last := ready[len(ready)-1]
	mean := last.Sub(ready[0]) / time.Duration(len(ready)-1)
	// Whole seconds, as the records' times are: an ETA is then its position times the interval
	// shown.
	return max(mean, now.Sub(last), 0).Round(time.Second), true
}

// ETA is when the task at position is served: one hand-over per place in line.
func ETA(handOver time.Duration, position int) time.Duration {
	return handOver * time.Duration(position)
}

// seconds rounds down; a time ahead of now (the clocks of berth and of the caller differ) is 0.
func seconds(d time.Duration) int64 { return int64(max(d, 0) / time.Second) }

func ptr[T any](v T) *T { return &v }
