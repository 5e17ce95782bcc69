package taskrun

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/localaffinity"
	"github.com/berth-ci/berth/internal/remote"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// reconcileUser moves a user TaskRun through the phases of its record.
func (r *Reconciler) reconcileUser(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	if tr.DeletionTimestamp != nil || tr.IsDone() {
		return r.finish(ctx, tr, rec)
	}
	if rec == nil {
		secret, err := r.secretOf(ctx, tr.Namespace, tr.Name)
		if err != nil {
			return reconcile.Result{}, err
		}
		if secret != nil && ownedBy(secret, tr.UID) {
			r.leaveLine(tr) // answered already: local or an error
			return reconcile.Result{}, nil
		}
		return r.admit(ctx, tr)
	}
	var results outcomes
	sets := r.mirrorSetCount(tr.UID)
	switch rec.Status.Phase {
	case berthv1.PhaseWaiting, "":
		results.add(r.reserve(ctx, tr, rec))
	case berthv1.PhaseProvisioning:
		results.add(r.hold(ctx, tr, rec))
	case berthv1.PhaseReady:
		results.add(r.guardSecret(ctx, tr, rec, rec.Status.SecretDigest))
	}
	if len(rec.Status.Debts) > 0 {
		results.add(r.payDebts(ctx, rec))
	}
	// The mirrors follow rec only when nothing above moved on from it. A step that wrote a
	// new record set the mirrors from that one (a reserved host, a wait, an error), and a
	// failed write proved rec stale: mirroring rec would take back what is true for a moment
	// (a reserved task shown waiting again), and the next reconcile would take berth's own
	// write for a tenant's edit and revert it with a MirrorReverted warning.
	if !results.stale && r.mirrorSetCount(tr.UID) == sets {
		results.add(r.mirror(ctx, tr, rec))
	}
	return results.result()
}

// admit decides how the task's platform is served, or why it cannot be.
func (r *Reconciler) admit(ctx context.Context, tr *pipelinev1.TaskRun) (reconcile.Result, error) {
	a := r.admission(r.Config.Config(), tr)
	if !a.holdsHost() {
		r.leaveLine(tr) // refused, or served locally: it never takes a slot
	}
	switch {
	case a.reason != "":
		return reconcile.Result{}, r.fail(ctx, tr, a.reason, a.message)
	case !a.strategy.holdsHosts():
		return reconcile.Result{}, r.serveLocally(ctx, tr)
	}
	return r.reserve(ctx, tr, r.newRecord(tr, a.kind))
}

// admission is how the config in force serves a task's platform, or why it refuses the task.
type admission struct {
	kind     config.Strategy
	strategy strategy
	// reason and message say why the task is refused; reason is "" when it is not.
	reason, message string
}

// holdsHost tells an admitted task that takes a slot of a host.
func (a admission) holdsHost() bool { return a.reason == "" && a.strategy.holdsHosts() }

// admission decides, from cfg alone (nil: no config in force), whether the task may be served
// and how.
func (r *Reconciler) admission(cfg *config.Config, tr *pipelinev1.TaskRun) admission {
	if cfg == nil {
		msg := "berth has no valid host configuration yet, so no platform can be served. Ask the platform team to create or fix the ConfigMap labelled " + contract.ConfigLabel + " in namespace " + r.Namespace + "."
		if rejected, _ := r.Config.Rejected(); rejected != nil {
			msg = fmt.Sprintf("berth's host configuration cannot be used at all (%s), so no platform can be served until it is fixed in the ConfigMap labelled %s in namespace %s.",
				rejected.Fatal().Summary(), contract.ConfigLabel, r.Namespace)
		}
		return admission{reason: "ConfigInvalid", message: msg}
	}
	platform := contract.Platform(tr)
	if !cfg.NamespaceAllowed(tr.Namespace) {
		return admission{reason: "NamespaceNotAllowed", message: fmt.Sprintf(
			"namespace %s may not use multi-platform builds (platform %s): it is not in allowed-namespaces of berth's host configuration. Ask the platform team to allow it.", tr.Namespace, platform)}
	}
	kind, known := cfg.Strategy(config.Platform(platform))
	a := admission{kind: kind, strategy: r.strategyFor(kind)}
	switch broken := cfg.Broken(config.Platform(platform)); {
	case !known:
		a.reason, a.message = "UnknownPlatform", fmt.Sprintf(
			"platform %q is not configured: berth serves %s. Fix the PLATFORM param of the task, or ask the platform team to add the platform.", platform, knownPlatforms(cfg))
	case len(broken) > 0:
		a.reason, a.message = "ConfigInvalid", fmt.Sprintf(
			"the host configuration of platform %s is broken, so berth cannot serve it (%s). Ask the platform team to fix it in the ConfigMap labelled %s in namespace %s; `berth config validate` lists every problem.",
			platform, broken.Summary(), contract.ConfigLabel, r.Namespace)
	case a.strategy == nil:
		a.reason, a.message = "PlatformUnsupported", fmt.Sprintf(
			"platform %s is configured as %s, which this berth does not serve: use a static host or a local platform for it.", platform, kind)
	}
	return a
}

func knownPlatforms(cfg *config.Config) string {
	var names []string
	for _, p := range cfg.UsablePlatforms() {
		names = append(names, string(p))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// serveLocally tells the task to build where it runs. Nothing is held, so nothing is recorded.
// A platform that names an architecture builds right only on a node of it: its pod must be
// pinned there (the webhook does it when the TaskRun is created), or the task gets an error.
func (r *Reconciler) serveLocally(ctx context.Context, tr *pipelinev1.TaskRun) error {
	platform := contract.Platform(tr)
	if node, ok := localaffinity.NodeOf(platform); ok && !localaffinity.Enforced(localaffinity.Of(tr), node) {
		err := r.fail(ctx, tr, "LocalAffinityMissing", fmt.Sprintf(
			"platform %s is local, so this task builds in its own pod, which must run on a %s/%s node; but the TaskRun's spec.podTemplate does not require %s=%s and %s=%s in every required node selector term, so the pod could run on a node of another architecture and build for it. berth's admission webhook adds that requirement when a TaskRun is created: it was not running when this one was, or the requirement was changed. Re-run the task; if this happens again, ask the platform team to check that berth's webhook is running (MutatingWebhookConfiguration %s).",
			platform, node.OS, node.Arch, corev1.LabelArchStable, node.Arch, corev1.LabelOSStable, node.OS, localaffinity.WebhookName))
		if err == nil {
			localAffinityMissing.WithLabelValues(platform).Inc()
		}
		return err
	}
	if err := r.writeSecret(ctx, tr, tasksecret.ForLocal(ownerOf(tr))); err != nil {
		return err
	}
	err := r.patchMirrors(ctx, tr, mirrorState{host: contract.Localhost, platform: platform})
	if err == nil {
		r.step(ctx, tr.Namespace+"/"+tr.Name, platform, contract.Localhost, "Local", "platform %s is local: the task builds on this cluster", platform)
	}
	return err
}

// reserve takes a slot for the task, or queues it. The record names host, admin login and build
// user before anything happens on the host; only once it is written does provisioning start.
func (r *Reconciler) reserve(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	task := taskOf(tr)
	grant := r.Capacity.Acquire(allocation.Request{Task: task, Platform: rec.Spec.Platform,
		Created: rec.Spec.Queued.Time, Exclude: rec.Status.FailedHosts})
	switch {
	case grant.Blocked:
		return r.giveUp(ctx, tr, rec, "AllHostsFailed", fmt.Sprintf(
			"no host of platform %s could be provisioned for this task (failed: %s). The hosts may be down or misconfigured; see the events of this TaskRun and tell the platform team.",
			rec.Spec.Platform, strings.Join(rec.Status.FailedHosts, ", ")))
	case grant.Host == "":
		return r.wait(ctx, tr, rec, grant.Position)
	}
	login, ok := r.strategyOf(rec).login(grant.Host)
	if !ok {
		r.Capacity.Release(task)
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	private, authorized, err := r.NewKey(r.keyType(), tr.Namespace+"/"+tr.Name)
	if err != nil {
		r.Capacity.Release(task)
		return reconcile.Result{}, err
	}
	next := rec.DeepCopy()
	next.Status.Phase = berthv1.PhaseProvisioning
	next.Status.Login = &login
	next.Status.Attempt++
	next.Status.BuildUser = hostops.UserNameFor(next.Spec.Platform, string(tr.UID), next.Status.Attempt)
	next.Status.UserDir, next.Status.Message = "", ""
	next.Status.ReservedAt = r.microStamp()
	if len(next.Status.SealKey) == 0 {
		if next.Status.SealKey, err = newSealKey(); err != nil {
			r.Capacity.Release(task)
			return reconcile.Result{}, err
		}
	}
	if err := r.save(ctx, next); err != nil {
		// A reservation made just now and not recorded is not held. One made by an earlier
		// reconcile is recorded already (this one read a stale copy): it stays.
		if !grant.Held {
			r.Capacity.Release(task)
		}
		return reconcile.Result{}, err
	}
	r.keys.Store(keyID(next), keyPair{private: private, authorized: authorized})
	waitSeconds.WithLabelValues(rec.Spec.Platform).Observe(r.now().Sub(tr.CreationTimestamp.Time).Seconds())
	r.step(ctx, tr.Namespace+"/"+tr.Name, rec.Spec.Platform, login.Host, "HostAssigned", "host %s reserved for platform %s; creating build user %s", login.Host, rec.Spec.Platform, next.Status.BuildUser)
	var results outcomes
	results.add(r.mirror(ctx, tr, next))
	results.add(r.provision(ctx, tr, next))
	return results.result()
}

type keyPair struct{ private, authorized []byte }

// keyType is the type of the keys build users get now: the config in force decides.
func (r *Reconciler) keyType() config.KeyType {
	if cfg := r.Config.Config(); cfg != nil && cfg.UserKeyType != "" {
		return cfg.UserKeyType
	}
	return config.DefaultKeyType
}

func keyID(rec *berthv1.Allocation) string {
	return string(rec.Spec.TaskRun.UID) + "/" + strconv.Itoa(rec.Status.Attempt)
}

// wait records the task as waiting and tells it its place; a freed slot wakes it. The only timed
// requeue is the wait timeout's.
func (r *Reconciler) wait(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, position int) (reconcile.Result, error) {
	var left time.Duration
	if r.WaitTimeout > 0 {
		// Counted from creation: the same answer after a restart.
		if left = r.WaitTimeout - r.now().Sub(tr.CreationTimestamp.Time); left <= 0 {
			r.Capacity.Release(taskOf(tr))
			return r.giveUp(ctx, tr, rec, "WaitTimeout", fmt.Sprintf(
				"no host of platform %s became free within %s; all are busy. Retry later, or ask the platform team for more capacity.", rec.Spec.Platform, r.WaitTimeout))
		}
	}
	reason, message, recheck := r.strategyOf(rec).busy(rec.Spec.Platform, r.now().Sub(rec.Spec.Queued.Time))
	if reason != "" {
		r.Capacity.Release(taskOf(tr))
		return r.giveUp(ctx, tr, rec, reason, message)
	}
	if recheck > 0 && (left == 0 || recheck < left) {
		left = recheck
	}
	if rec.ResourceVersion == "" {
		// A task that never held a slot waits without a record: the ledger's queue holds it,
		// its TaskRun's labels show it, and after a restart it is queued again as a user
		// TaskRun with neither record nor secret (see restoreQueue), by its creation time.
		// Only a task that had a host and must try another (provisioningFailed) has a
		// Waiting record, for the hosts that failed it and the users it owes.
		rec = rec.DeepCopy()
		rec.Status.Phase = berthv1.PhaseWaiting
		if !r.toldWaiting(tr, rec.Spec.Platform) {
			r.event(ctx, tr, "", corev1.EventTypeNormal, "Waiting", "every host of platform %s is busy; this task is number %d in line", rec.Spec.Platform, position)
		}
	}
	res, err := r.mirror(ctx, tr, rec)
	if left > 0 && (res.RequeueAfter == 0 || left < res.RequeueAfter) {
		res.RequeueAfter = left
	}
	return res, err
}

// toldWaiting tells whether the task was told it waits: this process mirrored the wait on it,
// or its TaskRun carries the waiting label (mirrored before a restart). A tenant who sets the
// label itself only spares itself the Event.
func (r *Reconciler) toldWaiting(tr *pipelinev1.TaskRun, platform string) bool {
	if last, ok := r.mirrors.Load(tr.UID); ok && last.(mirrorState).waiting {
		return true
	}
	return tr.Labels[contract.WaitingForPlatformLabel] == contract.PlatformLabelValue(platform)
}

// provision sees the build user's creation through and hands the task its secret.
func (r *Reconciler) provision(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	v, ok := r.keys.Load(keyID(rec))
	if !ok {
		// The private key lived only in the process that generated it (a restart, or another
		// replica): the user made with it is of no use. Remove it and start over under a new
		// name; never repair a user.
		return r.redo(ctx, tr, rec, "berth restarted while the build user was being created")
	}
	keys := v.(keyPair)
	j := job(rec, *rec.Status.Login, rec.Status.BuildUser)
	j.AuthorizedKey = keys.authorized
	if cfg := r.Config.Config(); cfg != nil {
		j.UIDs = cfg.BuildUIDs
	}
	out := r.Provisioner.Provision(ctx, j)
	if !out.Done {
		return reconcile.Result{}, nil // its end wakes us
	}
	if out.Err != nil {
		r.Provisioner.Forget(j.ID)
		r.keys.Delete(keyID(rec))
		return r.provisioningFailed(ctx, tr, rec, out.Err)
	}
	secret, err := r.readySecret(ctx, tr, rec, out.UserDir, keys.private)
	if err != nil {
		return reconcile.Result{}, err
	}
	handedOver := seal(secret, rec)
	if err := r.writeSecret(ctx, tr, secret); err != nil {
		return reconcile.Result{}, err
	}
	// The sealed secret is the record of the hand-over: the record itself is not written.
	r.ready.Store(keyID(rec), handedOver)
	r.keys.Delete(keyID(rec))
	r.Provisioner.Forget(j.ID)
	allocationSeconds.WithLabelValues(rec.Spec.Platform).Observe(r.now().Sub(rec.Status.ReservedAt.Time).Seconds())
	r.step(ctx, tr.Namespace+"/"+tr.Name, rec.Spec.Platform, rec.Status.Login.Host, "Provisioned", "build user %s ready on host %s", rec.Status.BuildUser, rec.Status.Login.Host)
	return reconcile.Result{}, nil
}

// redo owes the host the current user and provisions a new one on the same slot.
func (r *Reconciler) redo(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, why string) (reconcile.Result, error) {
	next := rec.DeepCopy()
	next.Status.Debts = append(next.Status.Debts, berthv1.Debt{HostLogin: *rec.Status.Login, BuildUser: rec.Status.BuildUser})
	private, authorized, err := r.NewKey(r.keyType(), tr.Namespace+"/"+tr.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	next.Status.Attempt++
	next.Status.BuildUser = hostops.UserNameFor(next.Spec.Platform, string(tr.UID), next.Status.Attempt)
	next.Status.Message = why
	if err := r.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	r.keys.Store(keyID(next), keyPair{private: private, authorized: authorized})
	r.event(ctx, tr, rec.Status.Login.Host, corev1.EventTypeNormal, "Reprovisioning", "%s; removing build user %s and creating %s on host %s", why, rec.Status.BuildUser, next.Status.BuildUser, rec.Status.Login.Host)
	var results outcomes
	results.add(reconcile.Result{}, r.revokeKeys(ctx, next)) // a key kept for the old user before the restart
	results.add(r.provision(ctx, tr, next))
	results.add(r.payDebts(ctx, next))
	return results.result()
}

// provisioningFailed gives up on the host for this task: what the attempt left there is owed
// (and keeps its slot until removed), the host goes into the failed hosts, and the task tries
// another.
func (r *Reconciler) provisioningFailed(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, cause error) (reconcile.Result, error) {
	login := *rec.Status.Login
	why := cause.Error()
	if errors.Is(cause, hostops.ErrUserExists) {
		why = "a user named " + rec.Status.BuildUser + " already exists there (left by an attempt cut short); berth never reuses a build user: it is removed, and the task tries again under a new name"
	}
	// A host berth never logged in to has no user to remove; any other failure may have left
	// a half-made one, which is owed a clean and keeps its slot until then.
	owed := !remote.NeverReached(cause)
	next := rec.DeepCopy()
	if owed {
		next.Status.Debts = append(next.Status.Debts, berthv1.Debt{HostLogin: login, BuildUser: rec.Status.BuildUser, HoldsSlot: true})
	}
	if !slices.Contains(next.Status.FailedHosts, login.Host) {
		next.Status.FailedHosts = append(next.Status.FailedHosts, login.Host)
	}
	next.Status.Phase, next.Status.Login, next.Status.BuildUser, next.Status.Message = berthv1.PhaseWaiting, nil, "", why
	if err := r.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	if owed {
		r.Capacity.Transfer(taskOf(tr), debtTask(next, rec.Status.BuildUser))
	} else {
		r.Capacity.Release(taskOf(tr))
	}
	reason := "ProvisioningFailed"
	if remote.IsHostKeyChanged(cause) {
		reason = "HostKeyChanged" // a replaced host, or someone in the middle: people must look
	}
	r.hostFailed(ctx, tr, next, login.Host, reason, cause, why)
	var results outcomes
	results.add(r.payDebts(ctx, next))
	results.add(r.reserve(ctx, tr, next))
	return results.result()
}

// guardSecret notices a tenant's edit or deletion of the task's secret. The host is never
// touched again for that user but to remove it; the secret is written back holding only an
// error, so the task fails at once instead of hanging.
func (r *Reconciler) guardSecret(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, want string) (reconcile.Result, error) {
	if want == "" {
		return reconcile.Result{}, nil // adopted from an earlier controller: its secret is not ours to judge
	}
	secret, err := r.secretOf(ctx, tr.Namespace, tr.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if secret != nil && cachedDigest(secret) == want {
		return reconcile.Result{}, nil
	}
	// The cache may simply lag behind our own write: ask the apiserver before judging.
	var live corev1.Secret
	err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: tr.Namespace, Name: tasksecret.Name(tr.Name)}, &live)
	if err == nil && digest(live.Data) == want {
		return reconcile.Result{}, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if rec.Status.SecretTampered {
		if left := r.revertWait(tr); left > 0 {
			return reconcile.Result{RequeueAfter: left}, nil
		}
	}
	msg := fmt.Sprintf("the secret %s was changed or deleted after berth wrote it, so it can no longer be trusted; berth will not touch build user %s again except to remove it. Re-run the task.",
		tasksecret.Name(tr.Name), rec.Status.BuildUser)
	errSecret := tasksecret.ForError(ownerOf(tr), msg)
	// The record first: once the tenant sees the error secret, berth's records already say the
	// user is not to be touched again. A crash between the two writes leaves a record whose
	// digest the secret does not match, which brings the next pass back here.
	next := rec.DeepCopy()
	next.Status.SecretTampered, next.Status.SecretDigest, next.Status.Message = true, digest(errSecret.Data), msg
	if err := r.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	// A token the tenant read out of the secret before changing it redeems nothing now.
	if err := r.revokeKeys(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.writeSecret(ctx, tr, errSecret); err != nil {
		return reconcile.Result{}, err
	}
	r.ready.Store(keyID(rec), next.Status.SecretDigest) // a pass on a stale copy of the record judges by it
	r.noteRevert(tr)
	errorSecrets.WithLabelValues("SecretTampered").Inc()
	r.event(ctx, tr, "", corev1.EventTypeWarning, "SecretTampered", "%s", msg)
	return reconcile.Result{}, nil
}

// giveUp answers the task with an error; what the record still owes the hosts is paid first.
func (r *Reconciler) giveUp(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, reason, message string) (reconcile.Result, error) {
	if err := r.fail(ctx, tr, reason, message); err != nil {
		return reconcile.Result{}, err
	}
	if rec.ResourceVersion == "" {
		return reconcile.Result{}, nil
	}
	if len(rec.Status.Debts) == 0 {
		return reconcile.Result{}, r.drop(ctx, rec)
	}
	next := rec.DeepCopy()
	next.Status.Phase, next.Status.Message = berthv1.PhaseCleaning, message
	if err := r.save(ctx, next); err != nil {
		return reconcile.Result{}, err
	}
	return r.payDebts(ctx, next)
}

// finish cleans up after a task that ended or is being deleted, in an order that survives a
// crash between any two steps: a record whose TaskRun has ended owes its build user (and holds
// its slot) whatever its phase says, so the finalizer can go at once and a dead host never
// blocks the TaskRun's deletion; the slot is freed only once the user is gone. The secret
// stays: its key logs in as a user that is being removed, and it goes with its TaskRun (its
// owner reference), or when a new TaskRun of the name needs the name (dropStaleSecret).
func (r *Reconciler) finish(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	if rec == nil {
		if err := r.releaseUnrecorded(taskOf(tr)); err != nil {
			return reconcile.Result{}, err
		}
	} else {
		var err error
		if rec, err = r.endRecord(ctx, rec); err != nil {
			return reconcile.Result{}, err
		}
	}
	if _, err := r.mirror(ctx, tr, nil); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if rec != nil && tr.Status.CompletionTime != nil && tr.Status.StartTime != nil && rec.Status.ReservedAt != nil {
		taskSeconds.WithLabelValues(rec.Spec.Platform).Observe(tr.Status.CompletionTime.Sub(tr.Status.StartTime.Time).Seconds())
	}
	if rec == nil {
		// What berth last wrote on the TaskRun is kept until its record is gone: the passes in
		// between (the clean ending a moment later) must not take the cache's older copy for
		// the TaskRun as it is, and patch it again on that copy.
		r.forgetMirrors(tr.UID)
		return reconcile.Result{}, nil
	}
	return r.payDebts(ctx, rec)
}

// releaseUnrecorded takes a task the cache shows no record of out of the ledger's queues. A
// task holding a slot always has a record (it is written as soon as the slot is taken), so a
// held one means the cache is behind berth's own write: freeing its slot now would hand it to
// a second task while the first one's build user may be on the host.
func (r *Reconciler) releaseUnrecorded(task allocation.Task) error {
	if _, held := r.Capacity.Holder(task); held {
		return errStale
	}
	r.Capacity.Release(task)
	return nil
}

// endRecord turns an ended task's hold into a debt of the record, in memory: the record is
// written only when a debt outlives this pass (a clean that failed, see settleDebts). Until
// then the record in the apiserver still names the user as held, which is the same debt to
// the next pass or the next start, since the TaskRun it was held for has ended. A record in
// Cleaning was written so and is returned as it is.
func (r *Reconciler) endRecord(ctx context.Context, rec *berthv1.Allocation) (*berthv1.Allocation, error) {
	if rec.Status.Phase == berthv1.PhaseCleaning {
		return rec, nil
	}
	next := rec.DeepCopy()
	held := rec.Status.Login != nil && (rec.Status.Phase == berthv1.PhaseProvisioning || rec.Status.Phase == berthv1.PhaseReady)
	if held {
		next.Status.Debts = append(next.Status.Debts, berthv1.Debt{HostLogin: *rec.Status.Login, BuildUser: rec.Status.BuildUser, HoldsSlot: true})
	}
	next.Status.Phase, next.Status.Login = berthv1.PhaseCleaning, nil
	next.Status.EndedAt = r.microStamp()
	task := taskOfRecord(rec)
	// The first pass moves the slot over; a later one (the clean still running) finds it moved.
	first := !held
	if held && r.Capacity.Transfer(task, debtTask(next, rec.Status.BuildUser)) {
		first = true
		r.keys.Delete(keyID(rec))
		r.ready.Delete(keyID(rec))
		r.step(ctx, task.String(), rec.Spec.Platform, rec.Status.Login.Host, "HostReleased", "task %s ended; removing build user %s from host %s before its slot is freed",
			task, rec.Status.BuildUser, rec.Status.Login.Host)
	}
	r.Capacity.Release(task)
	if !first {
		return next, nil
	}
	// Once, as the task ends: the redemption already refuses keys of an ended task, and the
	// sweeper deletes what this misses.
	return next, r.revokeKeys(ctx, next)
}

// settleOrphan finishes a record whose TaskRun is gone (or was re-created under its name).
func (r *Reconciler) settleOrphan(ctx context.Context, rec *berthv1.Allocation) (reconcile.Result, error) {
	rec, err := r.endRecord(ctx, rec)
	if err != nil {
		return reconcile.Result{}, err
	}
	ref := rec.Spec.TaskRun
	if err := r.deleteSecret(ctx, ref.Namespace, ref.Name, ref.UID); err != nil {
		return reconcile.Result{}, err
	}
	r.forgetMirrors(ref.UID)
	return r.payDebts(ctx, rec)
}

// forgetMirrors drops what berth keeps about a TaskRun's mirrors once it has ended or gone.
func (r *Reconciler) forgetMirrors(uid types.UID) {
	r.mirrors.Delete(uid)
	r.patched.Delete(uid)
	r.mirrorSets.Delete(uid)
	r.reverted.Delete(uid)
	r.full.Delete(uid)
}

// payDebts removes owed build users, with backoff on failure, whatever the config says now:
// the record holds the address and admin-key reference. A paid debt frees its slot; a record
// with nothing owed and no running task goes.
func (r *Reconciler) payDebts(ctx context.Context, rec *berthv1.Allocation) (reconcile.Result, error) {
	var paid []berthv1.Debt
	var failed error
	var failedDebt berthv1.Debt
	var failures []failedClean
	for _, d := range rec.Status.Debts {
		if gone, err := r.vmGone(ctx, d.HostLogin); err != nil {
			return reconcile.Result{}, err
		} else if gone {
			paid = append(paid, d) // the VM went with the user on it
			continue
		}
		j := job(rec, d.HostLogin, d.BuildUser)
		out := r.Provisioner.Clean(ctx, j)
		switch {
		case !out.Done:
		case out.Err != nil:
			r.Provisioner.Forget(j.ID)
			if failed == nil {
				failed, failedDebt = out.Err, d
			}
			failures = append(failures, failedClean{debt: d, err: out.Err})
		default:
			paid = append(paid, d)
		}
	}
	if len(paid) == 0 && failed == nil {
		if len(rec.Status.Debts) == 0 && rec.Status.Phase == berthv1.PhaseCleaning {
			return reconcile.Result{}, r.drop(ctx, rec)
		}
		return reconcile.Result{}, nil
	}
	next := rec.DeepCopy()
	var retry time.Duration
	if failed != nil {
		next.Status.CleanFailures++
		next.Status.Message = fmt.Sprintf("removing build user %s from host %s failed: %v", failedDebt.BuildUser, failedDebt.Host, failed)
		retry = cleanBackoff(next.Status.CleanFailures)
	} else {
		next.Status.CleanFailures = 0
	}
	if err := r.settleDebts(ctx, rec, next, paid); err != nil {
		return reconcile.Result{}, err
	}
	if failed != nil {
		cleanFailures.WithLabelValues(failedDebt.Host).Inc()
		r.recordEvent(ctx, rec, failedDebt.Host, corev1.EventTypeWarning, "CleanFailed", "%s; retrying in %s", next.Status.Message, retry)
	}
	r.judgeCleans(ctx, rec, paid, failures, next.Status.CleanFailures, retry)
	return reconcile.Result{RequeueAfter: retry}, nil
}

// settleDebts records that the debts in settled are no longer owed (paid, or forgotten): next,
// rec's update, is written without them, or the record goes when its task has ended and it owes
// nothing more. Then their jobs are forgotten and the slots they held freed.
func (r *Reconciler) settleDebts(ctx context.Context, rec, next *berthv1.Allocation, settled []berthv1.Debt) error {
	next.Status.Debts = slices.DeleteFunc(next.Status.Debts, func(d berthv1.Debt) bool {
		return slices.ContainsFunc(settled, func(p berthv1.Debt) bool { return p.BuildUser == d.BuildUser && p.Host == d.Host })
	})
	for _, d := range settled {
		if d.HoldsSlot {
			if err := r.strategyOf(rec).releasing(ctx, d.Host); err != nil {
				return err
			}
		}
	}
	var err error
	if len(next.Status.Debts) == 0 && next.Status.Phase == berthv1.PhaseCleaning {
		err = r.drop(ctx, rec)
	} else {
		err = r.save(ctx, next)
	}
	if err != nil {
		return err
	}
	for _, d := range settled {
		r.Provisioner.Forget(job(rec, d.HostLogin, d.BuildUser).ID)
		if d.HoldsSlot {
			r.Capacity.Release(debtTask(rec, d.BuildUser))
		}
	}
	return nil
}

// cleanBackoff spaces out retries of a failing clean: 1s, 2s, 4s, … up to five minutes.
func cleanBackoff(failures int) time.Duration {
	d := time.Second << min(failures-1, 9)
	return min(d, 5*time.Minute)
}

// fail answers the task with an error secret it prints before it exits.
func (r *Reconciler) fail(ctx context.Context, tr *pipelinev1.TaskRun, reason, message string) error {
	if err := r.writeSecret(ctx, tr, tasksecret.ForError(ownerOf(tr), message)); err != nil {
		return err
	}
	errorSecrets.WithLabelValues(reason).Inc()
	r.event(ctx, tr, "", corev1.EventTypeWarning, reason, "%s", message)
	return r.patchMirrors(ctx, tr, mirrorState{platform: contract.Platform(tr)})
}

// writeSecret creates the task's secret, or replaces one berth wrote earlier for this same
// TaskRun (delete, then create: berth never needs to update a secret). A secret of that name
// that berth did not write for this TaskRun is left alone and reported.
func (r *Reconciler) writeSecret(ctx context.Context, tr *pipelinev1.TaskRun, s *corev1.Secret) error {
	err := r.Client.Create(ctx, s)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	var existing corev1.Secret
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s), &existing); err != nil {
		if apierrors.IsNotFound(err) {
			return errStale
		}
		return err
	}
	if !ownedBy(&existing, tr.UID) {
		r.event(ctx, tr, "", corev1.EventTypeWarning, "SecretConflict", "a secret named %s exists that berth did not write for this TaskRun; delete it so berth can answer the task", s.Name)
		return fmt.Errorf("secret %s/%s exists and is not berth's", s.Namespace, s.Name)
	}
	if err := r.Client.Delete(ctx, &existing, client.Preconditions{UID: &existing.UID, ResourceVersion: &existing.ResourceVersion}); client.IgnoreNotFound(err) != nil {
		return err
	}
	return r.Client.Create(ctx, s)
}

// deleteSecret removes the task's secret if berth wrote it for that TaskRun; any other secret
// of the name is not berth's to delete.
func (r *Reconciler) deleteSecret(ctx context.Context, namespace, name string, uid types.UID) error {
	s, err := r.secretOf(ctx, namespace, name)
	if err != nil || s == nil || !ownedBy(s, uid) {
		return err
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, s, client.Preconditions{UID: &s.UID}))
}

// dropStaleSecret deletes the secret berth wrote under this name for a TaskRun that is gone:
// one deleted without berth's finalizer (a local or error answer holds none), or replaced by a
// new TaskRun of the same name (current, "" if none). Also one deleted while berth was down:
// every secret of berth's reaches this on start.
// The owner reference would let a garbage collector do this, some time later; berth does not
// count on one running, and a stale secret would stand in the way of the new TaskRun's answer.
// A secret berth did not write is never touched.
func (r *Reconciler) dropStaleSecret(ctx context.Context, key types.NamespacedName, current types.UID) error {
	s, err := r.secretOf(ctx, key.Namespace, key.Name)
	if err != nil || s == nil || s.Labels[contract.SecretLabel] != "true" || ownedBy(s, current) {
		return err
	}
	writtenFor := taskRunOwner(s, key.Name)
	if writtenFor == "" {
		return nil
	}
	// The cache may lag behind the apiserver: ask it before deleting a task's only way to start.
	var live metav1.PartialObjectMetadata
	live.SetGroupVersionKind(pipelinev1.SchemeGroupVersion.WithKind("TaskRun"))
	switch err := r.APIReader.Get(ctx, key, &live); {
	case err == nil && live.UID == writtenFor:
		return errStale
	case err != nil && !apierrors.IsNotFound(err):
		return err
	}
	return r.deleteSecret(ctx, key.Namespace, key.Name, writtenFor)
}

// taskRunOwner is the UID of the TaskRun named name that owns the secret ("" if none does).
func taskRunOwner(s *corev1.Secret, name string) types.UID {
	for _, o := range s.OwnerReferences {
		if o.Kind == "TaskRun" && o.Name == name {
			return o.UID
		}
	}
	return ""
}

// ownedBy tells a secret berth wrote for the TaskRun with this UID: its label and its owner.
func ownedBy(s *corev1.Secret, uid types.UID) bool {
	if s.Labels[contract.SecretLabel] != "true" {
		return false
	}
	for _, o := range s.OwnerReferences {
		if o.UID == uid && o.Kind == "TaskRun" {
			return true
		}
	}
	return false
}

func ownerOf(tr *pipelinev1.TaskRun) tasksecret.Owner {
	return tasksecret.Owner{Name: tr.Name, Namespace: tr.Namespace, UID: tr.UID}
}

func (r *Reconciler) stamp() *metav1.Time {
	t := metav1.NewTime(r.now())
	return &t
}

// microStamp is stamp to the microsecond, for the times latencies are measured from.
func (r *Reconciler) microStamp() *berthv1.MicroTime {
	t := berthv1.NewMicroTime(r.now())
	return &t
}

// vmGone tells whether login is a VM that berth has terminated: nothing is owed to it.
func (r *Reconciler) vmGone(ctx context.Context, login berthv1.HostLogin) (bool, error) {
	if login.Instance == "" || r.VMs == nil {
		return false, nil
	}
	return r.VMs.Gone(ctx, login.Host)
}
