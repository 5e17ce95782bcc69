package taskrun

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// reconcileUser moves a user TaskRun through its phases: finished → clean up; holding a host
// → see provisioning through; otherwise → decide how its platform is served.
func (r *Reconciler) reconcileUser(ctx context.Context, tr *pipelinev1.TaskRun) (reconcile.Result, error) {
	if tr.DeletionTimestamp != nil || tr.IsDone() {
		return reconcile.Result{}, r.finish(ctx, tr)
	}
	if host := tr.Labels[contract.AssignedHostLabel]; host != "" {
		if host == contract.Localhost {
			return reconcile.Result{}, nil
		}
		return r.seeProvisioningThrough(ctx, tr, host)
	}
	secret, err := r.secretOf(ctx, tr)
	if err != nil || secret != nil {
		return reconcile.Result{}, err // already answered (an error secret)
	}
	return r.serve(ctx, tr)
}

// serve decides how the task's platform is satisfied, or why it cannot be.
func (r *Reconciler) serve(ctx context.Context, tr *pipelinev1.TaskRun) (reconcile.Result, error) {
	platform := platformOf(tr)
	cfg := r.Config.Config()
	if cfg == nil && !r.Config.Synced() {
		// Just started: the config watcher has not read the ConfigMap yet.
		return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, nil
	}
	if cfg == nil {
		rejected, problems := r.Config.Rejected()
		msg := "berth has no valid host configuration yet, so no platform can be served. Ask the platform team to create or fix the ConfigMap labelled " + contract.ConfigLabel + " in namespace " + r.Namespace + "."
		if rejected != nil && len(rejected.Broken(config.Platform(platform))) > 0 {
			msg = fmt.Sprintf("the host configuration for platform %s is invalid (%s). Ask the platform team to fix it in the ConfigMap labelled %s in namespace %s; `berth config validate` lists every problem.",
				platform, rejected.Broken(config.Platform(platform)).Summary(), contract.ConfigLabel, r.Namespace)
		} else if rejected != nil {
			msg = fmt.Sprintf("berth's host configuration is invalid (%d error(s), e.g. %s), so no platform can be served until it is fixed in the ConfigMap labelled %s in namespace %s.",
				len(problems.Errors()), problems.Errors()[0].String(), contract.ConfigLabel, r.Namespace)
		}
		return reconcile.Result{}, r.fail(ctx, tr, "ConfigInvalid", msg)
	}
	if !cfg.NamespaceAllowed(tr.Namespace) {
		return reconcile.Result{}, r.fail(ctx, tr, "NamespaceNotAllowed", fmt.Sprintf(
			"namespace %s may not use multi-platform builds (platform %s): it is not in allowed-namespaces of berth's host configuration. Ask the platform team to allow it.", tr.Namespace, platform))
	}
	strategy, known := cfg.Strategy(config.Platform(platform))
	switch {
	case !known:
		return reconcile.Result{}, r.fail(ctx, tr, "UnknownPlatform", fmt.Sprintf(
			"platform %q is not configured: berth knows %s. Fix the PLATFORM param of the task, or ask the platform team to add the platform.", platform, knownPlatforms(cfg)))
	case strategy == config.StrategyLocal:
		return reconcile.Result{}, r.serveLocally(ctx, tr)
	case strategy == config.StrategyStatic:
		return r.allocate(ctx, tr, platform)
	}
	return reconcile.Result{}, r.fail(ctx, tr, "PlatformUnsupported", fmt.Sprintf(
		"platform %s is configured as %s, which this berth release does not serve yet: use a static host or a local platform for it.", platform, strategy))
}

func knownPlatforms(cfg *config.Config) string {
	var names []string
	for p := range cfg.Platforms {
		names = append(names, string(p))
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// serveLocally tells the task to build where it runs.
func (r *Reconciler) serveLocally(ctx context.Context, tr *pipelinev1.TaskRun) error {
	if err := tasksecret.Apply(ctx, r.Client, tasksecret.ForLocal(ownerOf(tr))); err != nil {
		return err
	}
	err := r.patchLabels(ctx, tr, func(tr *pipelinev1.TaskRun) {
		tr.Labels[contract.AssignedHostLabel] = contract.Localhost
		tr.Labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(platformOf(tr))
	})
	if err == nil {
		r.event(tr, corev1.EventTypeNormal, "Local", "platform %s is local: the task builds on this cluster", platformOf(tr))
	}
	return err
}

// allocate reserves a slot on a static host, or queues the task for one. The reservation is
// written to the TaskRun (assigned-host, finalizer) before provisioning starts, so a restart
// never forgets it.
func (r *Reconciler) allocate(ctx context.Context, tr *pipelinev1.TaskRun, platform string) (reconcile.Result, error) {
	task := taskOf(tr)
	grant := r.Ledger.Acquire(allocation.Request{Task: task, Platform: platform, Created: tr.CreationTimestamp.Time, Exclude: failedHosts(tr)})
	r.wake(grant.Wake)
	switch {
	case grant.Blocked:
		return reconcile.Result{}, r.fail(ctx, tr, "AllHostsFailed", fmt.Sprintf(
			"no host of platform %s could be provisioned for this task (failed: %s). The hosts may be down or misconfigured; see the events of this TaskRun and tell the platform team.",
			platform, strings.Join(failedHosts(tr), ", ")))
	case grant.Host == "":
		return r.wait(ctx, tr, platform, grant.Position)
	}
	err := r.patchLabels(ctx, tr, func(tr *pipelinev1.TaskRun) {
		tr.Labels[contract.AssignedHostLabel] = grant.Host
		tr.Labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(platform)
		delete(tr.Labels, contract.WaitingForPlatformLabel)
		controllerutil.AddFinalizer(tr, contract.Finalizer)
	})
	if err != nil {
		// A reservation made just now and not recorded is not held. One made by an earlier
		// reconcile is recorded already (this one read a stale copy): it stays.
		if !grant.Held {
			r.wake(r.Ledger.Release(task))
		}
		return reconcile.Result{}, err
	}
	waitSeconds.WithLabelValues(platform).Observe(r.now().Sub(tr.CreationTimestamp.Time).Seconds())
	r.event(tr, corev1.EventTypeNormal, "HostAssigned", "host %s reserved for platform %s; provisioning a build user", grant.Host, platform)
	return r.seeProvisioningThrough(ctx, tr, grant.Host)
}

// wait labels the task as waiting and tells it its place; the next freed slot wakes it. The
// only timed requeue is the wait timeout's.
func (r *Reconciler) wait(ctx context.Context, tr *pipelinev1.TaskRun, platform string, position int) (reconcile.Result, error) {
	var left time.Duration
	if r.WaitTimeout > 0 {
		// Counted from creation: the same answer after a restart.
		if left = r.WaitTimeout - r.now().Sub(tr.CreationTimestamp.Time); left <= 0 {
			r.wake(r.Ledger.Release(taskOf(tr)))
			return reconcile.Result{}, r.fail(ctx, tr, "WaitTimeout", fmt.Sprintf(
				"no host of platform %s became free within %s; all are busy. Retry later, or ask the platform team for more capacity.", platform, r.WaitTimeout))
		}
	}
	if tr.Labels[contract.WaitingForPlatformLabel] == "" {
		if err := r.markWaiting(ctx, tr, platform, position); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{RequeueAfter: left}, nil
}

func (r *Reconciler) markWaiting(ctx context.Context, tr *pipelinev1.TaskRun, platform string, position int) error {
	err := r.patchLabels(ctx, tr, func(tr *pipelinev1.TaskRun) {
		tr.Labels[contract.WaitingForPlatformLabel] = contract.PlatformLabelValue(platform)
	})
	if err == nil {
		r.event(tr, corev1.EventTypeNormal, "Waiting", "every host of platform %s is busy; this task is number %d in line", platform, position)
	}
	return err
}

// seeProvisioningThrough runs the provision TaskRun for the reserved host and reacts to its
// end. The secret it creates is what lets the task start.
func (r *Reconciler) seeProvisioningThrough(ctx context.Context, tr *pipelinev1.TaskRun, hostName string) (reconcile.Result, error) {
	secret, err := r.secretOf(ctx, tr)
	if err != nil {
		return reconcile.Result{}, err
	}
	prov, err := r.internal(ctx, provisionName(tr, hostName))
	if err != nil {
		return reconcile.Result{}, err
	}
	if secret != nil {
		// Provisioned. The provision TaskRun goes only now: while its secret was not yet in
		// the cache, its absence would have looked like "not started" and provisioned twice.
		if prov != nil {
			allocationSeconds.WithLabelValues(platformOf(tr)).Observe(secret.CreationTimestamp.Sub(prov.CreationTimestamp.Time).Seconds())
			r.count(prov, "succeeded")
			r.event(tr, corev1.EventTypeNormal, "Provisioned", "build user ready on host %s", hostName)
			return reconcile.Result{}, r.deleteInternal(ctx, prov)
		}
		return reconcile.Result{}, nil
	}
	switch {
	case prov == nil:
		host := r.Config.Host(hostName)
		if host == nil {
			return r.provisioningFailed(ctx, tr, hostName, "the host is no longer configured")
		}
		err := r.Client.Create(ctx, r.provisionTaskRun(tr, host, platformOf(tr), ""))
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		return reconcile.Result{}, err
	case !prov.IsDone():
		return reconcile.Result{}, nil // its end brings us back
	case prov.IsSuccessful():
		return reconcile.Result{}, nil // the secret's arrival brings us back
	}
	r.count(prov, "failed")
	return r.provisioningFailed(ctx, tr, hostName, conditionMessage(prov))
}

// provisioningFailed gives up on a host for this task: the host goes into failed-hosts, a clean
// TaskRun removes whatever the attempt left there, and the slot goes to the next task; this one
// then tries another host.
func (r *Reconciler) provisioningFailed(ctx context.Context, tr *pipelinev1.TaskRun, hostName, why string) (reconcile.Result, error) {
	r.event(tr, corev1.EventTypeWarning, "ProvisioningFailed", "host %s: %s; trying another host", hostName, why)
	if err := r.ensureClean(ctx, tr, hostName); err != nil {
		return reconcile.Result{}, err
	}
	err := r.patchLabels(ctx, tr, func(tr *pipelinev1.TaskRun) {
		delete(tr.Labels, contract.AssignedHostLabel)
		failed := failedHosts(tr)
		if !slices.Contains(failed, hostName) {
			failed = append(failed, hostName)
		}
		if tr.Annotations == nil {
			tr.Annotations = map[string]string{}
		}
		tr.Annotations[contract.FailedHostsAnnotation] = strings.Join(failed, ",")
	})
	if err != nil {
		return reconcile.Result{}, err
	}
	// The failed provision TaskRun may now go (after the retention); its own reconcile decides.
	r.wake([]allocation.Task{{Namespace: r.Namespace, Name: provisionName(tr, hostName)}})
	r.wake(r.Ledger.Release(taskOf(tr)))
	return reconcile.Result{Requeue: true}, nil
}

// finish cleans up after a task that ended or is being deleted, in an order that survives a
// crash between any two steps: every step is idempotent, and the slot is released only after
// the TaskRun no longer records it.
func (r *Reconciler) finish(ctx context.Context, tr *pipelinev1.TaskRun) error {
	task := taskOf(tr)
	host := tr.Labels[contract.AssignedHostLabel]
	if host != "" && host != contract.Localhost {
		prov, err := r.internal(ctx, provisionName(tr, host))
		if err != nil {
			return err
		}
		if prov != nil && !prov.IsDone() {
			// A clean now could run before the provision it must undo; stop the provision
			// and come back when it has ended.
			return r.cancel(ctx, prov)
		}
		if err := r.ensureClean(ctx, tr, host); err != nil {
			return err
		}
		if prov != nil {
			if err := r.deleteInternal(ctx, prov); err != nil {
				return err
			}
		}
	}
	if err := r.deleteSecret(ctx, tr); err != nil {
		return err
	}
	err := r.patchLabels(ctx, tr, func(tr *pipelinev1.TaskRun) {
		delete(tr.Labels, contract.AssignedHostLabel)
		delete(tr.Labels, contract.WaitingForPlatformLabel)
		controllerutil.RemoveFinalizer(tr, contract.Finalizer)
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if held, ok := r.Ledger.Holder(task); ok {
		r.event(tr, corev1.EventTypeNormal, "HostReleased", "host %s released; its build user is being removed", held)
		if tr.Status.CompletionTime != nil && tr.Status.StartTime != nil {
			taskSeconds.WithLabelValues(platformOf(tr)).Observe(tr.Status.CompletionTime.Sub(tr.Status.StartTime.Time).Seconds())
		}
	}
	r.wake(r.Ledger.Release(task))
	return nil
}

// ensureClean starts the clean TaskRun that removes the task's build user from host.
func (r *Reconciler) ensureClean(ctx context.Context, tr *pipelinev1.TaskRun, hostName string) error {
	host := r.Config.Host(hostName)
	if host == nil {
		r.event(tr, corev1.EventTypeWarning, "CleanSkipped", "host %s is no longer configured; its build user for this task must be removed by hand (or by the host's update task)", hostName)
		return nil
	}
	err := r.Client.Create(ctx, r.cleanTaskRun(tr, host, platformOf(tr)))
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// fail answers the task with an error secret it prints before it exits.
func (r *Reconciler) fail(ctx context.Context, tr *pipelinev1.TaskRun, reason, message string) error {
	if err := tasksecret.Apply(ctx, r.Client, tasksecret.ForError(ownerOf(tr), message)); err != nil {
		return err
	}
	errorSecrets.WithLabelValues(reason).Inc()
	r.event(tr, corev1.EventTypeWarning, reason, "%s", message)
	if tr.Labels[contract.WaitingForPlatformLabel] != "" {
		return r.patchLabels(ctx, tr, func(tr *pipelinev1.TaskRun) { delete(tr.Labels, contract.WaitingForPlatformLabel) })
	}
	return nil
}

func (r *Reconciler) deleteSecret(ctx context.Context, tr *pipelinev1.TaskRun) error {
	s := &corev1.Secret{}
	s.Namespace, s.Name = tr.Namespace, contract.SecretPrefix+tr.Name
	return client.IgnoreNotFound(r.Client.Delete(ctx, s))
}

// patchLabels changes a TaskRun's metadata with a merge patch under optimistic locking. Cached
// TaskRuns are stripped of what berth does not read, so they must never be written whole.
func (r *Reconciler) patchLabels(ctx context.Context, tr *pipelinev1.TaskRun, mutate func(*pipelinev1.TaskRun)) error {
	before := tr.DeepCopy()
	if tr.Labels == nil {
		tr.Labels = map[string]string{}
	}
	mutate(tr)
	if maps.Equal(before.Labels, tr.Labels) && maps.Equal(before.Annotations, tr.Annotations) && slices.Equal(before.Finalizers, tr.Finalizers) {
		return nil
	}
	return r.Client.Patch(ctx, tr, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

func failedHosts(tr *pipelinev1.TaskRun) []string {
	v := tr.Annotations[contract.FailedHostsAnnotation]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

func ownerOf(tr *pipelinev1.TaskRun) tasksecret.Owner {
	return tasksecret.Owner{Name: tr.Name, Namespace: tr.Namespace, UID: tr.UID}
}

func (r *Reconciler) internal(ctx context.Context, name string) (*pipelinev1.TaskRun, error) {
	var tr pipelinev1.TaskRun
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, &tr)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return &tr, err
}

func (r *Reconciler) cancel(ctx context.Context, tr *pipelinev1.TaskRun) error {
	if tr.Spec.Status == pipelinev1.TaskRunSpecStatusCancelled {
		return nil
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"status":"`+pipelinev1.TaskRunSpecStatusCancelled+`"}}`))
	return client.IgnoreNotFound(r.Client.Patch(ctx, tr, patch))
}

func (r *Reconciler) deleteInternal(ctx context.Context, tr *pipelinev1.TaskRun) error {
	return client.IgnoreNotFound(r.Client.Delete(ctx, tr, client.Preconditions{UID: &tr.UID}))
}

func conditionMessage(tr *pipelinev1.TaskRun) string {
	for _, c := range tr.Status.Conditions {
		if c.Type == "Succeeded" && c.Message != "" {
			return c.Message
		}
	}
	return "the TaskRun failed without a message"
}
