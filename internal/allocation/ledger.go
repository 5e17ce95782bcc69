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

// Host is a host (a static one, or a VM) and how many tasks it takes at once.
type Host struct {
	Name     string
	Platform string
	Capacity int
	// VM hosts come and go one by one (PutHost, RetireHost), not with the config (SetHosts).
	VM bool
	// SingleUse hosts serve one task in their life: the first reservation retires them.
	SingleUse bool
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
	// queues holds the waiters per platform and namespace, oldest first.
	queues map[string]map[string][]*waiter
	// caps bounds the tasks one namespace may hold per platform (absent: no bound).
	caps map[string]int
	// served remembers, per platform and namespace, when the namespace last got a slot (a
	// sequence number): the namespace served least recently goes first.
	served map[string]map[string]uint64
	seq    uint64
}

// New returns an empty ledger.
func New() *Ledger {
	return &Ledger{hosts: map[string]*hostState{}, holders: map[Task]string{}, queues: map[string]map[string][]*waiter{},
		caps: map[string]int{}, served: map[string]map[string]uint64{}}
}

// SetNamespaceCaps sets, per platform, how many tasks one namespace may hold at once (0 or
// absent: any number). It returns the waiters a raised cap lets run.
func (l *Ledger) SetNamespaceCaps(caps map[string]int) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.caps = map[string]int{}
	for p, n := range caps {
		if n > 0 {
			l.caps[p] = n
		}
	}
	return l.runnableEverywhere()
}

// runnableEverywhere returns the waiters of every platform that free slots would serve now.
func (l *Ledger) runnableEverywhere() []Task {
	var wake []Task
	for platform := range l.queues {
		wake = append(wake, l.runnable(platform)...)
	}
	return wake
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
		if !configured[name] && !s.VM {
			s.retired = true
			if len(s.holders) == 0 {
				delete(l.hosts, name)
			}
		}
	}
	return l.runnableEverywhere()
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
	if s.SingleUse {
		s.retired = true
	}
}

// Adopt records that task holds host, as a TaskRun left by another controller says, if the
// host has a free slot; it reports whether it did. Unlike Restore it never over-commits: the
// claim comes from labels a tenant can write.
func (l *Ledger) Adopt(task Task, host, platform string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.holders[task]; ok {
		return true
	}
	s, ok := l.hosts[host]
	if !ok || s.Platform != platform || s.retired || len(s.holders) >= s.Capacity {
		return false
	}
	l.reserve(task, host)
	return true
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

// Acquire reserves a slot for the task, or queues it. Waiters are served in turns of
// namespaces (see plan); a waiter that cannot use any free host (all excluded for it, or its
// namespace at its cap) does not hold up the ones behind it.
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
	var wake []Task
	host := ""
	for _, g := range l.plan(req.Platform) {
		if g.task == req.Task {
			host = g.host
		} else {
			wake = append(wake, g.task)
		}
	}
	if host == "" {
		return Grant{Position: l.position(req.Platform, req.Task), Wake: wake}
	}
	l.reserve(req.Task, host)
	l.remove(req.Platform, req.Task)
	return Grant{Host: host, Wake: wake}
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
	if s.retired && len(s.holders) == 0 && !s.VM {
		delete(l.hosts, host) // a VM stays known, closed, until its termination removes it
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
	for p, byNS := range l.queues {
		for _, q := range byNS {
			out[p] += len(q)
		}
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
	s := l.hosts[host]
	s.holders[task] = struct{}{}
	l.holders[task] = host
	if s.SingleUse {
		s.retired = true // its one task is this one
	}
	l.seq++
	if l.served[s.Platform] == nil {
		l.served[s.Platform] = map[string]uint64{}
	}
	l.served[s.Platform][task.Namespace] = l.seq
}

func (l *Ledger) enqueue(req Request) {
	byNS := l.queues[req.Platform]
	if byNS == nil {
		byNS = map[string][]*waiter{}
		l.queues[req.Platform] = byNS
	}
	q := byNS[req.Task.Namespace]
	for _, w := range q {
		if w.task == req.Task {
			w.exclude = slices.Clone(req.Exclude)
			return
		}
	}
	w := &waiter{task: req.Task, created: req.Created, exclude: slices.Clone(req.Exclude)}
	i := sort.Search(len(q), func(i int) bool { return older(w, q[i]) })
	byNS[req.Task.Namespace] = slices.Insert(q, i, w)
}

// older orders waiters by creation, then by name, so ties are broken the same way every time.
func older(a, b *waiter) bool {
	if !a.created.Equal(b.created) {
		return a.created.Before(b.created)
	}
	return strings.Compare(a.task.String(), b.task.String()) < 0
}

func (l *Ledger) remove(platform string, task Task) bool {
	byNS := l.queues[platform]
	q := byNS[task.Namespace]
	i := slices.IndexFunc(q, func(w *waiter) bool { return w.task == task })
	if i < 0 {
		return false
	}
	q = slices.Delete(q, i, i+1)
	if len(q) > 0 {
		byNS[task.Namespace] = q
		return true
	}
	delete(byNS, task.Namespace)
	if len(byNS) == 0 {
		delete(l.queues, platform)
	}
	return true
}

// runnable returns the waiters of a platform that free slots would serve now, in turn.
func (l *Ledger) runnable(platform string) []Task {
	var out []Task
	for _, g := range l.plan(platform) {
		out = append(out, g.task)
	}
	return out
}

type promise struct {
	task Task
	host string
}

// plan decides, without changing anything, which waiters of a platform the free slots serve
// now and on which hosts, in serving order. Namespaces take turns (see turnOrder), one waiter
// each per round, first created first within a namespace: one namespace that queues a
// thousand tasks delays another's next task by one turn, not by a thousand. A namespace at
// its cap is passed over until one of its tasks ends. Only the waiters up to the last free
// slot are looked at.
func (l *Ledger) plan(platform string) []promise {
	free, total := l.freeSlots(platform)
	if total == 0 || len(l.queues[platform]) == 0 {
		return nil
	}
	limit := l.caps[platform]
	var held map[string]int
	if limit > 0 {
		held = map[string]int{}
		for _, s := range l.hosts {
			if s.Platform == platform {
				for t := range s.holders {
					held[t.Namespace]++
				}
			}
		}
	}
	byNS := l.queues[platform]
	namespaces := l.turnOrder(platform)
	var out []promise
	for round := 0; total > 0; round++ {
		seen := false
		for _, ns := range namespaces {
			ws := byNS[ns]
			if round >= len(ws) {
				continue
			}
			seen = true
			if total == 0 || limit > 0 && held[ns] >= limit {
				continue
			}
			w := ws[round]
			if host := pick(free, w.exclude); host != "" {
				free[host]-- // promised to this waiter
				total--
				out = append(out, promise{w.task, host})
				if held != nil {
					held[ns]++
				}
			}
		}
		if !seen {
			break
		}
	}
	return out
}

// turnOrder lists the namespaces waiting on a platform in the order their turns come: the one
// served least recently first (never served before all others), ties by the oldest waiter.
func (l *Ledger) turnOrder(platform string) []string {
	byNS := l.queues[platform]
	namespaces := make([]string, 0, len(byNS))
	for ns := range byNS {
		namespaces = append(namespaces, ns)
	}
	served := l.served[platform]
	sort.Slice(namespaces, func(i, j int) bool {
		a, b := namespaces[i], namespaces[j]
		if served[a] != served[b] {
			return served[a] < served[b]
		}
		return older(byNS[a][0], byNS[b][0])
	})
	return namespaces
}

// position is the task's place in the serving order of its platform's waiters (1 = next).
func (l *Ledger) position(platform string, task Task) int {
	byNS := l.queues[platform]
	mine := byNS[task.Namespace]
	depth := slices.IndexFunc(mine, func(w *waiter) bool { return w.task == task })
	if depth < 0 {
		return 0
	}
	pos := 1
	before := true // namespaces ahead of the task's own in each round
	for _, ns := range l.turnOrder(platform) {
		if ns == task.Namespace {
			before = false
			pos += depth
			continue
		}
		n := len(byNS[ns])
		if before {
			pos += min(n, depth+1)
		} else {
			pos += min(n, depth)
		}
	}
	return pos
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
