package allocation

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The indexed ledger decides as the plain one did (refLedger), step for step: random
// sequences of everything the controller does (acquire, release, config changes that add,
// remove, resize and move hosts between platforms, caps, quarantines, VMs, restores,
// transfers to cleanup debts, restored turns) on a universe small enough that collisions are
// common: shared hosts, tied creation times, excluded hosts, namespaces at their caps. After
// every step both ledgers must have answered the same and show the same state: occupancy,
// queues, every waiter's position, free slots.
func TestIndexedLedgerDecidesAsThePlainOne(t *testing.T) {
	for seed := range uint64(40) {
		// Every tenth world has long queues: a few namespaces with a hundred tasks each.
		w := newWorld(seed, 24, 1)
		if seed%10 == 9 {
			w = newWorld(seed, 300, 8)
		}
		for step := range 150 {
			op := w.step()
			if err := w.compare(); err != nil {
				t.Fatalf("seed %d, step %d (%s): %v\nsteps:\n%s", seed, step, op, err, strings.Join(w.log, "\n"))
			}
		}
	}
}

var (
	diffPlatforms  = []string{"linux/amd64", "linux/s390x"}
	diffNamespaces = []string{"a", "b", "c", "d"}
)

type world struct {
	rng      *rand.Rand
	got      *Ledger
	want     *refLedger
	tasks    []Request
	hosts    []string
	vms      []string
	debts    int
	log      []string
	mismatch error
}

// newWorld makes a universe of tasks over four namespaces (the first one's share tilted by
// flood), two platforms, six configured hosts and three VMs.
func newWorld(seed uint64, tasks, flood int) *world {
	w := &world{rng: rand.New(rand.NewPCG(seed, 17)), got: New(), want: newRef()}
	for i := range tasks {
		ns := diffNamespaces[max(0, w.rng.IntN(len(diffNamespaces)+flood)-flood)]
		// Creation times in whole seconds out of a few: ties are frequent.
		w.tasks = append(w.tasks, Request{Task: Task{Namespace: ns, Name: fmt.Sprintf("t%03d", i)},
			Platform: diffPlatforms[w.rng.IntN(2)], Created: t0.Add(time.Duration(w.rng.IntN(tasks/3)) * time.Second)})
	}
	for i := range 6 {
		w.hosts = append(w.hosts, fmt.Sprintf("h%d", i))
	}
	for i := range 3 {
		w.vms = append(w.vms, fmt.Sprintf("vm%d", i))
	}
	return w
}

func (w *world) task() Request { return w.tasks[w.rng.IntN(len(w.tasks))] }

func (w *world) platform() string { return diffPlatforms[w.rng.IntN(2)] }

func (w *world) anyHost() string {
	all := append(slices.Clone(w.hosts), w.vms...)
	return all[w.rng.IntN(len(all))]
}

// exclude is usually nothing, sometimes a host or two the task failed on.
func (w *world) exclude() []string {
	var out []string
	for w.rng.IntN(3) == 0 {
		out = append(out, w.anyHost())
	}
	return out
}

// step does one random thing to both ledgers and compares their answers.
func (w *world) step() string {
	var op string
	same := func(got, want any) {
		if g, wt := fmt.Sprintf("%+v", got), fmt.Sprintf("%+v", want); g != wt {
			w.mismatch = fmt.Errorf("answered %s, want %s", g, wt)
		}
	}
	sameSet := func(got, want []Task) {
		sortTasks(got)
		sortTasks(want)
		same(got, want)
	}
	switch r := w.rng.IntN(100); {
	case r < 35:
		req := w.task()
		req.Exclude = w.exclude()
		op = fmt.Sprintf("Acquire(%v, %s, exclude %v)", req.Task, req.Platform, req.Exclude)
		same(w.got.Acquire(req), w.want.Acquire(req))
	case r < 60:
		t := w.task().Task
		if w.debts > 0 && w.rng.IntN(4) == 0 {
			t = Task{Namespace: diffNamespaces[w.rng.IntN(len(diffNamespaces))], Name: fmt.Sprintf("debt/%d", w.rng.IntN(w.debts))}
		}
		op = fmt.Sprintf("Release(%v)", t)
		same(w.got.Release(t), w.want.Release(t))
	case r < 66:
		var hosts []Host
		for _, name := range w.hosts {
			if w.rng.IntN(4) > 0 {
				hosts = append(hosts, Host{Name: name, Platform: w.platform(), Capacity: w.rng.IntN(4), SingleUse: w.rng.IntN(10) == 0})
			}
		}
		op = fmt.Sprintf("SetHosts(%+v)", hosts)
		sameSet(w.got.SetHosts(hosts), w.want.SetHosts(hosts))
	case r < 70:
		caps := map[string]int{}
		for _, p := range diffPlatforms {
			if w.rng.IntN(2) == 0 {
				caps[p] = w.rng.IntN(4)
			}
		}
		op = fmt.Sprintf("SetNamespaceCaps(%v)", caps)
		sameSet(w.got.SetNamespaceCaps(caps), w.want.SetNamespaceCaps(caps))
	case r < 74:
		h, on := w.anyHost(), w.rng.IntN(2) == 0
		op = fmt.Sprintf("Quarantine(%s, %v)", h, on)
		same(w.got.Quarantine(h, on), w.want.Quarantine(h, on))
	case r < 78:
		req := w.task()
		op = fmt.Sprintf("Enqueue(%v)", req.Task)
		w.got.Enqueue(req)
		w.want.Enqueue(req)
	case r < 81:
		// A restarted controller restores a task that holds nothing yet.
		req := w.task()
		if _, held := w.want.Holder(req.Task); held {
			return "nothing"
		}
		h := w.anyHost()
		op = fmt.Sprintf("Restore(%v, %s, %s)", req.Task, h, req.Platform)
		w.got.Restore(req.Task, h, req.Platform)
		w.want.Restore(req.Task, h, req.Platform)
	case r < 84:
		req, h := w.task(), w.anyHost()
		op = fmt.Sprintf("Adopt(%v, %s, %s)", req.Task, h, req.Platform)
		same(w.got.Adopt(req.Task, h, req.Platform), w.want.Adopt(req.Task, h, req.Platform))
	case r < 88:
		from := w.task().Task
		to := Task{Namespace: from.Namespace, Name: fmt.Sprintf("debt/%d", w.debts)}
		w.debts++
		op = fmt.Sprintf("Transfer(%v, %v)", from, to)
		same(w.got.Transfer(from, to), w.want.Transfer(from, to))
	case r < 92:
		h := Host{Name: w.vms[w.rng.IntN(len(w.vms))], Platform: w.platform(), Capacity: 1 + w.rng.IntN(2), SingleUse: w.rng.IntN(2) == 0}
		op = fmt.Sprintf("PutHost(%+v)", h)
		same(w.got.PutHost(h), w.want.PutHost(h))
	case r < 94:
		h := Host{Name: w.vms[w.rng.IntN(len(w.vms))], Platform: w.platform(), Capacity: 1 + w.rng.IntN(2)}
		op = fmt.Sprintf("PutRetiredHost(%+v)", h)
		w.got.PutRetiredHost(h)
		w.want.PutRetiredHost(h)
	case r < 96:
		h := w.vms[w.rng.IntN(len(w.vms))]
		op = fmt.Sprintf("RetireHost(%s)", h)
		w.got.RetireHost(h)
		w.want.RetireHost(h)
	case r < 98:
		h := w.vms[w.rng.IntN(len(w.vms))]
		op = fmt.Sprintf("RemoveHost(%s)", h)
		w.got.RemoveHost(h)
		w.want.RemoveHost(h)
	default:
		p, ns := w.platform(), diffNamespaces[w.rng.IntN(len(diffNamespaces))]
		op = fmt.Sprintf("RestoreTurn(%s, %s)", p, ns)
		w.got.RestoreTurn(p, ns)
		w.want.RestoreTurn(p, ns)
	}
	w.log = append(w.log, op)
	return op
}

// compare finds the first difference between the ledgers' answers and states.
func (w *world) compare() error {
	if err := w.mismatch; err != nil {
		return err
	}
	differ := func(what string, got, want any) error { return fmt.Errorf("%s: %+v, want %+v", what, got, want) }
	if got, want := w.got.Usage(), w.want.Usage(); !slices.Equal(got, want) {
		return differ("Usage", got, want)
	}
	if got, want := w.got.Waiting(), w.want.Waiting(); !maps.Equal(got, want) {
		return differ("Waiting", got, want)
	}
	for _, p := range diffPlatforms {
		if got, want := w.got.Queue(p), w.want.Queue(p); !slices.Equal(got, want) {
			return differ("Queue "+p, got, want)
		}
		if got, want := w.got.FreeSlots(p), w.want.FreeSlots(p); got != want {
			return differ("FreeSlots "+p, got, want)
		}
		got, want := w.got.Waiters(p), w.want.Waiters(p)
		sortTasks(got)
		sortTasks(want)
		if !slices.Equal(got, want) {
			return differ("Waiters "+p, got, want)
		}
		for _, req := range w.tasks {
			if got, want := w.got.Position(p, req.Task), w.want.Position(p, req.Task); got != want {
				return differ(fmt.Sprintf("Position(%s, %v)", p, req.Task), got, want)
			}
		}
	}
	for _, req := range w.tasks {
		gh, gok := w.got.Holder(req.Task)
		wh, wok := w.want.Holder(req.Task)
		if gh != wh || gok != wok {
			return differ(fmt.Sprintf("Holder(%v)", req.Task), gh, wh)
		}
	}
	for _, h := range append(slices.Clone(w.hosts), w.vms...) {
		if got, want := w.got.HostOccupancy(h), w.want.HostOccupancy(h); got != want {
			return differ("HostOccupancy "+h, got, want)
		}
	}
	return nil
}

func sortTasks(ts []Task) {
	slices.SortFunc(ts, func(a, b Task) int { return strings.Compare(a.String(), b.String()) })
}
