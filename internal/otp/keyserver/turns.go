package keyserver

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// Turns shares the redemptions that reach the apiserver among the namespaces of the tasks whose
// tokens they carry. At most limit are under way at once; while a slot is free a redemption
// takes it at once, so a single tenant's burst uses every slot and waits for none. When none is
// free, redemptions wait in a line of their namespace, and each slot given back goes to the
// next namespace in turn, not to the longest line: a tenant that floods the server with
// redemptions of its own tasks' tokens delays a redemption of another namespace by at most one
// redemption's time, never refuses it.
//
// What a request costs before it gets here is bounded elsewhere: its body by the per-source
// limits (Limiter) and the server's read timeout, a token the index does not know or one a
// closed attempt may not redeem by memory alone (Store.Redeem answers those without a turn).
// The namespace is berth's own record of where the key's task runs (a label berth wrote on a
// Secret of its own namespace), never what a request says.
type Turns struct {
	limit int
	wait  time.Duration

	mu      sync.Mutex
	running int
	lines   map[string]*line
	order   *list.List // of *line: the namespaces with someone waiting, next in front
}

type line struct {
	namespace string
	waiters   *list.List // of chan struct{}: closed when a slot is handed over
	at        *list.Element
}

// DefaultTurnWait is how long a redemption waits for a slot before it is answered "try again":
// a third of the server's write timeout, leaving the rest for the redemption's own apiserver
// requests (each bounded by the client's), so that the client hears an answer rather than a cut
// connection. A redemption takes a few milliseconds of the apiserver's time, so with every slot
// taken a namespace's turn comes within a few slots' time; a wait of seconds means the
// apiserver itself is slow.
const DefaultTurnWait = writeTimeout / 3

// ErrCrowded: every slot stayed taken for as long as a redemption may wait; nothing was decided
// about the token.
var ErrCrowded = errors.New("the key server is serving as many redemptions as it may at once and this one waited too long for its turn; try again after the time Retry-After says")

// NewTurns shares limit slots (Limits.Concurrency; its default when zero or less); a
// redemption waits at most wait for one (DefaultTurnWait when zero or less).
func NewTurns(limit int, wait time.Duration) *Turns {
	if limit <= 0 {
		limit = DefaultLimits().Concurrency
	}
	if wait <= 0 {
		wait = DefaultTurnWait
	}
	return &Turns{limit: limit, wait: wait, lines: map[string]*line{}, order: list.New()}
}

// Take waits for a slot for a redemption of namespace's task and returns what gives it back.
// It fails with ErrCrowded past the wait, or with ctx's error.
func (t *Turns) Take(ctx context.Context, namespace string) (release func(), err error) {
	t.mu.Lock()
	if t.running < t.limit && t.order.Len() == 0 {
		t.running++
		t.mu.Unlock()
		return t.giveBack(), nil
	}
	l := t.lines[namespace]
	if l == nil {
		l = &line{namespace: namespace, waiters: list.New()}
		t.lines[namespace] = l
		l.at = t.order.PushBack(l)
	}
	handed := make(chan struct{})
	me := l.waiters.PushBack(handed)
	t.mu.Unlock()
	turnWaits.Inc()

	timer := time.NewTimer(t.wait)
	defer timer.Stop()
	select {
	case <-handed:
		return t.giveBack(), nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = ErrCrowded
	}
	t.mu.Lock()
	select {
	case <-handed:
		// Handed over as the wait ended: the slot is this request's to give back.
		t.mu.Unlock()
		t.giveBack()()
		return nil, err
	default:
	}
	l.waiters.Remove(me)
	t.drop(l)
	t.mu.Unlock()
	return nil, err
}

// giveBack is the release of one slot: it goes to the first waiter of the namespace whose turn
// is next, which then moves to the back of the order, or back to the pool when none waits.
func (t *Turns) giveBack() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			front := t.order.Front()
			if front == nil {
				t.running--
				return
			}
			l := front.Value.(*line)
			close(l.waiters.Remove(l.waiters.Front()).(chan struct{}))
			t.order.MoveToBack(front)
			t.drop(l)
		})
	}
}

// drop forgets a namespace's line once nobody waits in it, so that only waiting namespaces are
// held: a tenant cycling through namespaces leaves nothing behind.
func (t *Turns) drop(l *line) {
	if l.waiters.Len() == 0 {
		t.order.Remove(l.at)
		delete(t.lines, l.namespace)
	}
}

// Waiting is how many redemptions wait for a slot, and of how many namespaces.
func (t *Turns) Waiting() (redemptions, namespaces int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range t.lines {
		redemptions += l.waiters.Len()
	}
	return redemptions, len(t.lines)
}
