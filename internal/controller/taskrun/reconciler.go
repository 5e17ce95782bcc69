// Package taskrun is berth's TaskRun controller: it gives each user TaskRun that asks for a
// platform a host (or an error it can act on) through the secret multi-platform-ssh-<name>,
// and cleans up when the TaskRun ends. It decides only from its own records (Allocations and
// BuildHosts in its namespace) and its config; labels on a tenant's TaskRun are mirrors it
// writes and never reads.
package taskrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/incident"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/warning"
)

// KeyPair makes a fresh key pair of type kt for one build user: the OpenSSH private key (for
// the task's secret) and the authorized_keys line (the only part that reaches the host).
type KeyPair func(kt config.KeyType, comment string) (private, authorized []byte, err error)

// Reconciler reconciles user TaskRuns and the records that serve them.
type Reconciler struct {
	// Client reads from the cache (stripped TaskRuns, berth's own secrets, records) and writes.
	Client client.Client
	// APIReader reads past the cache, where a stale read would cost a wrong decision.
	APIReader client.Reader
	Namespace string // the controller's: records, config, admin secrets
	Config    *hostconfig.Store
	// Capacity is the ledger and its wake-ups, shared with the hosts' owner.
	Capacity    *capacity.Capacity
	Recorder    events.EventRecorder
	Provisioner provision.Provisioner
	NewKey      KeyPair
	// Hosts serves dynamic and dynamic-pool platforms (without it they get an error secret)
	// and judges failed cleans (without it no clean quarantines a host).
	Hosts Hosts
	// OTP, if set, gives tasks a one-time token for their key instead of the key.
	OTP *OneTimeKeys
	// WaitTimeout ends a wait for a host with an error secret; 0 waits forever.
	WaitTimeout time.Duration
	// MirrorRevertInterval is the least time between two reverts of a tenant's edit of the
	// mirrors on one TaskRun, so an edit loop cannot drive unbounded writes.
	MirrorRevertInterval time.Duration
	// PositionInterval is the least time between two writes of a waiting TaskRun's place in
	// line (DefaultPositionInterval when zero).
	PositionInterval time.Duration
	// UpstreamNamespace is the namespace of the controller berth replaces, whose provision
	// TaskRuns show what it served (DefaultUpstreamNamespace when empty). No tenant may write
	// there: a TaskRun there is taken as that controller's own.
	UpstreamNamespace string

	// mirror writes the labels, annotations and finalizer of user TaskRuns (SetupWithManager
	// makes it).
	mirror  *taskMirror
	secrets *taskSecrets
	records *recordStore
	// strategies says how each kind of platform is served.
	strategies strategies
	gate       gate
	line       *line
	keyring    *keyring
	debts      *debts
	// The phases of a user task (phases.go).
	admitting    *admitPhase
	reserving    *reservePhase
	provisioning *provisionPhase
	guarding     *guardPhase
	retrying     *retryPhase
	answers      *answers
	finishing    *finishPhase
	// echoes tells the watch events of berth's own writes (see echoes).
	echoes *echoes
	now    func() time.Time
}

// kind of a TaskRun, by the contract's rules.
type kind int

const (
	unrelated kind = iota
	userTask
)

func classifyUser(tr *pipelinev1.TaskRun) kind {
	if contract.ResolvedUserTask(tr) {
		return userTask
	}
	return unrelated
}

func taskOf(tr *pipelinev1.TaskRun) allocation.Task {
	return allocation.Task{Namespace: tr.Namespace, Name: tr.Name}
}

// Reconcile handles one TaskRun name: the TaskRun, if it is a user task, and every record of
// a TaskRun that had this name (a deleted one, or one re-created under the same name).
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	defer r.mirror.reconcile(req.NamespacedName)()
	task := allocation.Task{Namespace: req.Namespace, Name: req.Name}
	r.Capacity.Reconciling(task)
	if done, err := r.line.restoreOnce(ctx); !done || err != nil {
		return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, err
	}
	var tr *pipelinev1.TaskRun
	var got pipelinev1.TaskRun
	switch err := r.Client.Get(ctx, req.NamespacedName, &got); {
	case err == nil && r.gate.classify(&got) == userTask:
		tr = &got
		r.mirror.startsFrom(tr)
	case err != nil && !apierrors.IsNotFound(err):
		return reconcile.Result{}, err
	}
	// got.UID is empty when no TaskRun has the name.
	if err := r.secrets.dropStale(ctx, req.NamespacedName, got.UID); err != nil {
		var o outcomes
		o.add(reconcile.Result{}, err)
		return o.result()
	}
	records, err := r.records.of(ctx, req.NamespacedName)
	if err != nil {
		return reconcile.Result{}, err
	}
	var results outcomes
	var own *berthv1.Allocation
	for _, rec := range records {
		if tr != nil && rec.Spec.TaskRun.UID == tr.UID {
			own = rec
			continue
		}
		results.add(r.finishing.settleOrphan(ctx, rec))
	}
	if tr != nil {
		results.add(r.reconcileUser(ctx, tr, own))
	} else if len(records) == 0 {
		// Gone without a record: it may still sit in a queue rebuilt before it went.
		results.add(reconcile.Result{}, r.finishing.releaseUnrecorded(task))
	}
	return results.result()
}

// outcomes aggregates the phases' results: the first real error wins, the soonest requeue
// wins, and a conflict (someone wrote first; our copy was stale) is a quick retry, not an error.
type outcomes struct {
	res reconcile.Result
	err error
	// stale: a write failed because the copy it was based on was stale.
	stale bool
}

func (o *outcomes) add(res reconcile.Result, err error) {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || errors.Is(err, errStale) {
		res, err = reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
		o.stale = true
	}
	if err != nil && o.err == nil {
		o.err = err
	}
	if res.RequeueAfter > 0 && (o.res.RequeueAfter == 0 || res.RequeueAfter < o.res.RequeueAfter) {
		o.res.RequeueAfter = res.RequeueAfter
	}
}

func (o *outcomes) result() (reconcile.Result, error) { return o.res, o.err }

// errStale says the cache has not yet caught up with berth's own last write.
var errStale = errors.New("cache behind berth's own write")

// send puts the TaskRun's name on a wake-up channel without blocking.
func send(ch chan event.GenericEvent, namespace, name string) {
	tr := &pipelinev1.TaskRun{}
	tr.Namespace, tr.Name = namespace, name
	ev := event.GenericEvent{Object: tr}
	select {
	case ch <- ev:
	default:
		go func() { ch <- ev }()
	}
}

// tell tells the TaskRun's owner what berth did or why it waits (an Event on the TaskRun)
// and the operator the same in the log, with the TaskRun, its platform and the host ("" when
// there is none yet). A Warning event is a warning line (see package warning).
func tell(ctx context.Context, recorder events.EventRecorder, tr *pipelinev1.TaskRun, host, eventType, reason, format string, args ...any) {
	recorder.Eventf(tr, nil, eventType, reason, reason, "%s", incident.Note(fmt.Sprintf(format, args...)))
	logStep(ctx, tr.Namespace+"/"+tr.Name, contract.Platform(tr), host, eventType, reason, fmt.Sprintf(format, args...))
}

// step is a routine step that went as it should (a host assigned, a user made, a host
// released): a log line, and no Event. Events are for what a person must learn (a refusal, a
// failure, a wait), so a task that goes well costs the apiserver no Event writes at all.
func step(ctx context.Context, taskRun, platform, host, reason, format string, args ...any) {
	logStep(ctx, taskRun, platform, host, corev1.EventTypeNormal, reason, fmt.Sprintf(format, args...))
}

// tellRecord is tell for a step taken for a record (its TaskRun may be gone): the Event goes
// on the record, in berth's namespace.
func tellRecord(ctx context.Context, recorder events.EventRecorder, rec *berthv1.Allocation, host, eventType, reason, format string, args ...any) {
	recorder.Eventf(rec, nil, eventType, reason, reason, "%s", incident.Note(fmt.Sprintf(format, args...)))
	logStep(ctx, rec.Spec.TaskRun.Key(), rec.Spec.Platform, host, eventType, reason, fmt.Sprintf(format, args...))
}

// logStep is the log line of an event.
func logStep(ctx context.Context, taskRun, platform, host, eventType, reason, message string) {
	kv := []any{"taskRun", taskRun, "platform", platform, "reason", reason}
	if host != "" {
		kv = append(kv, "host", host)
	}
	log := logf.FromContext(ctx)
	if eventType == corev1.EventTypeWarning {
		warning.Log(log, message, kv...)
		return
	}
	log.Info(message, kv...)
}
