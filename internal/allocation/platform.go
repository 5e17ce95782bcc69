package allocation

import (
	"slices"
	"time"
)

// platform is one platform's share of the ledger, indexed so that a decision looks at what
// it needs and nothing else: the hosts with a free slot in the order pick takes them, the
// namespaces that may be served in the order of their turns, and every namespace's queue.
type platform struct {
	name string
	// limit is the namespace cap (0: none).
	limit int

	// free holds the hosts with a free slot, most free slots first, then by name; slots is
	// their sum. configured counts the hosts not retired (quarantined or not).
	free       tree[*hostState]
	slots      int
	configured int

	waiters map[Task]*waiter
	// queues holds the namespaces that wait, each with its waiters oldest first.
	queues map[string]*queue
	// ready holds the waiting namespaces below their cap in the order of their turns.
	ready tree[*queue]
	// lengths files every waiting namespace by its queue's length, for positions.
	lengths lengthIndex
	// dirty are the queues changed since they were last filed in ready and lengths.
	dirty []*queue

	// held counts the tasks on the platform's hosts per namespace (retired and quarantined
	// hosts too): what the cap bounds.
	held map[string]int
	// served remembers when each namespace last got a slot (the ledger's sequence number).
	served map[string]uint64
}

func newPlatform(name string, limit int) *platform {
	return &platform{name: name, limit: limit, waiters: map[Task]*waiter{}, queues: map[string]*queue{},
		held: map[string]int{}, served: map[string]uint64{}}
}

type waiter struct {
	task    Task
	name    string // task.String(), the last tie-break of the order
	created time.Time
	exclude []string
}

// before orders waiters by creation, then by name, so ties are broken the same way every time.
func (w *waiter) before(o *waiter) bool {
	if !w.created.Equal(o.created) {
		return w.created.Before(o.created)
	}
	return w.name < o.name
}

// queue is one namespace's waiters on a platform.
type queue struct {
	namespace string
	waiters   tree[*waiter]
	// filed is the turn the queue is filed under in ready and lengths, length the length it
	// is filed under in lengths (0: not filed).
	filed  turn
	length int
	ready  bool
	dirty  bool
}

// turn is a namespace's place in the turns: the one served least recently first (never
// served before all others), ties by the oldest waiter.
type turn struct {
	served uint64
	head   *waiter
}

func (q *queue) before(o *queue) bool {
	if q.filed.served != o.filed.served {
		return q.filed.served < o.filed.served
	}
	return q.filed.head.before(o.filed.head)
}

// before orders hosts as pick prefers them: most free slots first, then by name.
func (h *hostState) before(o *hostState) bool {
	if h.filed != o.filed {
		return h.filed > o.filed
	}
	return h.Name < o.Name
}

// file puts the host in the free hosts under n free slots (none: out of them).
func (p *platform) file(h *hostState, n int) {
	if h.filed > 0 {
		p.free.delete(h)
		p.slots -= h.filed
	}
	h.filed = n
	if n > 0 {
		p.free.insert(h)
		p.slots += n
	}
}

// refresh files the host under its free slots, after its holders or its state changed.
func (p *platform) refresh(h *hostState) { p.file(h, h.free()) }

// pick chooses the host with the most free slots, the first by name among equals, skipping
// excluded hosts; nil if none has a free slot. Only excluded hosts are passed over, so it
// looks at no more than len(exclude)+1 hosts.
func (p *platform) pick(exclude []string) *hostState {
	for i := range p.free.Len() {
		if h := p.free.at(i); !slices.Contains(exclude, h.Name) {
			return h
		}
	}
	return nil
}

// hold counts n more (or fewer) tasks of namespace on the platform's hosts.
func (p *platform) hold(namespace string, n int) {
	if p.held[namespace] += n; p.held[namespace] == 0 {
		delete(p.held, namespace)
	}
	p.touch(namespace)
}

// touch notes that the namespace's turn, queue or cap may have changed; settle refiles it.
func (p *platform) touch(namespace string) {
	if q := p.queues[namespace]; q != nil && !q.dirty {
		q.dirty = true
		p.dirty = append(p.dirty, q)
	}
}

// settle refiles the queues changed since the last decision. Every change of a queue, a
// namespace's turn or what it holds marks the queue, and what reads ready or lengths settles
// first: a decision that changes one namespace costs one refiling, however many changes.
func (p *platform) settle() {
	for _, q := range p.dirty {
		p.refile(q)
	}
	clear(p.dirty)
	p.dirty = p.dirty[:0]
}

func (p *platform) refile(q *queue) {
	q.dirty = false
	n := q.waiters.Len()
	var now turn
	if n > 0 {
		now = turn{served: p.served[q.namespace], head: q.waiters.at(0)}
	}
	ready := n > 0 && (p.limit == 0 || p.held[q.namespace] < p.limit)
	moved := now != q.filed
	if q.ready && (moved || !ready) {
		p.ready.delete(q)
		q.ready = false
	}
	switch {
	case q.length > 0 && (moved || n == 0):
		p.lengths.remove(q, q.length)
		q.length = 0
	case q.length > 0 && n != q.length:
		p.lengths.resize(q, q.length, n)
		q.length = n
	}
	q.filed = now
	if ready && !q.ready {
		p.ready.insert(q)
		q.ready = true
	}
	if n > 0 && q.length == 0 {
		p.lengths.add(q, n)
		q.length = n
	}
	if n == 0 {
		delete(p.queues, q.namespace)
	}
}

func (p *platform) enqueue(req Request) {
	if w, ok := p.waiters[req.Task]; ok {
		w.exclude = slices.Clone(req.Exclude)
		return
	}
	w := &waiter{task: req.Task, name: req.Task.String(), created: req.Created, exclude: slices.Clone(req.Exclude)}
	q := p.queues[req.Task.Namespace]
	if q == nil {
		q = &queue{namespace: req.Task.Namespace}
		p.queues[req.Task.Namespace] = q
	}
	q.waiters.insert(w)
	p.waiters[req.Task] = w
	p.touch(req.Task.Namespace)
}

func (p *platform) remove(task Task) bool {
	w, ok := p.waiters[task]
	if !ok {
		return false
	}
	delete(p.waiters, task)
	p.queues[task.Namespace].waiters.delete(w)
	p.touch(task.Namespace)
	return true
}

type promise struct {
	task Task
	host string
}

// plan decides, without changing anything, which waiters the free slots serve now and on
// which hosts, in serving order. Namespaces take turns (see turn), one waiter each per round,
// first created first within a namespace: one namespace that queues a thousand tasks delays
// another's next task by one turn, not by a thousand. A namespace at its cap is passed over
// until one of its tasks ends; one that reaches it during the plan leaves the rounds.
//
// Only namespaces that may be served are looked at (ready), and only until the free slots
// are promised: a plan that promises F slots costs O((F + X) log n), where X counts the
// waiters passed over because every free host is excluded for them.
func (p *platform) plan() []promise {
	p.settle()
	if p.slots == 0 || p.ready.Len() == 0 {
		return nil
	}
	type inTurn struct {
		q    *queue
		held int // with the slots promised in this plan
	}
	var (
		out      = make([]promise, 0, min(p.slots, len(p.waiters)))
		left     = p.slots
		next     []inTurn
		buf      [4]*hostState
		promised = buf[:0] // hosts whose slots are promised, filed under what is left
	)
	// serve offers the namespace's round-th waiter a slot and tells whether the namespace
	// takes part in the next round.
	serve := func(t *inTurn, round int) bool {
		w := t.q.waiters.at(round)
		if h := p.pick(w.exclude); h != nil {
			p.file(h, h.filed-1)
			promised = append(promised, h)
			left--
			out = append(out, promise{w.task, h.Name})
			t.held++
		}
		return left > 0 && t.q.waiters.Len() > round+1 && (p.limit == 0 || t.held < p.limit)
	}
	for i := 0; i < p.ready.Len() && left > 0; i++ {
		t := inTurn{q: p.ready.at(i)}
		t.held = p.held[t.q.namespace]
		if serve(&t, 0) {
			next = append(next, t)
		}
	}
	for round := 1; left > 0 && len(next) > 0; round++ {
		stay := next[:0]
		for i := range next {
			if left > 0 && serve(&next[i], round) {
				stay = append(stay, next[i])
			}
		}
		next = stay
	}
	for _, h := range promised {
		p.refresh(h)
	}
	return out
}

// position is the task's place in the serving order of the platform's waiters (1 = next),
// caps and excluded hosts not looked at: every namespace has min(its length, depth) waiters
// in the rounds before the task's, and in the task's round those before its namespace that
// have more than depth waiters go first. O(log L + log Lmax · log N) (see lengthIndex).
func (p *platform) position(task Task) int {
	w, ok := p.waiters[task]
	if !ok {
		return 0
	}
	p.settle()
	q := p.queues[task.Namespace]
	depth := q.waiters.rank(w)
	short, shortWaiters, aheadShort := p.lengths.upTo(q, depth)
	ahead := p.lengths.ahead(q)
	return 1 + shortWaiters + depth*(len(p.queues)-short) + ahead - aheadShort
}

// order lists the waiting namespaces in the order of their turns.
func (p *platform) order() []*queue {
	p.settle()
	out := make([]*queue, 0, len(p.queues))
	p.lengths.each(func(q *queue) { out = append(out, q) })
	return out
}

// lengthIndex files the waiting namespaces of a platform by the length of their queues, for
// positions: a Fenwick tree over lengths 1..top whose node i keeps, in the order of their
// turns, the namespaces whose length is in (i - i&-i, i], and the sum of those lengths. So
// "how many namespaces have at most d waiters, with how many waiters, and how many of them
// come before mine" is read from O(log Lmax) nodes, each answering in O(log N): a position
// costs O(log Lmax · log N). That is counting the points of a changing set below a corner in
// two dimensions, turn and length, for which O(log n) is out of reach in general (the known
// lower bound is (log n / log log n)²). A queue that grows or shrinks by one moves between the
// few nodes where the chains of its old and new length differ; a namespace whose turn moves
// (served) is refiled in all O(log Lmax) of its nodes.
type lengthIndex struct {
	nodes []tree[*queue]
	sums  []int
}

// top is the largest length the index holds, a power of two: every node's chain ends there,
// so node top holds every namespace.
func (x *lengthIndex) top() int { return len(x.nodes) - 1 }

func (x *lengthIndex) add(q *queue, n int) {
	x.fit(n)
	for i := n; i <= x.top(); i += i & -i {
		x.nodes[i].insert(q)
		x.sums[i] += n
	}
}

func (x *lengthIndex) remove(q *queue, n int) {
	for i := n; i <= x.top(); i += i & -i {
		x.nodes[i].delete(q)
		x.sums[i] -= n
	}
}

// resize moves a queue filed under length a to length b, its turn unchanged.
func (x *lengthIndex) resize(q *queue, a, b int) {
	x.fit(b)
	i, j := a, b
	for i != j {
		if i < j {
			x.nodes[i].delete(q)
			x.sums[i] -= a
			i += i & -i
		} else {
			x.nodes[j].insert(q)
			x.sums[j] += b
			j += j & -j
		}
	}
	for ; i <= x.top(); i += i & -i {
		x.sums[i] += b - a // the chains met: the nodes from here on keep the queue
	}
}

// fit grows the index to hold length n, refiling what it holds.
func (x *lengthIndex) fit(n int) {
	if n <= x.top() {
		return
	}
	var filed []*queue
	if x.top() > 0 {
		x.nodes[x.top()].each(func(q *queue) { filed = append(filed, q) })
	}
	top := 16
	for top < n {
		top *= 2
	}
	x.nodes, x.sums = make([]tree[*queue], top+1), make([]int, top+1)
	for _, q := range filed {
		x.add(q, q.length)
	}
}

// upTo counts the namespaces with at most d waiters, their waiters, and those of them whose
// turn comes before q's.
func (x *lengthIndex) upTo(q *queue, d int) (namespaces, waiters, before int) {
	for i := min(d, x.top()); i > 0; i -= i & -i {
		namespaces += x.nodes[i].Len()
		waiters += x.sums[i]
		before += x.nodes[i].rank(q)
	}
	return namespaces, waiters, before
}

// ahead counts the namespaces whose turn comes before q's.
func (x *lengthIndex) ahead(q *queue) int { return x.nodes[x.top()].rank(q) }

// each calls f with every namespace in the order of their turns.
func (x *lengthIndex) each(f func(*queue)) {
	if x.top() > 0 {
		x.nodes[x.top()].each(f)
	}
}
