package allocation

import (
	"maps"
	"slices"
	"sort"
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
	// plat is the platform the host is indexed in, filed the free slots it is filed under
	// there (0: not among the free hosts).
	plat  *platform
	filed int
}

func (h *hostState) free() int {
	if h.quarantined || h.retired {
		return 0
	}
	return max(0, h.Capacity-len(h.holders))
}

// Ledger holds slots and queues.
type Ledger struct {
	mu        sync.Mutex
	hosts     map[string]*hostState
	holders   map[Task]string
	platforms map[string]*platform
	// caps bounds the tasks one namespace may hold per platform (absent: no bound).
	caps map[string]int
	// seq numbers the slots handed out: a namespace's turn is when it was last served.
	seq uint64
}

// New returns an empty ledger.
func New() *Ledger {
	return &Ledger{hosts: map[string]*hostState{}, holders: map[Task]string{}, platforms: map[string]*platform{}, caps: map[string]int{}}
}

// platform returns the platform's state, made on first use.
func (l *Ledger) platform(name string) *platform {
	p := l.platforms[name]
	if p == nil {
		p = newPlatform(name, l.caps[name])
		l.platforms[name] = p
	}
	return p
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
	for _, p := range l.platforms {
		p.limit = l.caps[p.name]
		for ns := range p.queues {
			p.touch(ns)
		}
	}
	return l.runnableEverywhere()
}

// runnableEverywhere returns the waiters of every platform that free slots would serve now.
func (l *Ledger) runnableEverywhere() []Task {
	var wake []Task
	for _, name := range slices.Sorted(maps.Keys(l.platforms)) {
		wake = append(wake, runnable(l.platforms[name])...)
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
			l.rehost(s, func() { s.Host, s.retired = h, false })
			continue
		}
		l.addHost(&hostState{Host: h, holders: map[Task]struct{}{}})
	}
	for name, s := range l.hosts {
		if !configured[name] && !s.VM {
			l.retire(s)
			if len(s.holders) == 0 {
				l.dropHost(s)
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
		l.addHost(s)
	}
	l.addHolder(s, task)
	l.holders[task] = host
	if s.SingleUse {
		l.retire(s)
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
		l.platform(req.Platform).enqueue(req)
	}
}

// Knows tells whether the task holds a slot or waits in the queue of platform.
func (l *Ledger) Knows(task Task, platform string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.knows(task, platform)
}

// knows is Knows for a caller that holds mu.
func (l *Ledger) knows(task Task, platform string) bool {
	if _, ok := l.holders[task]; ok {
		return true
	}
	p, ok := l.platforms[platform]
	if !ok {
		return false
	}
	_, waits := p.waiters[task]
	return waits
}

// Join puts a task the ledger does not know yet in its platform's queue, as Enqueue does, and
// tells whether a slot is free for it now (by the turns of plan), without reserving it: the
// task's own Acquire does. A task already waiting or holding is left as it is. This is how an
// arriving task takes its place in line the moment it is seen, before anything is written for
// it.
func (l *Ledger) Join(req Request) (canGo bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.knows(req.Task, req.Platform) {
		return false
	}
	p := l.platform(req.Platform)
	p.enqueue(req)
	return slices.Contains(runnable(p), req.Task)
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
	s.plat.refresh(s)
	if on {
		return nil
	}
	return runnable(s.plat)
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
	p := l.platform(req.Platform)
	p.enqueue(req)
	if l.excludedEverywhere(p, req.Exclude) {
		p.remove(req.Task)
		return Grant{Blocked: true}
	}
	var wake []Task
	host := ""
	for _, g := range p.plan() {
		if g.task == req.Task {
			host = g.host
		} else {
			wake = append(wake, g.task)
		}
	}
	if host == "" {
		return Grant{Position: p.position(req.Task), Wake: wake}
	}
	l.reserve(req.Task, host)
	p.remove(req.Task)
	return Grant{Host: host, Wake: wake}
}

// Release frees the task's slot and returns the waiters that can now run. A task that held no
// slot leaves its queue instead (it finished or was deleted while waiting).
func (l *Ledger) Release(task Task) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	host, ok := l.holders[task]
	if !ok {
		for _, p := range l.platforms {
			if p.remove(task) {
				return runnable(p)
			}
		}
		return nil
	}
	delete(l.holders, task)
	s := l.hosts[host]
	l.dropHolder(s, task)
	p := s.plat
	if s.retired && len(s.holders) == 0 && !s.VM {
		l.dropHost(s) // a VM stays known, closed, until its termination removes it
	}
	return runnable(p)
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
	for name, p := range l.platforms {
		if len(p.waiters) > 0 {
			out[name] = len(p.waiters)
		}
	}
	return out
}

// NamespaceCount is how many of one namespace's tasks hold a slot of one platform's hosts and
// wait for one.
type NamespaceCount struct {
	Platform, Namespace string
	Holding, Waiting    int
}

// ByNamespace counts tasks per platform and namespace; a holder for which skip is true is not
// counted (nil: every one). A pair with no task is absent. It walks the holders (at most the
// slots in service) and the waiting namespaces, never the waiters one by one.
func (l *Ledger) ByNamespace(skip func(Task) bool) []NamespaceCount {
	l.mu.Lock()
	defer l.mu.Unlock()
	type key struct{ platform, namespace string }
	at := map[key]int{}
	var out []NamespaceCount
	count := func(platform, namespace string) *NamespaceCount {
		k := key{platform, namespace}
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, NamespaceCount{Platform: platform, Namespace: namespace})
		}
		return &out[i]
	}
	for t, host := range l.holders {
		s := l.hosts[host]
		if s == nil || (skip != nil && skip(t)) {
			continue
		}
		count(s.Platform, t.Namespace).Holding++
	}
	for name, p := range l.platforms {
		for namespace, q := range p.queues {
			if n := q.waiters.Len(); n > 0 {
				count(name, namespace).Waiting += n
			}
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
	l.addHolder(s, task)
	l.holders[task] = host
	if s.SingleUse {
		l.retire(s) // its one task is this one
	}
	l.seq++
	s.plat.served[task.Namespace] = l.seq
	s.plat.touch(task.Namespace)
}

// A host's place in the indexes follows its state: addHost and dropHost file it in and out
// of its platform, rehost around a change of its configuration (which may move it to another
// platform), addHolder, dropHolder and retire as its tasks and state change.

func (l *Ledger) addHost(s *hostState) {
	l.hosts[s.Name] = s
	l.index(s)
}

func (l *Ledger) dropHost(s *hostState) {
	l.unindex(s)
	delete(l.hosts, s.Name)
}

func (l *Ledger) rehost(s *hostState, change func()) {
	l.unindex(s)
	change()
	l.index(s)
}

func (l *Ledger) index(s *hostState) {
	p := l.platform(s.Platform)
	s.plat = p
	if !s.retired {
		p.configured++
	}
	for t := range s.holders {
		p.hold(t.Namespace, 1)
	}
	p.refresh(s)
}

func (l *Ledger) unindex(s *hostState) {
	p := s.plat
	p.file(s, 0)
	if !s.retired {
		p.configured--
	}
	for t := range s.holders {
		p.hold(t.Namespace, -1)
	}
	s.plat = nil
}

func (l *Ledger) addHolder(s *hostState, task Task) {
	if _, ok := s.holders[task]; ok {
		return
	}
	s.holders[task] = struct{}{}
	s.plat.hold(task.Namespace, 1)
	s.plat.refresh(s)
}

func (l *Ledger) dropHolder(s *hostState, task Task) {
	if _, ok := s.holders[task]; !ok {
		return
	}
	delete(s.holders, task)
	s.plat.hold(task.Namespace, -1)
	s.plat.refresh(s)
}

func (l *Ledger) retire(s *hostState) {
	if s.retired {
		return
	}
	s.retired = true
	s.plat.configured--
	s.plat.refresh(s)
}

// runnable returns the waiters of a platform that free slots would serve now, in turn.
func runnable(p *platform) []Task {
	plan := p.plan()
	out := make([]Task, 0, len(plan))
	for _, g := range plan {
		out = append(out, g.task)
	}
	return out
}

// excludedEverywhere tells whether every configured host of the platform is excluded.
func (l *Ledger) excludedEverywhere(p *platform, exclude []string) bool {
	excluded := 0
	for i, name := range exclude {
		if s, ok := l.hosts[name]; ok && s.plat == p && !s.retired && !slices.Contains(exclude[:i], name) {
			excluded++
		}
	}
	return p.configured > 0 && excluded == p.configured
}
