package allocation

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// refLedger is the ledger as it was before its queues and hosts were indexed (commit c02993d):
// every decision recomputed from plain maps and slices, the whole platform scanned and sorted
// each time. It is slow but plainly right, so the differential test holds the indexed ledger
// to it.
type refHost struct {
	Host
	holders     map[Task]struct{}
	quarantined bool
	retired     bool
}

func (h *refHost) free() int {
	if h.quarantined || h.retired {
		return 0
	}
	return max(0, h.Capacity-len(h.holders))
}

type refWaiter struct {
	task    Task
	created time.Time
	exclude []string
}

type refLedger struct {
	mu      sync.Mutex
	hosts   map[string]*refHost
	holders map[Task]string
	queues  map[string]map[string][]*refWaiter
	caps    map[string]int
	served  map[string]map[string]uint64
	seq     uint64
}

func newRef() *refLedger {
	return &refLedger{hosts: map[string]*refHost{}, holders: map[Task]string{}, queues: map[string]map[string][]*refWaiter{},
		caps: map[string]int{}, served: map[string]map[string]uint64{}}
}

func (l *refLedger) SetNamespaceCaps(caps map[string]int) []Task {
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

func (l *refLedger) runnableEverywhere() []Task {
	var wake []Task
	for platform := range l.queues {
		wake = append(wake, l.runnable(platform)...)
	}
	return wake
}

func (l *refLedger) SetHosts(hosts []Host) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	configured := map[string]bool{}
	for _, h := range hosts {
		configured[h.Name] = true
		if s, ok := l.hosts[h.Name]; ok {
			s.Host, s.retired = h, false
			continue
		}
		l.hosts[h.Name] = &refHost{Host: h, holders: map[Task]struct{}{}}
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

func (l *refLedger) Restore(task Task, host, platform string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.hosts[host]
	if !ok {
		s = &refHost{Host: Host{Name: host, Platform: platform}, holders: map[Task]struct{}{}, retired: true}
		l.hosts[host] = s
	}
	s.holders[task] = struct{}{}
	l.holders[task] = host
	if s.SingleUse {
		s.retired = true
	}
}

func (l *refLedger) Adopt(task Task, host, platform string) bool {
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

func (l *refLedger) Enqueue(req Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.holders[req.Task]; !ok {
		l.enqueue(req)
	}
}

func (l *refLedger) Quarantine(host string, on bool) []Task {
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

func (l *refLedger) Acquire(req Request) Grant {
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

func (l *refLedger) Release(task Task) []Task {
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
		delete(l.hosts, host)
	}
	return l.runnable(s.Platform)
}

func (l *refLedger) Holder(task Task) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.holders[task]
	return h, ok
}

func (l *refLedger) Waiting() map[string]int {
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

func (l *refLedger) Usage() []Usage {
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

func (l *refLedger) reserve(task Task, host string) {
	s := l.hosts[host]
	s.holders[task] = struct{}{}
	l.holders[task] = host
	if s.SingleUse {
		s.retired = true
	}
	l.seq++
	if l.served[s.Platform] == nil {
		l.served[s.Platform] = map[string]uint64{}
	}
	l.served[s.Platform][task.Namespace] = l.seq
}

func (l *refLedger) enqueue(req Request) {
	byNS := l.queues[req.Platform]
	if byNS == nil {
		byNS = map[string][]*refWaiter{}
		l.queues[req.Platform] = byNS
	}
	q := byNS[req.Task.Namespace]
	for _, w := range q {
		if w.task == req.Task {
			w.exclude = slices.Clone(req.Exclude)
			return
		}
	}
	w := &refWaiter{task: req.Task, created: req.Created, exclude: slices.Clone(req.Exclude)}
	i := sort.Search(len(q), func(i int) bool { return refOlder(w, q[i]) })
	byNS[req.Task.Namespace] = slices.Insert(q, i, w)
}

func refOlder(a, b *refWaiter) bool {
	if !a.created.Equal(b.created) {
		return a.created.Before(b.created)
	}
	return strings.Compare(a.task.String(), b.task.String()) < 0
}

func (l *refLedger) remove(platform string, task Task) bool {
	byNS := l.queues[platform]
	q := byNS[task.Namespace]
	i := slices.IndexFunc(q, func(w *refWaiter) bool { return w.task == task })
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

func (l *refLedger) runnable(platform string) []Task {
	var out []Task
	for _, g := range l.plan(platform) {
		out = append(out, g.task)
	}
	return out
}

type refPromise struct {
	task Task
	host string
}

func (l *refLedger) plan(platform string) []refPromise {
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
	var out []refPromise
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
			if host := refPick(free, w.exclude); host != "" {
				free[host]--
				total--
				out = append(out, refPromise{w.task, host})
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

func (l *refLedger) turnOrder(platform string) []string {
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
		return refOlder(byNS[a][0], byNS[b][0])
	})
	return namespaces
}

func (l *refLedger) position(platform string, task Task) int {
	byNS := l.queues[platform]
	mine := byNS[task.Namespace]
	depth := slices.IndexFunc(mine, func(w *refWaiter) bool { return w.task == task })
	if depth < 0 {
		return 0
	}
	pos := 1
	before := true
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

func (l *refLedger) freeSlots(platform string) (map[string]int, int) {
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

func (l *refLedger) excludedEverywhere(platform string, exclude []string) bool {
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

func refPick(free map[string]int, exclude []string) string {
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

func (l *refLedger) Position(platform string, task Task) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.position(platform, task)
}

func (l *refLedger) Queue(platform string) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	byNS := l.queues[platform]
	order := l.turnOrder(platform)
	var out []Task
	for round := 0; ; round++ {
		seen := false
		for _, ns := range order {
			if ws := byNS[ns]; round < len(ws) {
				out = append(out, ws[round].task)
				seen = true
			}
		}
		if !seen {
			return out
		}
	}
}

func (l *refLedger) RestoreTurn(platform, namespace string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	if l.served[platform] == nil {
		l.served[platform] = map[string]uint64{}
	}
	l.served[platform][namespace] = l.seq
}

func (l *refLedger) Transfer(from, to Task) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	host, ok := l.holders[from]
	if !ok {
		return false
	}
	s := l.hosts[host]
	delete(l.holders, from)
	delete(s.holders, from)
	s.holders[to] = struct{}{}
	l.holders[to] = host
	return true
}

func (l *refLedger) PutHost(h Host) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	h.VM = true
	s, ok := l.hosts[h.Name]
	if !ok {
		l.hosts[h.Name] = &refHost{Host: h, holders: map[Task]struct{}{}}
		return l.runnable(h.Platform)
	}
	spent := s.SingleUse && s.retired && s.Host.VM
	s.Host = h
	s.retired = spent || (h.SingleUse && len(s.holders) > 0)
	return l.runnable(h.Platform)
}

func (l *refLedger) PutRetiredHost(h Host) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h.VM = true
	s, ok := l.hosts[h.Name]
	if !ok {
		s = &refHost{holders: map[Task]struct{}{}}
		l.hosts[h.Name] = s
	}
	s.Host, s.retired = h, true
}

func (l *refLedger) RetireHost(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.hosts[name]; ok {
		s.retired = true
	}
}

func (l *refLedger) RemoveHost(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.hosts[name]; ok {
		for t := range s.holders {
			delete(l.holders, t)
		}
		delete(l.hosts, name)
	}
}

func (l *refLedger) HostOccupancy(name string) Occupancy {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.hosts[name]
	if !ok {
		return Occupancy{}
	}
	return Occupancy{Used: len(s.holders), Open: !s.retired && !s.quarantined, Retired: s.retired, Known: true}
}

func (l *refLedger) FreeSlots(platform string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, total := l.freeSlots(platform)
	return total
}

func (l *refLedger) Waiters(platform string) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Task
	for _, q := range l.queues[platform] {
		for _, w := range q {
			out = append(out, w.task)
		}
	}
	return out
}
