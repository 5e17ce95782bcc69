// Package capacity is the one owner of what berth can hand out: the ledger of hosts, slots,
// namespace caps and lines (package allocation), and the wake-ups that tell a TaskRun its
// turn came. Whatever frees capacity here wakes the tasks that can go on by itself, so no
// controller pairs a release with a wake-up, and the task and host controllers depend on this
// package, never on each other.
package capacity

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
)

// ledger is embedded unexported: its reads and the moves that free nothing are Capacity's
// own, and the moves that free something are shadowed by Capacity's, which wake.
type ledger = allocation.Ledger

// Capacity is the ledger with its wake-ups.
type Capacity struct {
	*ledger
	wakeups chan event.TypedGenericEvent[allocation.Task]
	// jobEnds carries the ends of host jobs (Notify) apart from the other wake-ups, so the task
	// controller can queue them first (JobEnds).
	jobEnds  chan event.TypedGenericEvent[allocation.Task]
	restored atomic.Bool

	// pending holds the tasks woken whose reconcile has not started yet (Reconciling): a
	// wake-up of one of them is already on its way, and the work queue would fold a second
	// into it. Every freed slot and every reservation names all the tasks that can go now (as
	// many as there are free slots), so without it the same tasks were sent again for each,
	// through the channel, the event handler and the queue's lock, before the queue folded
	// them. Each task in it has a reconcile on its way, which takes it out.
	mu      sync.Mutex
	pending map[allocation.Task]struct{}
}

// wakeBuffer is how many wake-ups wait in the channel before a sender hands its own to a
// goroutine; a burst of releases never blocks the caller and never loses one.
const wakeBuffer = 4096

// New is an empty ledger: no hosts, no lines.
func New() *Capacity {
	return &Capacity{ledger: allocation.New(),
		wakeups: make(chan event.TypedGenericEvent[allocation.Task], wakeBuffer),
		jobEnds: make(chan event.TypedGenericEvent[allocation.Task], wakeBuffer),
		pending: map[allocation.Task]struct{}{}}
}

// DebtPrefix starts the ledger name of a cleanup debt: a build user still to be removed,
// holding its slot. Its clean's end, not a wake-up, moves it on; the "/" keeps the name apart
// from every TaskRun's.
const DebtPrefix = "debt/"

// IsDebt tells whether a ledger task is a cleanup debt, not a TaskRun.
func IsDebt(t allocation.Task) bool { return strings.HasPrefix(t.Name, DebtPrefix) }

// Wake reconciles the TaskRuns now: a freed slot or a VM that became ready reaches its task
// this way, not by polling (an ended host job by Notify). It never blocks and never drops one:
// a task already woken and not yet reconciled is not sent again, since the reconcile to come
// reads the ledger as it is then. One lock for the whole call: a release names up to as many
// tasks as there are free slots.
func (c *Capacity) Wake(tasks ...allocation.Task) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range tasks {
		if _, sent := c.pending[t]; sent || IsDebt(t) {
			continue
		}
		c.pending[t] = struct{}{}
		sendTo(c.wakeups, t) // never blocks
	}
}

// Reconciling is the task controller's word that a reconcile of t starts, before it reads the
// ledger: a wake-up from now on is sent again, for what changes after that read.
func (c *Capacity) Reconciling(t allocation.Task) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, t)
}

// sendTo puts the task on ch without blocking: when ch is full, a goroutine waits to send it.
func sendTo(ch chan event.TypedGenericEvent[allocation.Task], t allocation.Task) {
	ev := event.TypedGenericEvent[allocation.Task]{Object: t}
	select {
	case ch <- ev:
	default:
		go func() { ch <- ev }()
	}
}

// Notify wakes the task of key, "namespace/name": the provisioner's way back when a host job
// of the task ended (a provision.Notifier). It never blocks and never drops one.
func (c *Capacity) Notify(key string) {
	ns, name, _ := strings.Cut(key, "/")
	sendTo(c.jobEnds, allocation.Task{Namespace: ns, Name: name})
}

// WakeWaiters wakes every task waiting for the platform (capacity of it came or went).
func (c *Capacity) WakeWaiters(platform string) { c.Wake(c.ledger.Waiters(platform)...) }

// Acquire reserves a host for the request or puts it in line; a reservation that lets other
// tasks go (a place freed by a task leaving the line) wakes them.
func (c *Capacity) Acquire(req allocation.Request) allocation.Grant {
	g := c.ledger.Acquire(req)
	c.Wake(g.Wake...)
	return g
}

// Release frees what the task held or drops it from its line, and wakes whoever can go now.
func (c *Capacity) Release(task allocation.Task) { c.Wake(c.ledger.Release(task)...) }

// Quarantine takes the host out of service (on) or puts it back, waking who can go now.
func (c *Capacity) Quarantine(host string, on bool) { c.Wake(c.ledger.Quarantine(host, on)...) }

// PutHost adds or updates one host (a VM), waking who can go now.
func (c *Capacity) PutHost(h allocation.Host) { c.Wake(c.ledger.PutHost(h)...) }

// SetHosts replaces the static hosts (a config change), waking who can go now.
func (c *Capacity) SetHosts(hosts []allocation.Host) { c.Wake(c.ledger.SetHosts(hosts)...) }

// SetNamespaceCaps replaces the per-namespace caps, waking who can go now.
func (c *Capacity) SetNamespaceCaps(caps map[string]int) {
	c.Wake(c.ledger.SetNamespaceCaps(caps)...)
}

// Follow takes a host's record into the ledger: a drained or quarantined host takes no new
// task; one back in service wakes who can go now.
func (c *Capacity) Follow(bh *berthv1.BuildHost) {
	c.Quarantine(bh.Host(), bh.Spec.Drained || bh.Status.Quarantined)
}

// MarkRestored says the ledger now holds what the records say (after a start); until then no
// controller may decide from it.
func (c *Capacity) MarkRestored() { c.restored.Store(true) }

// Restored tells whether the ledger has been rebuilt from the records.
func (c *Capacity) Restored() bool { return c.restored.Load() }

// Source delivers the wake-ups to the task controller, each queued at priority: what passes a
// slot on goes before arrivals that only join the line.
func (c *Capacity) Source(priority int) source.Source { return sourceOf(c.wakeups, priority) }

// JobEnds delivers the ends of host jobs (Notify) to the task controller, each queued at
// priority: a build user made or removed is work half done (its secret to hand over, its slot
// to free), which goes before any new work is started.
func (c *Capacity) JobEnds(priority int) source.Source { return sourceOf(c.jobEnds, priority) }

func sourceOf(ch chan event.TypedGenericEvent[allocation.Task], priority int) source.Source {
	return source.Channel(ch, handler.TypedFuncs[allocation.Task, reconcile.Request]{
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[allocation.Task], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			AddAt(q, types.NamespacedName{Namespace: e.Object.Namespace, Name: e.Object.Name}, priority)
		},
	})
}

// AddAt queues the reconcile of name at priority, on a queue that has priorities.
func AddAt(q workqueue.TypedRateLimitingInterface[reconcile.Request], name types.NamespacedName, priority int) {
	req := reconcile.Request{NamespacedName: name}
	if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
		pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(priority)}, req)
		return
	}
	q.Add(req)
}
