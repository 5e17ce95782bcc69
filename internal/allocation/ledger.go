// Package allocation is berth's ledger of host slots and of the tasks waiting for them. It is
// plain Go: the controller tells it which hosts exist and what each task asks for, and it
// answers which host a task gets, or its place in the queue. All decisions are taken under one
// lock, so parallel reconciles can never put more tasks on a host than its concurrency.
package allocation

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Task identifies a user TaskRun.
type Task struct{ Namespace, Name string }

func (t Task) String() string { return t.Namespace + "/" + t.Name }

// Host is a static host and how many tasks it takes at once.
type Host struct {
	Name     string
	Platform string
	Capacity int
}

// Request is a task asking for a slot on its platform.
type Request struct {
	Task     Task
	Platform string
	// Created orders the queue: first created, first served.
	Created time.Time
	// Exclude are hosts the task must not get (its provisioning failed there).
	Exclude []string
}

// Grant answers a Request.
type Grant struct {
	// Host is the host reserved for the task; empty when it must wait.
	Host string
	// Held is set when the task held Host before this call: the reservation is an earlier
	// one's, and only the caller that made it may take it back when recording it fails.
	Held bool
	// Position is the task's place in its platform's queue (1 = next), when it waits.
	Position int
	// Blocked is set when no host of the platform could ever take the task: every one is
	// excluded for it. Waiting would be forever.
	Blocked bool
	// Wake are waiters ahead of the task that can be served now; reconcile them.
	Wake []Task
}

// Usage is one host's occupancy.
type Usage struct {
	Host        string
	Platform    string
	Used        int
	Capacity    int
	Quarantined bool
	Retired     bool // removed from the config; holds its tasks until they end
}

type hostState struct {
	Host
	holders     map[Task]struct{}
	quarantined bool
	retired     bool
}

func (h *hostState) free() int {
	if h.quarantined || h.retired {
		return 0
	}
	return max(0, h.Capacity-len(h.holders))
}

type waiter struct {
	task    Task
	created time.Time
	exclude []string
}

// Ledger holds slots and queues.
type Ledger struct {
	mu      sync.Mutex
	hosts   map[string]*hostState
	holders map[Task]string
	queues  map[string][]*waiter // platform → waiters, oldest first
}

// New returns an empty ledger.
func New() *Ledger {
	return &Ledger{hosts: map[string]*hostState{}, holders: map[Task]string{}, queues: map[string][]*waiter{}}
}

// SetHosts replaces the configured hosts. A host no longer configured is retired: it takes no
// new task, and goes once its last task has released it. It returns the waiters that the new
// capacity lets run.
func (l *Ledger) SetHosts(hosts []Host) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	configured := map[string]bool{}
	for _, h := range hosts {
		configured[h.Name] = true
		if s, ok := l.hosts[h.Name]; ok {
			s.Host, s.retired = h, false
			continue
		}
		l.hosts[h.Name] = &hostState{Host: h, holders: map[Task]struct{}{}}
	}
	for name, s := range l.hosts {
		if !configured[name] {
			s.retired = true
			if len(s.holders) == 0 {
				delete(l.hosts, name)
			}
		}
	}
	var wake []Task
	for platform := range l.queues {
		wake = append(wake, l.runnable(platform)...)
	}
	return wake
}

// Restore records that task holds host, as its TaskRun's labels say. It is how a restarted
// controller learns who holds what; it never refuses, even beyond capacity (the config may
// have shrunk meanwhile), because the task is already on the host.
func (l *Ledger) Restore(task Task, host, platform string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.hosts[host]
	if !ok {
		s = &hostState{Host: Host{Name: host, Platform: platform}, holders: map[Task]struct{}{}, retired: true}
		l.hosts[host] = s
	}
	s.holders[task] = struct{}{}
	l.holders[task] = host
}

// Enqueue puts a task in its platform's queue without serving it: how a restarted controller
// restores the queue from the TaskRuns labelled as waiting, before anything is allocated.
func (l *Ledger) Enqueue(req Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.holders[req.Task]; !ok {
		l.enqueue(req)
	}
}

// Quarantine takes a host out of (or back into) service; its running tasks stay.
func (l *Ledger) Quarantine(host string, on bool) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.hosts[host]
	if !ok || s.quarantined == on {
		return nil
	}
	s.quarantined = on
	if on {
		return nil
	}
	return l.runnable(s.Platform)
}

// Acquire reserves a slot for the task, or queues it. The oldest waiter of a platform is served
// first; a waiter that cannot use any free host (all excluded for it) does not hold up the ones
// behind it.
func (l *Ledger) Acquire(req Request) Grant {
	l.mu.Lock()
	defer l.mu.Unlock()
	if host, ok := l.holders[req.Task]; ok {
		return Grant{Host: host, Held: true}
	}
	l.enqueue(req)
	if l.excludedEverywhere(req.Platform, req.Exclude) {
		l.remove(req.Platform, req.Task)
		return Grant{Blocked: true}
	}
	free, total := l.freeSlots(req.Platform)
	var wake []Task
	for i, w := range l.queues[req.Platform] {
		host := ""
		if total > 0 {
			host = pick(free, w.exclude)
		}
		if w.task == req.Task {
			if host == "" {
				return Grant{Position: i + 1, Wake: wake}
			}
			l.reserve(req.Task, host)
			l.remove(req.Platform, req.Task)
			return Grant{Host: host, Wake: wake}
		}
		if host != "" {
			free[host]-- // promised to the older waiter
			total--
			wake = append(wake, w.task)
		}
	}
	return Grant{} // unreachable: the task was enqueued above
}

// Release frees the task's slot and returns the waiters that can now run. A task that held no
// slot leaves its queue instead (it finished or was deleted while waiting).
func (l *Ledger) Release(task Task) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	host, ok := l.holders[task]
	if !ok {
		for platform := range l.queues {
			if l.remove(platform, task) {
				return l.runnable(platform)
			}
		}
		return nil
	}
	delete(l.holders, task)
	s := l.hosts[host]
	delete(s.holders, task)
	if s.retired && len(s.holders) == 0 {
		delete(l.hosts, host)
	}
	return l.runnable(s.Platform)
}

// Holder returns the host the task holds.
func (l *Ledger) Holder(task Task) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.holders[task]
	return h, ok
}

// Waiting returns how many tasks wait per platform.
func (l *Ledger) Waiting() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for p, q := range l.queues {
		out[p] = len(q)
	}
	return out
}

// Usage reports every host's occupancy, sorted by name.
func (l *Ledger) Usage() []Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Usage, 0, len(l.hosts))
	for _, s := range l.hosts {
		out = append(out, Usage{Host: s.Name, Platform: s.Platform, Used: len(s.holders), Capacity: s.Capacity,
			Quarantined: s.quarantined, Retired: s.retired})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

func (l *Ledger) reserve(task Task, host string) {
	l.hosts[host].holders[task] = struct{}{}
	l.holders[task] = host
}

func (l *Ledger) enqueue(req Request) {
	q := l.queues[req.Platform]
	for _, w := range q {
		if w.task == req.Task {
			w.exclude = slices.Clone(req.Exclude)
			return
		}
	}
	w := &waiter{task: req.Task, created: req.Created, exclude: slices.Clone(req.Exclude)}
	i := sort.Search(len(q), func(i int) bool { return older(w, q[i]) })
	l.queues[req.Platform] = slices.Insert(q, i, w)
}

// older orders waiters by creation, then by name, so ties are broken the same way every time.
func older(a, b *waiter) bool {
	if !a.created.Equal(b.created) {
		return a.created.Before(b.created)
	}
	return strings.Compare(a.task.String(), b.task.String()) < 0
}

func (l *Ledger) remove(platform string, task Task) bool {
	q := l.queues[platform]
	for i, w := range q {
		if w.task == task {
			l.queues[platform] = slices.Delete(q, i, i+1)
			if len(l.queues[platform]) == 0 {
				delete(l.queues, platform)
			}
			return true
		}
	}
	return false
}

// runnable returns the waiters of a platform that free slots would serve now, oldest first.
func (l *Ledger) runnable(platform string) []Task {
	free, total := l.freeSlots(platform)
	var out []Task
	for _, w := range l.queues[platform] {
		if total == 0 {
			break
		}
		if host := pick(free, w.exclude); host != "" {
			free[host]--
			total--
			out = append(out, w.task)
		}
	}
	return out
}

// freeSlots returns the free slots per host of the platform, and their sum.
func (l *Ledger) freeSlots(platform string) (map[string]int, int) {
	free := map[string]int{}
	total := 0
	for name, s := range l.hosts {
		if s.Platform == platform {
			free[name] = s.free()
			total += free[name]
		}
	}
	return free, total
}

// excludedEverywhere tells whether every configured host of the platform is excluded.
func (l *Ledger) excludedEverywhere(platform string, exclude []string) bool {
	configured := false
	for name, s := range l.hosts {
		if s.Platform != platform || s.retired {
			continue
		}
		configured = true
		if !slices.Contains(exclude, name) {
			return false
		}
	}
	return configured
}

// pick chooses the host with the most free slots, the first by name among equals, skipping
// excluded hosts; "" if none has a free slot.
func pick(free map[string]int, exclude []string) string {
	best, bestFree := "", 0
	for name, n := range free {
		if n <= 0 || slices.Contains(exclude, name) {
			continue
		}
		if n > bestFree || (n == bestFree && name < best) {
			best, bestFree = name, n
		}
	}
	return best
}
