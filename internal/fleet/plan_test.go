package fleet

import (
	"slices"
	"testing"
	"time"
)

func TestPlan(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	old, fresh := now.Add(-2*time.Hour), now.Add(-time.Minute)
	ready := func(name string, slots, used int, at time.Time) VM {
		return VM{Name: name, Phase: Ready, Slots: slots, Used: used, ReadyAt: at}
	}
	dyn := Platform{MaxInstances: 4, SlotsPerVM: 1}
	pool := Platform{MaxInstances: 2, SlotsPerVM: 3, Pooled: true, MaxAge: time.Hour}
	with := func(p Platform, f func(*Platform)) Platform { f(&p); return p }
	cases := []struct {
		name      string
		p         Platform
		vms       []VM
		launch    int
		retire    []string
		terminate []string
	}{
		{name: "nothing wanted", p: dyn},
		{name: "one VM per queued task", p: with(dyn, func(p *Platform) { p.Queued = 3 }), launch: 3},
		{name: "never past max-instances", p: with(dyn, func(p *Platform) { p.Queued = 9 }), vms: []VM{{Name: "a", Phase: Terminating, Slots: 1}}, launch: 3},
		{name: "booting VMs count", p: with(dyn, func(p *Platform) { p.Queued = 2 }), vms: []VM{{Name: "a", Phase: Booting, Slots: 1}}, launch: 1},
		{name: "a launch being recorded counts", p: with(dyn, func(p *Platform) { p.Queued = 1 }), vms: []VM{{Name: "a", Phase: Launching, Slots: 1}}},
		{name: "free ready VM serves the queue", p: with(dyn, func(p *Platform) { p.Queued = 1 }), vms: []VM{ready("a", 1, 0, fresh)}},
		{name: "min-idle keeps warm VMs", p: with(dyn, func(p *Platform) { p.MinIdle = 2 }), vms: []VM{ready("a", 1, 0, fresh)}, launch: 1},
		{name: "unwanted idle dynamic VM goes", p: dyn, vms: []VM{ready("a", 1, 0, fresh)}, terminate: []string{"a"}},
		{name: "idle beyond min-idle goes, oldest first", p: with(dyn, func(p *Platform) { p.MinIdle = 1 }),
			vms: []VM{ready("a", 1, 0, fresh), ready("b", 1, 0, old)}, terminate: []string{"b"}},
		{name: "used single-use VM is terminated once free", p: dyn, vms: []VM{{Name: "a", Phase: Ready, Slots: 1, Retired: true, SingleUse: true}}, terminate: []string{"a"}},
		{name: "retired VM with a task stays", p: dyn, vms: []VM{{Name: "a", Phase: Ready, Slots: 1, Used: 1, Retired: true}}},
		{name: "pool packs before launching", p: with(pool, func(p *Platform) { p.Queued = 2 }), vms: []VM{ready("a", 3, 1, fresh)}},
		{name: "pool launches for demand beyond free slots", p: with(pool, func(p *Platform) { p.Queued = 4 }), vms: []VM{ready("a", 3, 1, fresh)}, launch: 1},
		{name: "pool launches whole VMs for the queue", p: with(pool, func(p *Platform) { p.Queued = 4; p.MaxInstances = 5 }), launch: 2},
		{name: "pool keeps idle VMs until max-age", p: pool, vms: []VM{ready("a", 3, 0, fresh)}},
		{name: "pool culls idle VMs past max-age", p: pool, vms: []VM{ready("a", 3, 0, old)}, terminate: []string{"a"}},
		{name: "busy VM past max-age is retired, never terminated", p: pool, vms: []VM{ready("a", 3, 2, old)}, retire: []string{"a"}},
		{name: "warm VM past max-age is replaced", p: with(dyn, func(p *Platform) { p.MinIdle = 1; p.MaxAge = time.Hour }),
			vms: []VM{ready("a", 1, 0, old)}, launch: 1, terminate: []string{"a"}},
		{name: "warm VM past max-age within its hardware's minimum life stays", p: with(dyn, func(p *Platform) { p.MinIdle = 1; p.MaxAge = time.Hour }),
			vms: []VM{living(ready("a", 1, 0, old), 24*time.Hour)}},
		{name: "pool VM past max-age within its hardware's minimum life stays", p: pool,
			vms: []VM{living(ready("a", 3, 0, old), 24*time.Hour)}},
		{name: "warm VM past max-age and its minimum life is replaced", p: with(dyn, func(p *Platform) { p.MinIdle = 1; p.MaxAge = time.Hour }),
			vms: []VM{living(ready("a", 1, 0, now.Add(-25*time.Hour)), 24*time.Hour)}, launch: 1, terminate: []string{"a"}},
		{name: "each VM has its own type's minimum life", p: pool,
			vms: []VM{living(ready("mac", 3, 0, old), 24*time.Hour), ready("other", 3, 0, old)}, terminate: []string{"other"}},
		{name: "removed platform: busy VMs retire, free ones go, nothing launches", p: with(dyn, func(p *Platform) { p.Removed = true; p.Queued = 3 }),
			vms: []VM{ready("a", 1, 1, fresh), ready("b", 1, 0, fresh), {Name: "c", Phase: Booting, Slots: 1}}, retire: []string{"a"}, terminate: []string{"b", "c"}},
		{name: "outdated VMs: busy ones retire, free ones go, new ones serve the queue", p: with(pool, func(p *Platform) { p.Queued = 2; p.MaxInstances = 5 }),
			vms:    []VM{{Name: "a", Phase: Ready, Slots: 3, Used: 1, Outdated: true, ReadyAt: fresh}, {Name: "b", Phase: Ready, Slots: 3, Outdated: true, ReadyAt: fresh}},
			retire: []string{"a"}, terminate: []string{"b"}, launch: 1},
		{name: "outdated VMs already closed still go for that reason", p: pool,
			vms: []VM{{Name: "a", Phase: Ready, Slots: 3, Outdated: true, Retired: true, ReadyAt: fresh}}, terminate: []string{"a"}},
		{name: "paused platform launches nothing", p: with(dyn, func(p *Platform) { p.Queued = 2; p.Paused = true })},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Plan(c.p, c.vms, now)
			names := func(rs []Retirement) (out []string) {
				for _, r := range rs {
					out = append(out, r.Name)
				}
				return out
			}
			if d.Launch != c.launch || !slices.Equal(names(d.Retire), c.retire) || !slices.Equal(names(d.Terminate), c.terminate) {
				t.Fatalf("got launch %d retire %v terminate %v; want launch %d retire %v terminate %v",
					d.Launch, names(d.Retire), names(d.Terminate), c.launch, c.retire, c.terminate)
			}
		})
	}
}

// living is vm with a minimum life.
func living(vm VM, minLife time.Duration) VM {
	vm.MinLife = minLife
	return vm
}
