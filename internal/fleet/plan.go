// Package fleet decides how many VMs a dynamic platform needs: which to launch, which to
// retire and which to terminate. It is plain Go and decides from a snapshot; the controller
// takes the snapshot from its records and the ledger, and carries the decision out, one
// platform at a time, so two decisions never race.
package fleet

import (
	"sort"
	"time"
)

// Phase is where a VM is: it mirrors the record's phase.
type Phase int

const (
	Launching   Phase = iota // recorded, the cloud is being asked
	Booting                  // the cloud answered; waiting for its address and SSH
	Ready                    // takes tasks
	Terminating              // being terminated
)

// VM is one VM of the platform as the snapshot sees it.
type VM struct {
	Name  string
	Phase Phase
	Slots int
	// Used is how many tasks hold it (cleanups still owed count as tasks).
	Used int
	// Retired VMs take no new task.
	Retired bool
	// SingleUse VMs serve one task; once Used they are retired by the reservation itself.
	SingleUse bool
	// Outdated VMs were launched with settings the platform no longer has (another image,
	// type or region): they take no new task, like VMs past max-age, whether or not they
	// are closed already (the controller closes them at the config change).
	Outdated bool
	ReadyAt  time.Time
	// MinLife is how long the cloud bills the VM's hardware at the least (an EC2 Mac's
	// dedicated host: 24 hours): max-age retires no VM younger, which would only pay for
	// another. It is the VM's own type's, which a fallback type may make differ from its
	// platform's other VMs.
	MinLife time.Duration
}

// Platform is what the config and the queue say about the platform.
type Platform struct {
	MaxInstances int
	SlotsPerVM   int
	// MinIdle free slots are kept ready beyond the queue's demand.
	MinIdle int
	// MaxAge, if set, is how long a VM takes new tasks after it became ready.
	MaxAge time.Duration
	// Pooled VMs stay for the next tasks until MaxAge; others go when no task wants them.
	Pooled bool
	// Queued tasks wait for a slot.
	Queued int
	// Paused stops launches: the cloud refused the last one for good (bad config, auth).
	Paused bool
	// Removed platforms left the config: they launch nothing, and every VM goes once free.
	Removed bool
}

// Retirement says why a VM takes no more tasks.
type Retirement struct {
	Name   string
	Reason string
}

// Decision is what to do now. A VM is in at most one list: Retire closes it for new tasks,
// Terminate ends it (the reason is empty for one retired earlier, whose record says why).
type Decision struct {
	Launch    int
	Retire    []Retirement
	Terminate []Retirement
}

// Plan decides for one platform. Launches cover the queue and min-idle beyond the free and
// booting slots, never past max-instances (every recorded VM counts, terminating ones too:
// the cloud still runs them). A VM is terminated only when no task holds it.
func Plan(p Platform, vms []VM, now time.Time) Decision {
	var d Decision
	slots := max(p.SlotsPerVM, 1)
	free, booting := 0, 0
	var idle []VM // ready, open and unused: candidates for retiring when nobody wants them
	// end retires vm for why, and terminates it at once if no task holds it.
	end := func(vm VM, why string) {
		if vm.Used == 0 {
			d.Terminate = append(d.Terminate, Retirement{vm.Name, why})
		} else {
			d.Retire = append(d.Retire, Retirement{vm.Name, why})
		}
	}
	for _, vm := range vms {
		switch {
		case vm.Phase == Terminating:
		case vm.Phase == Ready && vm.Outdated && !p.Removed:
			end(vm, "launched with settings the platform no longer has")
		case vm.Retired:
			if vm.Used == 0 && vm.Phase == Ready {
				d.Terminate = append(d.Terminate, Retirement{Name: vm.Name})
			}
		case p.Removed:
			end(vm, "its platform is no longer a dynamic platform in the host configuration")
		case vm.Phase == Ready && p.MaxAge > 0 && now.Sub(vm.ReadyAt) > max(p.MaxAge, vm.MinLife):
			end(vm, "older than max-age ("+p.MaxAge.String()+")")
		case vm.Phase == Ready:
			free += max(0, vm.Slots-vm.Used)
			if vm.Used == 0 {
				idle = append(idle, vm)
			}
		default:
			booting += vm.Slots
		}
	}
	if p.Removed {
		return d
	}
	need := p.Queued + p.MinIdle
	// A VM launched for one task does not wait around once no task (and no min-idle) wants it;
	// pools keep theirs for the next tasks until max-age.
	if !p.Pooled {
		sort.Slice(idle, func(i, j int) bool { return idle[i].ReadyAt.Before(idle[j].ReadyAt) })
		for _, vm := range idle {
			if free-vm.Slots < need {
				break
			}
			free -= vm.Slots
			end(vm, "no task waits for it")
		}
	}
	if p.Paused {
		return d
	}
	if deficit := need - free - booting; deficit > 0 {
		d.Launch = min((deficit+slots-1)/slots, p.MaxInstances-len(vms))
		d.Launch = max(d.Launch, 0)
	}
	return d
}
