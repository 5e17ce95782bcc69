package controller

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-ci/berth/internal/retryable"
)

// berth's Events are made by client-go's events recorder and queued by its broadcaster, but
// not sent by the broadcaster's own recording: that keeps a copy of every Event it sent for six
// to twelve minutes, to fold repeats into a series, with no bound on how many, and sends each
// from a goroutine of its own. A tenant that floods a namespace with TaskRuns would size both
// (one Event per waiting task). Here one writer sends them in turn from the broadcaster's
// queue, which holds 1,000 (client-go's maxQueuedEvents) and drops what comes when it is full,
// and nothing is kept of an Event once it is written. berth tells most things once per task
// and reason (the mirror remembers that it told a task it waits, or that its annotations are
// full), so the series had little to fold.

// eventAttempt bounds one write of an Event: a request that hangs must not stall the queue
// behind it. Ten seconds is client-go's own wait between two tries of an Event.
const eventAttempt = 10 * time.Second

// eventRetries is the backoff between tries of an Event the apiserver could not take for now
// (a timeout, a throttle, a connection lost): three more tries within about 1.3 s, so a
// short outage loses no Event, and a long one delays the queue by little for each.
var eventRetries = wait.Backoff{Steps: 4, Duration: 100 * time.Millisecond, Factor: 3, Jitter: 0.2}

// newEventRecorder is the recorder berth's owners tell through, reporting as name, whose
// Events a writer sends until the manager stops.
func newEventRecorder(mgr ctrl.Manager, name string) (events.EventRecorder, error) {
	client, err := eventsv1client.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	w := &eventWriter{sink: &events.EventSinkImpl{Interface: client}, retries: eventRetries, log: mgr.GetLogger().WithName("events")}
	recorder, stop, err := w.start(mgr.GetScheme(), name)
	if err != nil {
		return nil, err
	}
	return recorder, mgr.Add(eventsUntilStop{stop: stop})
}

// eventWriter writes Events to the apiserver, one at a time.
type eventWriter struct {
	sink    events.EventSink
	retries wait.Backoff
	log     logr.Logger
}

// start starts the writer on a broadcaster of its own, and returns the recorder whose Events
// it writes and what stops both.
func (w *eventWriter) start(scheme *runtime.Scheme, name string) (events.EventRecorder, func(), error) {
	broadcaster := events.NewBroadcaster(w.sink)
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := broadcaster.StartEventWatcher(func(obj runtime.Object) {
		if e, ok := obj.(*eventsv1.Event); ok {
			w.write(ctx, e)
		}
	})
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return broadcaster.NewRecorder(scheme, name), func() { stop(); cancel(); broadcaster.Shutdown() }, nil
}

// write creates e, trying again while the apiserver cannot take it for now. An Event it
// refuses (a namespace being deleted, a name taken) is dropped: the log line of the same step
// (tell) holds what it said.
func (w *eventWriter) write(ctx context.Context, e *eventsv1.Event) {
	err := retry.OnError(w.retries, transient, func() error {
		attempt, cancel := context.WithTimeout(ctx, eventAttempt)
		defer cancel()
		_, err := w.sink.Create(attempt, e)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	})
	if err != nil && ctx.Err() == nil {
		w.log.V(1).Info("an Event was not written", "namespace", e.Namespace, "regarding", e.Regarding.Name, "reason", e.Reason, "error", err.Error())
	}
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
