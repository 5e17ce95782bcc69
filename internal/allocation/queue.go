package allocation

// A waiting task's place in line is read by more than Acquire: the controller shows it on the
// TaskRun, and `berth status` shows every queue. Both go through the ledger's own ordering
// (turnOrder, position), so what people are shown is what the ledger will do.

// Position is the task's place in its platform's queue (1 = next), 0 when it does not wait
// there.
func (l *Ledger) Position(platform string, task Task) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.position(platform, task)
}

// Queue lists the tasks waiting on a platform in serving order: the one at index i has
// Position i+1. Namespaces take turns (see plan), first created first within a namespace; caps
// and excluded hosts, which let a waiter be passed over for a moment, are not looked at.
func (l *Ledger) Queue(platform string) []Task {
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

// RestoreTurn records that namespace got a slot on platform after every namespace restored
// before it. A ledger rebuilt from records learns so whose turn comes first: call it in the
// order the reservations were made (a record's reservedAt).
func (l *Ledger) RestoreTurn(platform, namespace string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	if l.served[platform] == nil {
		l.served[platform] = map[string]uint64{}
	}
	l.served[platform][namespace] = l.seq
}
