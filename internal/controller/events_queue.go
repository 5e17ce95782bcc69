package controller

import (
	"slices"
	"sync"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// eventQueue holds the Events waiting for the writer, namespace by namespace, and hands them
// out taking turns by namespace (FIFO within one): a tenant whose tasks make a burst of Events
// waits behind its own, and another namespace's Event is the next but one written. It never
// blocks its caller, so client-go's broadcaster, which hands Events over, never fills its own
// channel and never drops there: all dropping is done here, by the rules of add.
type eventQueue struct {
	// total bounds what the queue holds, so that no tenant sizes it. No namespace has a bound
	// of its own: one tenant's burst (a thousand tasks queued at once) keeps every Event while
	// the queue has room, and only a full queue trims, from the namespace that holds the most.
	total int

	mu sync.Mutex
	// pending holds the namespaces with Events waiting, and no other: a namespace whose
	// last Event is taken is forgotten.
	pending map[string]*namespaceEvents
	// turns is the order the namespaces of pending take turns in; turn is the index of the
	// one whose turn is next.
	turns []string
	turn  int
	count int
	// added wakes the writer when it waits for an Event.
	added chan struct{}
}

// namespaceEvents are one namespace's waiting Events, oldest first; the first may wait for
// its not-before time, and the rest of its namespace with it.
type namespaceEvents struct {
	events []*pendingEvent
}

// pendingEvent is an Event with what its next try needs: the backoff left to it, and the
// time before which it is not tried again.
type pendingEvent struct {
	event     *eventsv1.Event
	backoff   wait.Backoff
	notBefore time.Time
}

func newEventQueue(total int) *eventQueue {
	return &eventQueue{total: total, pending: map[string]*namespaceEvents{}, added: make(chan struct{}, 1)}
}

// add queues a new Event behind the others of its namespace. When the queue is full, the
// namespace that holds the most loses its newest (the new Event itself, if that is its own
// namespace), so a flooding tenant drops its own Events and never another's, and several
// flooders end up holding about as many each.
func (q *eventQueue) add(p *pendingEvent) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ns := q.pending[p.event.Namespace]
	if q.count >= q.total {
		most := q.holdingMost()
		if ns != nil && len(ns.events) >= len(q.pending[most].events) {
			return
		}
		q.dropNewest(most)
	}
	q.put(p, false)
	select {
	case q.added <- struct{}{}:
	default:
	}
}

// requeue puts back an Event the apiserver could not take for now, first of its namespace so
// that its namespace's order holds. It had its place in the queue when it was taken; if
// others took it meanwhile, the newest of the namespace that holds the most gives way.
func (q *eventQueue) requeue(p *pendingEvent) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.count >= q.total {
		q.dropNewest(q.holdingMost())
	}
	q.put(p, true)
}

// next takes the Event whose turn it is at now: the first of the next namespace in turn
// whose first Event is due. With none due, it tells how long until the earliest is (zero
// when the queue is empty).
func (q *eventQueue) next(now time.Time) (*pendingEvent, time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var earliest time.Duration
	for i := range len(q.turns) {
		at := (q.turn + i) % len(q.turns)
		name := q.turns[at]
		ns := q.pending[name]
		first := ns.events[0]
		if wait := first.notBefore.Sub(now); wait > 0 {
			if earliest == 0 || wait < earliest {
				earliest = wait
			}
			continue
		}
		ns.events[0] = nil // the queue keeps nothing of an Event it handed out
		ns.events = ns.events[1:]
		q.count--
		q.turn = at + 1
		if len(ns.events) == 0 {
			q.forget(name, at)
		}
		if q.turn >= len(q.turns) {
			q.turn = 0
		}
		return first, 0
	}
	return nil, earliest
}

// clear forgets every waiting Event: the writer has stopped.
func (q *eventQueue) clear() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending, q.turns, q.turn, q.count = map[string]*namespaceEvents{}, nil, 0, 0
}

func (q *eventQueue) put(p *pendingEvent, first bool) {
	name := p.event.Namespace
	ns := q.pending[name]
	if ns == nil {
		ns = &namespaceEvents{}
		q.pending[name] = ns
		q.turns = append(q.turns, name)
	}
	if first {
		ns.events = slices.Insert(ns.events, 0, p)
	} else {
		ns.events = append(ns.events, p)
	}
	q.count++
}

// holdingMost names the namespace with the most Events waiting; at most total namespaces
// hold Events, so the walk is bounded.
func (q *eventQueue) holdingMost() string {
	var most string
	for _, name := range q.turns {
		if most == "" || len(q.pending[name].events) > len(q.pending[most].events) {
			most = name
		}
	}
	return most
}

func (q *eventQueue) dropNewest(name string) {
	ns := q.pending[name]
	last := len(ns.events) - 1
	ns.events[last] = nil
	ns.events = ns.events[:last]
	q.count--
	if len(ns.events) == 0 {
		q.forget(name, slices.Index(q.turns, name))
	}
}

// forget removes an emptied namespace, at index at of turns, keeping the turn where it was.
func (q *eventQueue) forget(name string, at int) {
	delete(q.pending, name)
	q.turns = slices.Delete(q.turns, at, at+1)
	if at < q.turn {
		q.turn--
	}
	if q.turn >= len(q.turns) {
		q.turn = 0
	}
}
