package allocation

// Transfer hands the slot that from holds to to, without freeing it in between: how a task
// that has ended leaves its slot to the cleanup it still owes the host, so nobody else gets
// the slot before the build user is gone. It reports whether it moved a slot: not when from
// holds none, nor when to holds one already (a transfer done before: from may hold a slot
// again by then, of a new TaskRun of the same name, which is not to be taken).
func (l *Ledger) Transfer(from, to Task) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	host, ok := l.holders[from]
	if _, taken := l.holders[to]; !ok || taken {
		return false
	}
	s := l.hosts[host]
	delete(l.holders, from)
	l.dropHolder(s, from)
	l.addHolder(s, to)
	l.holders[to] = host
	return true
}
