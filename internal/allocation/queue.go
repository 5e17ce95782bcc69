package allocation

// A waiting task's place in line is read by more than Acquire: the controller shows it on the
// TaskRun, and `berth status` shows every queue. Both go through the ledger's own ordering
// (the turns plan follows), so what people are shown is what the ledger will do.

// Position is the task's place in its platform's queue (1 = next), 0 when it does not wait
// there.
func (l *Ledger) Position(platform string, task Task) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.platforms[platform]
	if p == nil {
		return 0
	}
	return p.position(task)
}

// Queue lists the tasks waiting on a platform in serving order: the one at index i has
// Position i+1. Namespaces take turns (see plan), first created first within a namespace; caps
// and excluded hosts, which let a waiter be passed over for a moment, are not looked at.
func (l *Ledger) Queue(platform string) []Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.platforms[platform]
	if p == nil || len(p.waiters) == 0 {
		return nil
	}
	order := p.order()
	queues := make([][]*waiter, len(order))
	for i, q := range order {
		q.waiters.each(func(w *waiter) { queues[i] = append(queues[i], w) })
	}
	out := make([]Task, 0, len(p.waiters))
	for round := 0; ; round++ {
		n := len(out)
		for _, ws := range queues {
			if round < len(ws) {
				out = append(out, ws[round].task)
			}
		}
		if len(out) == n {
			return out
		}
	}
}

// RestoreTurn records that namespace got a slot on platform after every namespace restored
// before it. A ledger rebuilt from records learns so whose turn comes first: call it in the
// order the reservations were made (a record's reservedAt).
func (l *Ledger) RestoreTurn(platform, namespace string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	p := l.platform(platform)
	p.served[namespace] = l.seq
	p.touch(namespace)
}
