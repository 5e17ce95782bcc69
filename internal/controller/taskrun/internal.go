package taskrun

import (
	"context"
	"slices"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/contract"
)

// reconcileInternal tidies up after berth's own TaskRuns. What a provision means for its user
// task is decided in the user task's reconcile (the watch sends it there too); here the ended
// ones are counted and deleted, the failed only after FailedTaskRetention, for their logs.
func (r *Reconciler) reconcileInternal(ctx context.Context, tr *pipelinev1.TaskRun) (reconcile.Result, error) {
	if tr.Namespace != r.Namespace || !tr.IsDone() {
		return reconcile.Result{}, nil
	}
	switch tr.Labels[contract.TaskTypeLabel] {
	case contract.TaskTypeProvision:
		user, err := r.userOf(ctx, tr)
		if err != nil {
			return reconcile.Result{}, err
		}
		// A provision still matters while its user task may act on it: until it has
		// recorded a failure, or has its secret.
		if user != nil && !user.IsDone() && user.DeletionTimestamp == nil {
			if tr.IsSuccessful() && user.Labels[contract.AssignedHostLabel] == tr.Labels[contract.AssignedHostLabel] {
				// The user task deletes it once its secret is seen; look again later in case
				// that never happens (a missed event must not leave it forever).
				return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
			}
			if tr.IsSuccessful() {
				break // the user task holds another host now: this provision is history
			}
			if !slices.Contains(failedHosts(user), tr.Labels[contract.AssignedHostLabel]) {
				// The user task has not recorded this failure yet, or our cache has not seen it
				// record it: look again shortly rather than lose the TaskRun.
				return reconcile.Result{RequeueAfter: time.Second}, nil
			}
		}
	case contract.TaskTypeClean:
		if !tr.IsSuccessful() {
			r.Recorder.Eventf(tr, nil, corev1.EventTypeWarning, "CleanFailed", "Clean",
				"removing the build user of %s/%s from host %s failed: %s; the host's update task removes it later",
				tr.Labels[contract.UserTaskNamespaceLabel], tr.Labels[contract.UserTaskNameLabel], tr.Labels[contract.AssignedHostLabel], conditionMessage(tr))
		}
	case contract.TaskTypeUpdate:
		r.applyHealth(tr)
	}
	r.count(tr, outcome(tr))
	return r.expire(ctx, tr)
}

// expire deletes an ended internal TaskRun: at once when it succeeded, after the retention when
// it failed.
func (r *Reconciler) expire(ctx context.Context, tr *pipelinev1.TaskRun) (reconcile.Result, error) {
	if !tr.IsSuccessful() && tr.Status.CompletionTime != nil {
		if left := r.FailedTaskRetention - r.now().Sub(tr.Status.CompletionTime.Time); left > 0 {
			return reconcile.Result{RequeueAfter: left}, nil
		}
	}
	return reconcile.Result{}, r.deleteInternal(ctx, tr)
}

// applyHealth quarantines a host whose check failed and lifts the quarantine when one passes.
func (r *Reconciler) applyHealth(tr *pipelinev1.TaskRun) {
	host := tr.Labels[contract.AssignedHostLabel]
	healthy, reason := tr.IsSuccessful(), conditionMessage(tr)
	if tr.IsSuccessful() {
		healthy, reason = false, "the update task reported no result"
		for _, res := range tr.Status.Results {
			switch res.Name {
			case "healthy":
				healthy = strings.TrimSpace(res.Value.StringVal) == "true"
			case "reason":
				reason = res.Value.StringVal
			}
		}
	}
	if healthy {
		was := r.wasQuarantined(host)
		r.wake(r.Ledger.Quarantine(host, false))
		if was {
			r.Recorder.Eventf(tr, nil, corev1.EventTypeNormal, "HostHealthy", "Check", "host %s passed its check and takes builds again", host)
		}
		return
	}
	r.Ledger.Quarantine(host, true)
	r.Recorder.Eventf(tr, nil, corev1.EventTypeWarning, "HostQuarantined", "Check", "host %s takes no new builds until a check passes: %s", host, reason)
}

func (r *Reconciler) wasQuarantined(host string) bool {
	for _, u := range r.Ledger.Usage() {
		if u.Host == host {
			return u.Quarantined
		}
	}
	return false
}

// count records an internal TaskRun's outcome once.
func (r *Reconciler) count(tr *pipelinev1.TaskRun, outcome string) {
	if _, seen := r.counted.LoadOrStore(tr.UID, struct{}{}); !seen {
		internalTasks.WithLabelValues(tr.Labels[contract.TaskTypeLabel], outcome).Inc()
	}
}

func outcome(tr *pipelinev1.TaskRun) string {
	if tr.IsSuccessful() {
		return "succeeded"
	}
	return "failed"
}

func (r *Reconciler) userOf(ctx context.Context, internal *pipelinev1.TaskRun) (*pipelinev1.TaskRun, error) {
	var user pipelinev1.TaskRun
	key := types.NamespacedName{Namespace: internal.Labels[contract.UserTaskNamespaceLabel], Name: internal.Labels[contract.UserTaskNameLabel]}
	if err := r.Client.Get(ctx, key, &user); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return &user, nil
}
