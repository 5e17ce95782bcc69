package allocation

// Transfer hands the slot that from holds to to, without freeing it in between: how a task
// that has ended leaves its slot to the cleanup it still owes the host, so nobody else gets
// the slot before the build user is gone. It reports whether from held a slot.
func (l *Ledger) Transfer(from, to Task) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	host, ok := l.holders[from]
	if !ok {
		return false
	}
	s := l.hosts[host]
	delete(l.holders, from)
	l.dropHolder(s, from)
	l.addHolder(s, to)
	l.holders[to] = host
	return true
}
