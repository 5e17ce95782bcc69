package keyserver

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Index knows the names of the kept keys, so that a token whose name it does not know is
// refused without asking the apiserver: a flood of random tokens costs the apiserver nothing.
// It learns them from a metadata-only watch of the key Secrets in berth's namespace (names and
// labels, never a key's data: the promise that no key is cached holds), and at once from the
// Store that keeps a key in this process.
//
// What a name it does not know means depends on whether its watch is current:
//   - current (synced, and a watch is open): the key does not exist, or was made a moment
//     ago by another process and its event is still on the way. The token is refused as
//     unknown. See docs/otp.md for why a task's own token does not meet that lag.
//   - not current (before the first list, or between a watch that ended and the next one):
//     the Store waits a moment (UnsureWait) for it to be current; if it still is not, it may
//     read the name from the apiserver once, within a global budget of such reads; past it the
//     token is answered "try again".
type Index struct {
	mu    sync.RWMutex
	names map[string]keyState

	informer cache.SharedIndexInformer
	// open counts the open watches (one, or briefly two as one ends and the next begins):
	// while one is open its events reach the index in order.
	open atomic.Int32
	// unsure is the budget of apiserver reads while the index is not current.
	unsure *rate.Limiter
}

// Knowledge is what the index knows of a name.
type Knowledge int

const (
	// Unknown: no such key, as far as a current index can tell.
	Unknown Knowledge = iota
	// Known: a key of that name was kept, and the index saw no delete of it yet.
	Known
	// Unsure: the index is not current; only the apiserver can tell.
	Unsure
)

// NewIndex watches the key Secrets of namespace through cfg (whose limiter it shares with no
// other client: it is used for one list and long-lived watches). unsureReads is the budget of
// apiserver reads of names the index does not know while it is not current (per second, and
// in a burst).
func NewIndex(cfg *rest.Config, namespace string, unsureReads float64, unsureBurst int) (*Index, error) {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("a metadata client for the key index: %w", err)
	}
	secrets := mc.Resource(corev1.SchemeGroupVersion.WithResource("secrets")).Namespace(namespace)
	idx := &Index{names: map[string]keyState{}, unsure: rate.NewLimiter(rate.Limit(unsureReads), unsureBurst)}
	selector := KeyLabel + "=true"
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return secrets.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			w, err := secrets.Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return idx.track(w), nil
		},
	}
	idx.informer = cache.NewSharedIndexInformer(lw, &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
	// Kept per key: its name, what the informer needs to follow it, the record it was made for
	// and its task's namespace, and the attempt that last redeemed it (a label value and a number, both berth's own: only
	// who can write berth's namespace writes them).
	if err := idx.informer.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			kept := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
				Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}}
			for _, label := range []string{AllocationLabel, NamespaceLabel} {
				if v := m.Labels[label]; v != "" {
					if kept.Labels == nil {
						kept.Labels = map[string]string{}
					}
					kept.Labels[label] = v
				}
			}
			if attempt, ok := m.Annotations[redeemedAttemptAnnotation]; ok {
				kept.Annotations = map[string]string{redeemedAttemptAnnotation: attempt}
			}
			return kept, nil
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	if _, err := idx.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { idx.learn(obj, true) },
		UpdateFunc: func(_, obj any) { idx.learn(obj, true) },
		DeleteFunc: func(obj any) { idx.learn(obj, false) },
	}); err != nil {
		return nil, err
	}
	return idx, nil
}

func (i *Index) learn(obj any, kept bool) {
	if gone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = gone.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	if !kept {
		i.Forget(m.GetName())
		return
	}
	// An annotation that is no attempt is judged where the key is read (judge refuses it).
	redeemed, _ := strconv.Atoi(m.GetAnnotations()[redeemedAttemptAnnotation])
	i.mu.Lock()
	k := i.names[m.GetName()]
	k.record = m.GetLabels()[AllocationLabel]
	k.namespace = m.GetLabels()[NamespaceLabel]
	if redeemed > k.closed {
		k.closed, k.why = redeemed, ErrUnknown
	}
	i.names[m.GetName()] = k
	i.mu.Unlock()
}

// track passes a watch's events on and notes while it is open.
func (i *Index) track(w watch.Interface) watch.Interface {
	t := &trackedWatch{Interface: w, out: make(chan watch.Event), stopped: make(chan struct{})}
	i.open.Add(1)
	go func() {
		defer close(t.out)
		// Counted out before the reflector can see the end, so that a miss is never taken
		// for "unknown" while no watch is open.
		defer i.open.Add(-1)
		for ev := range w.ResultChan() {
			select {
			case t.out <- ev:
			case <-t.stopped:
				return
			}
		}
	}()
	return t
}

// trackedWatch is a watch whose end the index sees.
type trackedWatch struct {
	watch.Interface
	out      chan watch.Event
	stopped  chan struct{}
	stopOnce sync.Once
}

func (t *trackedWatch) ResultChan() <-chan watch.Event { return t.out }

func (t *trackedWatch) Stop() {
	t.stopOnce.Do(func() { close(t.stopped) })
	t.Interface.Stop()
}

// Start runs the watch until ctx ends.
func (i *Index) Start(ctx context.Context) error {
	i.informer.RunWithContext(ctx)
	return nil
}

// NeedLeaderElection: every replica serving redemptions needs its own index.
func (*Index) NeedLeaderElection() bool { return false }

// HasSynced tells whether the index has listed the keys once (for a readiness check).
func (i *Index) HasSynced() bool { return i.informer.HasSynced() }

// keyState is what the index knows of a kept key besides its name.
type keyState struct {
	// record is the record of the task the key was made for ("" for a key stored through
	// POST /store-key, or one whose watch event has not come yet).
	record string
	// namespace is where that task runs ("" when the key's label does not say).
	namespace string
	// closed is the last attempt of the key's TaskRun that may no longer redeem it (0: none),
	// and why: it redeemed the key, or its window passed. While its TaskRun is in that
	// attempt, a redemption of the key is refused without asking the apiserver (Redeem).
	closed int
	why    error
}

// Add records a kept key's name; the Store that keeps a key tells its index at once.
func (i *Index) Add(name string) {
	i.mu.Lock()
	if _, ok := i.names[name]; !ok {
		i.names[name] = keyState{}
	}
	i.mu.Unlock()
}

// close notes that attempts of the key's TaskRun up to attempt may no longer redeem it, and
// why; the Store tells it as it claims a key for an attempt or refuses one.
func (i *Index) close(name, record string, attempt int, why error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	k, ok := i.names[name]
	if !ok || attempt < k.closed {
		return
	}
	k.record, k.closed, k.why = record, attempt, why
	i.names[name] = k
}

// state is what the index knows of a key besides its name: its task's record and namespace,
// and the attempt of that task that may no longer redeem it, and why (closed 0 when none).
func (i *Index) state(name string) keyState {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.names[name]
}

// Forget drops a name whose key is gone.
func (i *Index) Forget(name string) {
	i.mu.Lock()
	delete(i.names, name)
	i.mu.Unlock()
}

// Knows tells what the index knows of name.
func (i *Index) Knows(name string) Knowledge {
	i.mu.RLock()
	_, known := i.names[name]
	i.mu.RUnlock()
	switch {
	case known:
		return Known
	case i.current():
		return Unknown
	default:
		return Unsure
	}
}

// mayRead spends one of the reads allowed while the index is not current.
func (i *Index) mayRead() bool { return i.unsure.Allow() }

// UnsureWait is how long a redemption that finds the index not current waits for it to become
// current before it reads from the apiserver: a watch that ended is reopened within
// milliseconds, and the first list takes about as long as listing the kept keys. Only an
// apiserver out of reach for longer makes redemptions read.
const UnsureWait = 2 * time.Second

// awaitCurrent waits up to UnsureWait for the index to be current, and tells whether it is.
func (i *Index) awaitCurrent(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, UnsureWait)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !i.current() {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

func (i *Index) current() bool { return i.informer.HasSynced() && i.open.Load() > 0 }

// Len is how many names the index holds.
func (i *Index) Len() int {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return len(i.names)
}
