package bench

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// What the harness judges of a VM fleet, from the cloud's own account of every instance it
// ever launched and the controller's BuildHost records. Plain functions of those lists, so
// that the judgement is tested apart from a run.

// tagRecord is the tag berth puts on an instance naming the BuildHost record it was launched
// for (cloud.TagRecord; the bench knows the contract, not the controller's packages).
const tagRecord = "berth.dev/record"

// vmRecord is what the harness reads of a VM's BuildHost record.
type vmRecord struct {
	Name string
	// InstanceID is the instance the record holds; empty while it is being launched.
	InstanceID string
	// Retired records take no new task: once free, their VM should be terminated.
	Retired bool
	ReadyAt time.Time
}

// leakedInstances names the instances still up that the controller does not account for, or
// should have ended by now: those no record claims (no record of their tag's name, or one that
// holds another instance), those whose record is retired (a single-use VM that served its
// task, or a pool VM past max-age), and those ready for longer than maxAge (0: no limit). A
// warm or pooled VM with a live record is not a leak. Call it once the tasks are done and the
// controller had time to settle.
func leakedInstances(instances []vmcloud.Instance, records []vmRecord, maxAge time.Duration, now time.Time) []string {
	byName := map[string]vmRecord{}
	for _, r := range records {
		byName[r.Name] = r
	}
	var leaks []string
	for _, inst := range instances {
		if inst.State == vmcloud.Gone || inst.Vanished {
			continue
		}
		name := inst.Tags[tagRecord]
		rec, ok := byName[name]
		switch {
		case !ok || (rec.InstanceID != "" && rec.InstanceID != inst.ID):
			leaks = append(leaks, fmt.Sprintf("%s (record %q): no record holds it", inst.ID, name))
		case rec.Retired:
			leaks = append(leaks, fmt.Sprintf("%s (record %s): retired but not terminated", inst.ID, name))
		case maxAge > 0 && !rec.ReadyAt.IsZero() && now.Sub(rec.ReadyAt) > maxAge:
			leaks = append(leaks, fmt.Sprintf("%s (record %s): ready since %s, past max-age %s", inst.ID, name, rec.ReadyAt.Format(time.RFC3339), maxAge))
		}
	}
	return leaks
}

// doubleLaunches counts instances that should not exist beside another: a second instance
// of one launch token (the token makes a launch idempotent), and an instance launched for a
// record while an earlier one of the same record was still up (a record relaunches only
// after its instance was lost, under a new token).
func doubleLaunches(instances []vmcloud.Instance) int {
	n := 0
	byToken := map[string]int{}
	byRecord := map[string][]vmcloud.Instance{}
	for _, inst := range instances {
		byToken[inst.Token]++
		if byToken[inst.Token] > 1 {
			n++
			continue // counted once, as the token's repeat
		}
		if r := inst.Tags[tagRecord]; r != "" {
			byRecord[r] = append(byRecord[r], inst)
		}
	}
	for _, insts := range byRecord {
		slices.SortFunc(insts, func(a, b vmcloud.Instance) int { return a.LaunchedAt.Compare(b.LaunchedAt) })
		for i := 1; i < len(insts); i++ {
			for _, earlier := range insts[:i] {
				if up(earlier, insts[i].LaunchedAt) {
					n++
					break
				}
			}
		}
	}
	return n
}

// up tells whether inst held quota (pending or running) just after at.
func up(inst vmcloud.Instance, at time.Time) bool {
	return !inst.LaunchedAt.After(at) && (inst.TerminatedAt.IsZero() || inst.TerminatedAt.After(at))
}

// instancePeak replays launches and ends: the most instances up at once, and how many
// launches took the count above limit. Exact, unlike sampling: every instance keeps its
// launch and end times, stamped by the cloud under its own lock. An end and a launch at the
// same instant count the end first.
func instancePeak(instances []vmcloud.Instance, limit int) (peak, over int) {
	type change struct {
		at    time.Time
		delta int
	}
	var changes []change
	for _, inst := range instances {
		changes = append(changes, change{inst.LaunchedAt, +1})
		if !inst.TerminatedAt.IsZero() {
			changes = append(changes, change{inst.TerminatedAt, -1})
		}
	}
	slices.SortStableFunc(changes, func(a, b change) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.delta, b.delta)
	})
	up := 0
	for _, c := range changes {
		up += c.delta
		peak = max(peak, up)
		if c.delta > 0 && up > limit {
			over++
		}
	}
	return peak, over
}

// readyToSecret is, for every instance that ran, the time from its becoming running in the
// cloud to the first secret of a task that got it: tasksOn lists the tasks each host (the
// record's name) was assigned, secretAt when each task's secret appeared.
func readyToSecret(instances []vmcloud.Instance, tasksOn map[string][]string, secretAt map[string]time.Time) []time.Duration {
	var out []time.Duration
	for _, inst := range instances {
		if inst.RunningAt.IsZero() {
			continue
		}
		var first time.Time
		for _, task := range tasksOn[inst.Tags[tagRecord]] {
			if s, ok := secretAt[task]; ok && (first.IsZero() || s.Before(first)) {
				first = s
			}
		}
		if !first.IsZero() && !first.Before(inst.RunningAt) {
			out = append(out, first.Sub(inst.RunningAt))
		}
	}
	return out
}
