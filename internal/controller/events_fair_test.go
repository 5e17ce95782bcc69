package controller

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	testingclock "k8s.io/utils/clock/testing"
)

// answeringSink is an eventCreator that answers each Create with what answer says of its
// Event (nil: written), and records every try and every Event written, in order.
type answeringSink struct {
	answer  func(*eventsv1.Event) error
	tries   []string
	written []string
}

func (s *answeringSink) Create(_ context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	s.tries = append(s.tries, e.Name)
	var err error
	if s.answer != nil {
		err = s.answer(e)
	}
	if err != nil {
		return nil, err
	}
	s.written = append(s.written, e.Name)
	return e, nil
}

// fairWriter is a writer on a fake clock that a test drives one write at a time (writeNext),
// with the production bounds and the production backoff without its jitter.
func fairWriter(s *answeringSink) (*eventWriter, *testingclock.FakeClock) {
	fake := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	retries := eventRetries
	retries.Jitter = 0
	return &eventWriter{sink: s, retries: retries, clock: fake, queue: newEventQueue(eventsQueued), log: logr.Discard()}, fake
}

func queueEvent(w *eventWriter, namespace, name string) {
	e := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Reason: "Waiting"}
	w.queue.add(&pendingEvent{event: e, backoff: w.retries})
}

// writesUntil lets the writer make writes until name is written, at most limit tries, and
// tells how many tries that took (limit+1 if it never was).
func writesUntil(t *testing.T, w *eventWriter, s *answeringSink, name string, limit int) int {
	t.Helper()
	for len(s.tries) < limit {
		if w.writeNext(context.Background()) >= 0 {
			t.Fatalf("after %d tries nothing was due, and %s was not written", len(s.tries), name)
		}
		if slices.Contains(s.written, name) {
			return len(s.tries)
		}
	}
	return limit + 1
}

func TestABurstOfOneNamespaceDelaysAnotherByOneWriteAtMost(t *testing.T) {
	s := &answeringSink{}
	w, _ := fairWriter(s)
	for i := range 3000 {
		queueEvent(w, "a", fmt.Sprintf("a-%d", i))
	}
	queueEvent(w, "b", "b-0")
	if n := writesUntil(t, w, s, "b-0", 2); n > 2 {
		t.Fatalf("b's Event was not among the next two writes after it was queued behind a's 3,000: %v", s.written)
	}
	// a alone filled the queue: it keeps its oldest, all but the one that made room for b,
	// and all of it is written.
	for w.writeNext(context.Background()) < 0 {
	}
	kept := eventsQueued - 1
	if len(s.written) != kept+1 || s.written[0] != "a-0" || s.written[len(s.written)-1] != fmt.Sprintf("a-%d", kept-1) {
		t.Errorf("written %d Events, first %s, last %s; want a's first %d and b's", len(s.written), s.written[0], s.written[len(s.written)-1], kept)
	}
}

func TestAThrottledNamespaceDoesNotHoldOthers(t *testing.T) {
	throttled := apierrors.NewTooManyRequests("slow down", 1)
	s := &answeringSink{answer: func(e *eventsv1.Event) error {
		if e.Namespace == "a" {
			return throttled
		}
		return nil
	}}
	w, fake := fairWriter(s)
	queueEvent(w, "a", "a-0")
	queueEvent(w, "a", "a-1")
	queueEvent(w, "b", "b-0")
	if n := writesUntil(t, w, s, "b-0", 2); n > 2 {
		t.Fatalf("tries %v: b's Event waited for a's throttled one", s.tries)
	}
	// a waits for its Retry-After, with its later Event behind it; the writer is free.
	wait := w.writeNext(context.Background())
	if wait <= 0 || len(s.tries) != 2 {
		t.Fatalf("with a throttled: told %v after tries %v, want a wait and no try", wait, s.tries)
	}
	queueEvent(w, "b", "b-1")
	if n := writesUntil(t, w, s, "b-1", 3); n > 3 {
		t.Fatalf("tries %v: b's second Event waited for a", s.tries)
	}
	fake.Step(wait)
	w.writeNext(context.Background())
	if s.tries[len(s.tries)-1] != "a-0" {
		t.Errorf("tries %v: once its wait passed, a's first Event is tried again before its second", s.tries)
	}
}

func TestTheQueueBoundsDropTheFloodersEventsNotAnothers(t *testing.T) {
	q := newEventQueue(eventsQueued)
	add := func(namespace string, i int) {
		q.add(&pendingEvent{event: &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("%s-%d", namespace, i)}}})
	}
	add("b", 0)
	// Eleven flooders: together they send far more than the total.
	for f := range 11 {
		for i := range 3000 {
			add(fmt.Sprintf("flood%d", f), i)
		}
	}
	if all, of := q.size("b"); all != eventsQueued || of != 1 {
		t.Fatalf("after the flood the queue holds %d Events, b's %d; want %d and 1", all, of, eventsQueued)
	}
	// The full queue trims the one holding the most: the flooders share what b leaves.
	least, most := eventsQueued, 0
	for f := range 11 {
		_, of := q.size(fmt.Sprintf("flood%d", f))
		least, most = min(least, of), max(most, of)
	}
	if most-least > 1 {
		t.Errorf("the flooders hold between %d and %d Events each; want shares that differ by one at most", least, most)
	}
	seen := false
	for p, _ := q.next(time.Now()); p != nil; p, _ = q.next(time.Now()) {
		seen = seen || p.event.Name == "b-0"
	}
	if !seen {
		t.Error("b's Event was dropped for the flooders")
	}
	if all, _ := q.size("b"); all != 0 || len(q.pending) != 0 || len(q.turns) != 0 {
		t.Errorf("an emptied queue still holds %d Events of %d namespaces", all, len(q.pending))
	}
}

func TestRetriesGiveUpAfterTheirTries(t *testing.T) {
	down := fmt.Errorf("dial tcp 127.0.0.1:6443: connect: %w", syscall.ECONNREFUSED)
	s := &answeringSink{answer: func(e *eventsv1.Event) error {
		if e.Namespace == "a" {
			return down
		}
		return nil
	}}
	w, fake := fairWriter(s)
	queueEvent(w, "a", "a-0")
	for {
		wait := w.writeNext(context.Background())
		if wait == 0 {
			break
		}
		fake.Step(max(wait, 0))
	}
	if len(s.tries) != eventRetries.Steps {
		t.Errorf("an Event the apiserver never took was tried %d times, want %d", len(s.tries), eventRetries.Steps)
	}
	if all, _ := w.queue.size("a"); all != 0 {
		t.Errorf("an Event given up is still queued (%d)", all)
	}
	// A refusal is not tried again.
	s.answer = func(*eventsv1.Event) error {
		return apierrors.NewForbidden(eventsv1.Resource("events"), "", errors.New("namespace is being terminated"))
	}
	s.tries = nil
	queueEvent(w, "a", "a-1")
	for w.writeNext(context.Background()) < 0 {
	}
	if len(s.tries) != 1 {
		t.Errorf("a refused Event was tried %d times, want once", len(s.tries))
	}
}

// hangingSink holds every Create until its request ends, as an apiserver that does not answer.
type hangingSink struct {
	mu    sync.Mutex
	calls int
}

func (s *hangingSink) Create(ctx context.Context, _ *eventsv1.Event) (*eventsv1.Event, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *hangingSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func TestStoppingWritesNothingFurtherAndLeavesNoGoroutine(t *testing.T) {
	scheme := k8sruntime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	s := &hangingSink{}
	w := &eventWriter{sink: s, retries: eventRetries, clock: testingclock.NewFakeClock(time.Now()), queue: newEventQueue(eventsQueued), log: logr.Discard()}
	recorder, stop, err := w.start(scheme, "berth")
	if err != nil {
		t.Fatal(err)
	}
	regarding := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "config", Namespace: "tenant", UID: "u1"}}
	for i := range 5 {
		recorder.Eventf(regarding, nil, corev1.EventTypeNormal, "Waiting", "Waiting", "note %d", i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.count() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the writer never wrote")
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	if n := s.count(); n != 1 {
		t.Errorf("%d writes by the time stopping returned, want the one in flight", n)
	}
	if all, _ := w.queue.size("tenant"); all != 0 {
		t.Errorf("the stopped writer's queue still holds %d Events", all)
	}
	// The broadcaster's watcher ends once it reads its closed channel; nothing else remains.
	for {
		left := eventGoroutines()
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left after stopping:\n%s", left)
		}
		time.Sleep(time.Millisecond)
	}
	if n := s.count(); n != 1 {
		t.Errorf("%d writes after stopping, want none past the one in flight", n)
	}
}

// eventGoroutines tells the stacks of the goroutines of berth's writer or client-go's
// broadcaster still running.
func eventGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "(*eventWriter).run") || strings.Contains(g, "tools/events.(*eventBroadcasterImpl)") || strings.Contains(g, "tools/events.(*recorderImpl)") ||
			strings.Contains(g, "watch.(*Broadcaster).loop") {
			left = append(left, g)
		}
	}
	return strings.Join(left, "\n\n")
}

// size tells how many Events wait, and how many of them are namespace's.
func (q *eventQueue) size(namespace string) (all, of int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ns := q.pending[namespace]; ns != nil {
		of = len(ns.events)
	}
	return q.count, of
}
