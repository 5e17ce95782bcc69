package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// sink is an events.EventSink that answers each Create with the next of its answers (nil
// once they run out), records what it took, and the most Creates it saw at once.
type sink struct {
	mu       sync.Mutex
	answers  []error
	created  []*eventsv1.Event
	calls    int
	inFlight int
	most     int
}

func (s *sink) Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	s.mu.Lock()
	s.calls++
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	var err error
	if len(s.answers) > 0 {
		err, s.answers = s.answers[0], s.answers[1:]
	}
	s.mu.Unlock()
	time.Sleep(time.Millisecond) // long enough for a second writer, were there one, to overlap
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	if err != nil {
		return nil, err
	}
	s.created = append(s.created, e)
	return e, nil
}

func (s *sink) Update(context.Context, *eventsv1.Event) (*eventsv1.Event, error) {
	return nil, errors.New("berth's writer never updates an Event")
}

func (s *sink) Patch(context.Context, *eventsv1.Event, []byte) (*eventsv1.Event, error) {
	return nil, errors.New("berth's writer never patches an Event")
}

func (s *sink) state() (created []*eventsv1.Event, calls, most int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*eventsv1.Event(nil), s.created...), s.calls, s.most
}

func startWriter(t *testing.T, s *sink) func(reason string) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	w := &eventWriter{
		sink: s, retries: wait.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 1}, clock: clock.RealClock{},
		queue: newEventQueue(eventsQueued), log: logr.Discard(),
	}
	recorder, stop, err := w.start(scheme, "berth")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	regarding := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "config", Namespace: "berth", UID: "u1"}}
	return func(reason string) {
		recorder.Eventf(regarding, nil, corev1.EventTypeWarning, reason, reason, "note of %s", reason)
	}
}

// waitCalls waits until the sink has had n Creates, and answered each.
func waitCalls(t *testing.T, s *sink, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		done := s.calls >= n && s.inFlight == 0
		s.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			_, calls, _ := s.state()
			t.Fatalf("the sink had %d Creates, want %d", calls, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAnEventIsWrittenWhatItSaysAndAboutWhat(t *testing.T) {
	s := &sink{}
	tell := startWriter(t, s)
	tell("ConfigRejected")
	waitCalls(t, s, 1)
	created, _, _ := s.state()
	e := created[0]
	if e.Reason != "ConfigRejected" || e.Note != "note of ConfigRejected" || e.Type != corev1.EventTypeWarning ||
		e.ReportingController != "berth" || e.Regarding.Name != "config" || e.Regarding.UID != "u1" || e.Namespace != "berth" {
		t.Errorf("the Event written: %+v", e)
	}
	if e.Series != nil {
		t.Errorf("a first Event has a series: %+v", e.Series)
	}
}

func TestEventsAreWrittenOneAtATime(t *testing.T) {
	s := &sink{}
	tell := startWriter(t, s)
	const n = 50
	for i := range n {
		tell(fmt.Sprintf("R%d", i))
	}
	waitCalls(t, s, n)
	created, _, most := s.state()
	if most != 1 || len(created) != n {
		t.Errorf("the sink took %d of %d Events and saw %d Creates at once, want all, one at a time", len(created), n, most)
	}
}

func TestAnEventTheApiserverCannotTakeForNowIsTriedAgain(t *testing.T) {
	timeout := apierrors.NewServerTimeout(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "create", 1)
	s := &sink{answers: []error{timeout, apierrors.NewTooManyRequests("slow down", 1), errors.New("connection reset by peer")}}
	tell := startWriter(t, s)
	tell("Waiting")
	waitCalls(t, s, 4)
	if created, calls, _ := s.state(); len(created) != 1 || calls != 4 {
		t.Errorf("written %d Events in %d tries, want 1 in 4", len(created), calls)
	}
}

// An Event the apiserver refuses, or keeps failing, is given up after its tries, and the next
// one is written.
func TestAnEventGivenUpLeavesTheQueueToTheNext(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "", errors.New("namespace is being terminated"))
	down := fmt.Errorf("dial tcp 127.0.0.1:6443: connect: %w", syscall.ECONNREFUSED)
	for _, c := range []struct {
		name    string
		answers []error
	}{
		{"refused", []error{forbidden}},
		{"failing four times", []error{down, down, down, down}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &sink{answers: c.answers}
			tell := startWriter(t, s)
			tell("GivenUp")
			waitCalls(t, s, len(c.answers))
			tell("Next")
			waitCalls(t, s, len(c.answers)+1)
			created, calls, _ := s.state()
			if len(created) != 1 || created[0].Reason != "Next" || calls != len(c.answers)+1 {
				t.Errorf("%d tries, written %v; want %d, the next Event alone", calls, created, len(c.answers)+1)
			}
		})
	}
}
