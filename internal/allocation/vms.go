package allocation

// VM hosts enter the ledger one by one, when berth has logged in to them, and leave when
// they are retired and free. A single-use VM takes its one task and is retired by that.

// PutHost adds a VM host, or updates it, and returns the waiters it lets run. A single-use VM
// that already held a task (restored from the records) stays retired.
func (l *Ledger) PutHost(h Host) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	h.VM = true
	s, ok := l.hosts[h.Name]
	if !ok {
		l.addHost(&hostState{Host: h, holders: map[Task]struct{}{}})
		return runnable(l.platforms[h.Platform])
	}
	spent := s.SingleUse && s.retired && s.Host.VM
	l.rehost(s, func() { s.Host, s.retired = h, spent || (h.SingleUse && len(s.holders) > 0) })
	return runnable(l.platforms[h.Platform])
}

// PutRetiredHost adds a VM host that takes no new task, or closes a known one, and keeps it
// known (closed) until RemoveHost, whoever releases it. A restarted controller learns so of a
// VM retired before it stopped: its tasks' records may be gone, so nothing else would put it
// back, and a VM the ledger does not know is never seen free, so never terminated.
func (l *Ledger) PutRetiredHost(h Host) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h.VM = true
	if s, ok := l.hosts[h.Name]; ok {
		l.rehost(s, func() { s.Host, s.retired = h, true })
		return
	}
	l.addHost(&hostState{Host: h, holders: map[Task]struct{}{}, retired: true})
}

// RetireHost stops a VM taking new tasks; its tasks stay until they release it.
func (l *Ledger) RetireHost(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.hosts[name]; ok {
		l.retire(s)
	}
}

// RemoveHost forgets a terminated VM, with whatever still held it.
func (l *Ledger) RemoveHost(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.hosts[name]; ok {
		for t := range s.holders {
			delete(l.holders, t)
		}
		l.dropHost(s)
	}
}

// Occupancy is one host's state in the ledger.
type Occupancy struct {
	Used int
	// Open hosts take new tasks; Retired ones never will again.
	Open, Retired, Known bool
}

// HostOccupancy reports how the ledger sees one host.
func (l *Ledger) HostOccupancy(name string) Occupancy {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.hosts[name]
	if !ok {
		return Occupancy{}
	}
	return Occupancy{Used: len(s.holders), Open: !s.retired && !s.quarantined, Retired: s.retired, Known: true}
}

// FreeSlots is how many tasks the platform's open hosts can take now.
func (l *Ledger) FreeSlots(platform string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.platforms[platform]; p != nil {
		return p.slots
	}
	return 0
}

// Waiters lists the tasks waiting on a platform.
func (l *Ledger) Waiters(platform string) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Task
	if p := l.platforms[platform]; p != nil {
		for task := range p.waiters {
			out = append(out, task)
		}
	}
	return out
}
