package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-ci/berth/internal/retryable"
)

// berth's Events are made by client-go's events recorder and handed over by its broadcaster,
// but not sent by the broadcaster's own recording: that keeps a copy of every Event it sent
// for six to twelve minutes, to fold repeats into a series, with no bound on how many, and
// sends each from a goroutine of its own. A tenant that floods a namespace with TaskRuns would
// size both (one Event per waiting task). Here the broadcaster's watcher only puts each Event
// in a queue of berth's (eventQueue), which takes turns by namespace and is bounded per
// namespace and in all, and one writer sends them in turn; nothing is kept of an Event once
// it is written. berth tells most things once per task and reason (the mirror remembers that
// it told a task it waits, or that its annotations are full), so the series had little to
// fold.

// eventAttempt bounds one write of an Event: a request that hangs must not stall the queue
// behind it. Ten seconds is client-go's own wait between two tries of an Event.
const eventAttempt = 10 * time.Second

// eventsQueued is what the queue holds in all: client-go's maxQueuedEvents, the bound of the
// broadcaster's own queue, which the writer read from before; so Events cost berth no more
// memory than they did (about a kilobyte each).
const eventsQueued = 1000

// eventRetries is the backoff between tries of an Event the apiserver could not take for now
// (a timeout, a throttle, a connection lost): three more tries within about 1.3 s (or after the
// apiserver's Retry-After, when longer), so a short outage loses no Event. The Event waits in
// its namespace's queue meanwhile, not in the writer, which writes other namespaces' Events.
var eventRetries = wait.Backoff{Steps: 4, Duration: 100 * time.Millisecond, Factor: 3, Jitter: 0.2}

// newEventRecorder is the recorder berth's owners tell through, reporting as name, whose
// Events a writer sends until the manager stops.
func newEventRecorder(mgr ctrl.Manager, name string) (events.EventRecorder, error) {
	client, err := eventsv1client.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		return nil, fmt.Errorf("making the Events client: %w", err)
	}
	w := &eventWriter{
		sink: apiserverEvents{client.RESTClient()}, retries: eventRetries, clock: clock.RealClock{},
		queue: newEventQueue(eventsQueued), log: mgr.GetLogger().WithName("events"),
	}
	recorder, stop, err := w.start(mgr.GetScheme(), name)
	if err != nil {
		return nil, err
	}
	return recorder, mgr.Add(eventsUntilStop{stop: stop})
}

// eventCreator is where the writer creates Events: the apiserver, or a test's fake.
type eventCreator interface {
	Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error)
}

// apiserverEvents creates Events with one request each. client-go's REST client would try a
// create answered 429 or 5xx with a Retry-After up to ten times more, waiting as told, and
// the writer with it (about 40 s for one Event under a throttle); so its own retries are off
// and a write the apiserver cannot take goes back to berth's queue, to wait there.
type apiserverEvents struct{ client rest.Interface }

func (a apiserverEvents) Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	// The created Event is not decoded: berth keeps nothing of it.
	err := a.client.Post().Namespace(e.Namespace).Resource("events").Body(e).MaxRetries(0).Do(ctx).Error()
	if err != nil {
		return nil, err
	}
	return e, nil
}

// eventWriter writes Events to the apiserver, one at a time, taking them from its queue.
type eventWriter struct {
	sink    eventCreator
	retries wait.Backoff
	clock   clock.Clock
	queue   *eventQueue
	log     logr.Logger
}

// start starts the writer on a broadcaster of its own, and returns the recorder whose Events
// it writes and what stops both. Stopping returns once the writer and the broadcaster's
// goroutines are done, and writes nothing of what still waits.
func (w *eventWriter) start(scheme *runtime.Scheme, name string) (events.EventRecorder, func(), error) {
	// The broadcaster's sink is used only by its own recording, which berth never starts.
	broadcaster := events.NewBroadcaster(nil)
	stopWatching, err := broadcaster.StartEventWatcher(func(obj runtime.Object) {
		if e, ok := obj.(*eventsv1.Event); ok {
			w.queue.add(&pendingEvent{event: e, backoff: w.retries})
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("watching the Events broadcaster: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	stop := func() {
		stopWatching()
		cancel()
		<-done
		broadcaster.Shutdown()
		w.queue.clear()
	}
	return broadcaster.NewRecorder(scheme, name), stop, nil
}

// run writes Events until ctx ends, waiting while none is due.
func (w *eventWriter) run(ctx context.Context) {
	for ctx.Err() == nil {
		wait := w.writeNext(ctx)
		if wait < 0 {
			continue
		}
		var due <-chan time.Time
		var timer clock.Timer
		if wait > 0 {
			timer = w.clock.NewTimer(wait)
			due = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-w.queue.added:
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// writeNext makes one try of the Event whose turn it is, and tells -1; with none due, it
// tells how long until one is (0 when none waits).
func (w *eventWriter) writeNext(ctx context.Context) time.Duration {
	p, wait := w.queue.next(w.clock.Now())
	if p == nil {
		return wait
	}
	w.write(ctx, p)
	return -1
}

// write tries p once. One the apiserver cannot take for now goes back to its namespace's
// queue until its backoff has passed; one it refuses (a namespace being deleted, a name
// taken), or that has had its tries, is dropped: the log line of the same step (tell) holds
// what it said.
func (w *eventWriter) write(ctx context.Context, p *pendingEvent) {
	attempt, cancel := context.WithTimeout(ctx, eventAttempt)
	_, err := w.sink.Create(attempt, p.event)
	cancel()
	if err == nil || ctx.Err() != nil {
		return
	}
	if transient(err) && p.backoff.Steps > 1 {
		delay := p.backoff.Step()
		if seconds, ok := apierrors.SuggestsClientDelay(err); ok {
			delay = max(delay, time.Duration(seconds)*time.Second)
		}
		p.notBefore = w.clock.Now().Add(delay)
		w.queue.requeue(p)
		return
	}
	e := p.event
	w.log.V(1).Info("an Event was not written", "namespace", e.Namespace, "regarding", e.Regarding.Name, "reason", e.Reason, "error", err.Error())
}

// transient tells an error the next try may not meet: one retryable, or the attempt's own
// deadline passing (eventAttempt) while berth still runs.
func transient(err error) bool {
	return retryable.Error(err) || errors.Is(err, context.DeadlineExceeded)
}

// eventsUntilStop stops the writer and the broadcaster when the manager stops.
type eventsUntilStop struct{ stop func() }

// NeedLeaderElection: a standby's owners tell nothing, but its recorder exists all the same.
func (e eventsUntilStop) NeedLeaderElection() bool { return false }

func (e eventsUntilStop) Start(ctx context.Context) error {
	<-ctx.Done()
	e.stop()
	return nil
}
