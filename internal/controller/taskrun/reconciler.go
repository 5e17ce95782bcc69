// Package taskrun is berth's TaskRun controller: it gives each user TaskRun that asks for a
// platform a host (or an error it can act on) through the secret multi-platform-ssh-<name>,
// and cleans up when the TaskRun ends. Internal TaskRuns (provision, clean, update) are its
// hands on the hosts.
package taskrun

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/hostconfig"
)

// Reconciler reconciles user and internal TaskRuns.
type Reconciler struct {
	Client    client.Client // cached reads (stripped TaskRuns, labelled secrets); writes by patch
	Namespace string        // the controller's: internal TaskRuns, config, admin secrets
	Config    *hostconfig.Store
	Ledger    *allocation.Ledger
	Recorder  events.EventRecorder

	ProvisionTask, CleanTask, UpdateTask string // Task names in Namespace
	TaskServiceAccount                   string // runs the internal TaskRuns
	// WaitTimeout ends a wait for a host with an error secret; 0 waits forever.
	WaitTimeout time.Duration
	// FailedTaskRetention keeps failed internal TaskRuns for their logs.
	FailedTaskRetention time.Duration

	wakeups  chan event.GenericEvent
	restore  sync.Mutex
	restored atomic.Bool
	counted  sync.Map // UIDs of internal TaskRuns whose outcome was counted
	now      func() time.Time
}

// kind of a TaskRun, by the contract's rules.
type kind int

const (
	unrelated kind = iota
	userTask
	internalTask
)

func classify(tr *pipelinev1.TaskRun) kind {
	if tr.Labels[contract.TaskTypeLabel] != "" {
		return internalTask
	}
	if platformOf(tr) == "" || tr.Status.TaskSpec == nil {
		return unrelated
	}
	for _, v := range tr.Status.TaskSpec.Volumes {
		if v.Secret != nil && strings.HasPrefix(v.Secret.SecretName, contract.SecretPrefix) {
			return userTask
		}
	}
	return unrelated
}

func platformOf(tr *pipelinev1.TaskRun) string {
	for _, p := range tr.Spec.Params {
		if p.Name == contract.PlatformParam {
			return p.Value.StringVal
		}
	}
	return ""
}

func taskOf(tr *pipelinev1.TaskRun) allocation.Task {
	return allocation.Task{Namespace: tr.Namespace, Name: tr.Name}
}

// Reconcile dispatches a TaskRun to the user or internal flow.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if err := r.restoreOnce(ctx); err != nil {
		return reconcile.Result{}, err
	}
	var tr pipelinev1.TaskRun
	if err := r.Client.Get(ctx, req.NamespacedName, &tr); err != nil {
		if client.IgnoreNotFound(err) == nil {
			// Gone without our finalizer: it held no host, but it may have been waiting.
			r.wake(r.Ledger.Release(allocation.Task{Namespace: req.Namespace, Name: req.Name}))
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	log := logr.FromContextOrDiscard(ctx)
	var (
		result reconcile.Result
		err    error
	)
	switch classify(&tr) {
	case userTask:
		result, err = r.reconcileUser(logr.NewContext(ctx, log.WithValues("platform", platformOf(&tr))), &tr)
	case internalTask:
		result, err = r.reconcileInternal(ctx, &tr)
	}
	if apierrors.IsConflict(err) {
		// Our copy was stale (a write raced ours); nothing failed. Try again with a fresh one.
		return reconcile.Result{Requeue: true}, nil
	}
	return result, err
}

// restore rebuilds the ledger from the TaskRuns once, before the first decision, so a
// restarted controller knows who holds which host (assigned-host) and who still waits for one
// (no host, no secret), in order of creation.
// Workers wait for it; a failed attempt is retried by the next reconcile.
func (r *Reconciler) restoreOnce(ctx context.Context) error {
	if r.restored.Load() {
		return nil
	}
	r.restore.Lock()
	defer r.restore.Unlock()
	if r.restored.Load() {
		return nil
	}
	var list pipelinev1.TaskRunList
	if err := r.Client.List(ctx, &list); err != nil {
		return err
	}
	var secrets corev1.SecretList
	if err := r.Client.List(ctx, &secrets); err != nil {
		return err
	}
	answered := map[types.NamespacedName]bool{}
	for _, s := range secrets.Items {
		answered[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = true
	}
	for i := range list.Items {
		tr := &list.Items[i]
		if classify(tr) != userTask {
			continue
		}
		switch host := tr.Labels[contract.AssignedHostLabel]; {
		case host != "" && host != contract.Localhost:
			// Also when the task is done: it holds the slot until finish has removed the
			// label, and that reconcile is on its way.
			r.Ledger.Restore(taskOf(tr), host, platformOf(tr))
		case host == "" && !tr.IsDone() && tr.DeletionTimestamp == nil &&
			!answered[types.NamespacedName{Namespace: tr.Namespace, Name: contract.SecretPrefix + tr.Name}]:
			// Unserved: waiting, or not reached before the restart. Queued by creation, so
			// nobody created later is served first.
			r.Ledger.Enqueue(allocation.Request{Task: taskOf(tr), Platform: platformOf(tr),
				Created: tr.CreationTimestamp.Time, Exclude: failedHosts(tr)})
		}
	}
	r.restored.Store(true)
	return nil
}

// wake reconciles waiters that can now be served, at once: this, not polling, is how a freed
// slot reaches the next task. It never blocks a reconcile and never drops a wake-up (a dropped
// one would leave a waiter asleep with a free slot in front of it): when the channel is full,
// the send waits in a goroutine of its own.
func (r *Reconciler) wake(tasks []allocation.Task) {
	for _, t := range tasks {
		tr := &pipelinev1.TaskRun{}
		tr.Namespace, tr.Name = t.Namespace, t.Name
		ev := event.GenericEvent{Object: tr}
		select {
		case r.wakeups <- ev:
		default:
			go func() { r.wakeups <- ev }()
		}
	}
}

func (r *Reconciler) event(tr *pipelinev1.TaskRun, eventType, reason, format string, args ...any) {
	r.Recorder.Eventf(tr, nil, eventType, reason, reason, format, args...)
}

func (r *Reconciler) secretOf(ctx context.Context, tr *pipelinev1.TaskRun) (*corev1.Secret, error) {
	var s corev1.Secret
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: contract.SecretPrefix + tr.Name}, &s)
	if err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return &s, nil
}
