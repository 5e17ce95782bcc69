package taskrun

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/provision"
)

// SwitchoverMarker is the ConfigMap, in the controller's namespace, that says the one-time
// adoption of TaskRuns left by an earlier controller has happened on this cluster.
const SwitchoverMarker = "berth-switchover"

// line keeps the ledger's lines true to the cluster: it rebuilds them from the records on
// start (and adopts what an earlier controller left), and puts a TaskRun in line the moment
// the watch shows it.
type line struct {
	client    client.Client
	apiReader client.Reader
	namespace string
	config    *hostconfig.Store
	capacity  *capacity.Capacity
	gate      gate
	secrets   *taskSecrets
	records   *recordStore
	mirror    *taskMirror
	recorder  events.EventRecorder
	now       func() time.Time
	// upstreamNamespace is where the controller berth replaces runs its provision TaskRuns.
	upstreamNamespace string
	// users lists a host's build users at the switch-over (nil: this provisioner cannot).
	users provision.UserLister
	// started is when this controller started: only TaskRuns older than that can have been
	// served by the controller berth replaces.
	started time.Time
	mu      sync.Mutex // one restore at a time
}

// restoreOnce rebuilds the ledger from the records, and only from them, before the first
// decision: who holds which slot, who waits in which order, which cleanups still hold slots.
// It needs the config (which hosts exist) and nothing else. Reconciles wait for it.
func (l *line) restoreOnce(ctx context.Context) (bool, error) {
	if l.capacity.Restored() {
		return true, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.capacity.Restored() {
		return true, nil
	}
	if !l.config.Synced() {
		return false, nil
	}
	var list berthv1.AllocationList
	if err := l.client.List(ctx, &list, client.InNamespace(l.namespace)); err != nil {
		return false, err
	}
	l.restoreTurns(list.Items)
	newest := map[allocation.Task]*berthv1.Allocation{}
	for i := range list.Items {
		rec := &list.Items[i]
		if n := newest[taskOfRecord(rec)]; n == nil || n.CreationTimestamp.Before(&rec.CreationTimestamp) {
			newest[taskOfRecord(rec)] = rec
		}
	}
	for i := range list.Items {
		rec := &list.Items[i]
		l.restoreRecord(rec, newest[taskOfRecord(rec)] != rec)
	}
	if err := l.restoreQueue(ctx, list.Items); err != nil {
		return false, err
	}
	// A drained or quarantined host must not be handed out in the moments before the
	// BuildHost loop gets to it.
	var hosts berthv1.BuildHostList
	if err := l.client.List(ctx, &hosts, client.InNamespace(l.namespace)); err != nil {
		return false, err
	}
	for i := range hosts.Items {
		l.capacity.Follow(&hosts.Items[i])
	}
	if err := l.adoptOnce(ctx); err != nil {
		return false, err
	}
	l.capacity.MarkRestored()
	for i := range list.Items {
		ref := list.Items[i].Spec.TaskRun
		l.capacity.Wake(allocation.Task{Namespace: ref.Namespace, Name: ref.Name})
	}
	return true, nil
}

// restoreQueue queues again the tasks that waited without a record: user TaskRuns still
// running that have neither a record nor a secret of berth's, on a platform whose tasks hold
// hosts, each at its creation time, so that a slot freed before every TaskRun has been
// reconciled goes to the first in line and not to whichever the cache listed first. A task
// queued here that admission then refuses (its namespace or platform no longer allowed) is
// taken out of the queue by its own reconcile.
func (l *line) restoreQueue(ctx context.Context, records []berthv1.Allocation) error {
	cfg := l.config.Config()
	if cfg == nil {
		return nil
	}
	recorded := make(map[types.UID]bool, len(records))
	for i := range records {
		recorded[records[i].Spec.TaskRun.UID] = true
	}
	// Read only, so the cache's own objects will do.
	var list pipelinev1.TaskRunList
	if err := l.client.List(ctx, &list, userTasks, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	for i := range list.Items {
		tr := &list.Items[i]
		if recorded[tr.UID] {
			continue
		}
		if req, ok, err := l.request(ctx, cfg, tr); err != nil {
			return err
		} else if ok {
			l.capacity.Enqueue(req)
		}
	}
	return nil
}

// request is the ledger's request for a user TaskRun that waits for a slot without a
// record: still running, admitted by cfg to a platform whose tasks hold hosts, and not answered
// by a secret of berth's (an error, or a user handed over whose record is gone) or of the
// controller berth replaced (answeredElsewhere). ok is false
// for any other TaskRun. Whoever asks has checked that it has no record.
func (l *line) request(ctx context.Context, cfg *config.Config, tr *pipelinev1.TaskRun) (allocation.Request, bool, error) {
	if tr.IsDone() || tr.DeletionTimestamp != nil || l.gate.classify(tr) != userTask {
		return allocation.Request{}, false, nil
	}
	if !l.gate.admission(cfg, tr).holdsHost() {
		return allocation.Request{}, false, nil
	}
	if s, err := l.secrets.of(ctx, tr.Namespace, tr.Name); err != nil || (s != nil && (ownedBy(s, tr.UID) || answeredElsewhere(s))) {
		return allocation.Request{}, false, err
	}
	return allocation.Request{Task: taskOf(tr), Platform: contract.Platform(tr), Created: tr.CreationTimestamp.Time}, true, nil
}

// join puts a user TaskRun in its platform's line the moment the watch shows it, before
// its reconcile: the ledger knows every waiter at once, so a freed slot goes by the ledger's
// turns (namespaces in turn, the oldest first) even while the reconciles that label arrivals
// wait behind hand-overs (see handOverPriority). It tells whether the task can go now. Its
// reconcile is the authority still: it takes the slot, or takes the task out of line when it
// is refused or answered (leaveLine). Until the queue is restored, restoreQueue does this.
// Every event of a task the ledger knows (waiting or holding) ends at the first check, so
// only arrivals cost the cache reads.
func (l *line) join(ctx context.Context, tr *pipelinev1.TaskRun) bool {
	if !l.capacity.Restored() || l.capacity.Knows(taskOf(tr), contract.Platform(tr)) {
		return false
	}
	if records, err := l.records.of(ctx, client.ObjectKeyFromObject(tr)); err != nil || len(records) > 0 {
		return false
	}
	req, ok, err := l.request(ctx, l.config.Config(), tr)
	return err == nil && ok && l.capacity.Join(req)
}

// leave takes a task that holds no slot out of its line: it was refused or answered
// without one, and must not stand first in line for a slot it will never take.
func (l *line) leave(tr *pipelinev1.TaskRun) {
	task := taskOf(tr)
	if _, held := l.capacity.Holder(task); !held {
		l.capacity.Release(task)
	}
}

// restoreTurns tells the ledger whose turn came when, in the order the records' slots were
// reserved, so that namespaces take turns after a restart as they did before it (and as
// `berth status`, which rebuilds the ledger the same way, shows).
func (l *line) restoreTurns(records []berthv1.Allocation) {
	var reserved []*berthv1.Allocation
	for i := range records {
		if records[i].Status.ReservedAt != nil {
			reserved = append(reserved, &records[i])
		}
	}
	slices.SortStableFunc(reserved, func(a, b *berthv1.Allocation) int {
		return a.Status.ReservedAt.Time.Compare(b.Status.ReservedAt.Time)
	})
	for _, rec := range reserved {
		l.capacity.RestoreTurn(rec.Spec.Platform, rec.Spec.TaskRun.Namespace)
	}
}

// restoreRecord puts what the record holds into the ledger. A record that holds a slot for an
// older TaskRun of a name a newer record also has (one deleted and created again) belongs to a
// task that has ended: its slot is the clean it owes, not the name's, which the newer TaskRun
// holds or waits for.
func (l *line) restoreRecord(rec *berthv1.Allocation, superseded bool) {
	task := taskOfRecord(rec)
	switch rec.Status.Phase {
	case berthv1.PhaseProvisioning, berthv1.PhaseReady:
		if rec.Status.Login == nil {
			break
		}
		if superseded {
			task = debtTask(rec, rec.Status.BuildUser)
		}
		l.capacity.Restore(task, rec.Status.Login.Host, rec.Spec.Platform)
	case berthv1.PhaseWaiting:
		l.capacity.Enqueue(allocation.Request{Task: task, Platform: rec.Spec.Platform,
			Created: rec.Spec.Queued.Time, Exclude: rec.Status.FailedHosts})
	}
	for _, d := range rec.Status.Debts {
		if d.HoldsSlot {
			l.capacity.Restore(debtTask(rec, d.BuildUser), d.Host, d.Platform)
		}
	}
}

// adoptOnce takes over, at berth's first start on a cluster, the TaskRuns that an earlier
// controller (or an earlier berth) left holding a static host: each gets a record owing its build
// user, so its cleanup happens and its finalizer never sticks. A TaskRun's labels and finalizer
// only make it a candidate (a tenant can write them); it is adopted only on what that controller
// itself left (prove), and never for a user another candidate could own (claimedBuildUsers).
// After that, labels are never read.
func (l *line) adoptOnce(ctx context.Context) error {
	var marker corev1.ConfigMap
	err := l.apiReader.Get(ctx, client.ObjectKey{Namespace: l.namespace, Name: SwitchoverMarker}, &marker)
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	candidates, err := l.adoptionCandidates(ctx)
	if err != nil {
		return err
	}
	provisions, err := l.upstreamProvisions(ctx)
	if err != nil {
		return err
	}
	proofs := l.prove(ctx, candidates, provisions)
	claims := claimedBuildUsers(candidates)
	adopted := 0
	for _, tr := range candidates {
		hostName := tr.Labels[contract.AssignedHostLabel]
		host := l.config.Host(hostName)
		if host == nil {
			// Nothing berth knows how to reach: let the TaskRun go rather than hold it forever.
			tell(ctx, l.recorder, tr, hostName, corev1.EventTypeWarning, "AdoptionFailed", "host %q of this TaskRun is not in berth's host configuration; its build user (if any) must be removed by hand", hostName)
			if err := client.IgnoreNotFound(l.mirror.patch(ctx, tr, mirrorState{ended: true})); err != nil {
				return err
			}
			continue
		}
		p := proofs[tr.UID]
		if p.user == "" {
			// The label is the tenant's word only: the task is served as a new one, and the
			// mirror rewrites its labels from the record it gets.
			tell(ctx, l.recorder, tr, host.Name, corev1.EventTypeWarning, "AdoptionUnproven", "this TaskRun is labelled with host %s, but %s; berth serves it as a new task unless it has the secret of the controller berth replaced already", host.Name, p.seen)
			continue
		}
		if claims[p.user] > 1 {
			tell(ctx, l.recorder, tr, host.Name, corev1.EventTypeWarning, "AdoptionFailed", "another TaskRun's name and namespace give the same build user name %s as this one's (the controller berth replaced runs them together; an earlier berth release hashed them to 48 bits), so berth cannot tell whose user it is and removes neither: remove it by hand once both tasks have ended", p.user)
			if err := client.IgnoreNotFound(l.mirror.patch(ctx, tr, mirrorState{ended: true})); err != nil {
				return err
			}
			continue
		}
		ok, err := l.adopt(ctx, tr, host, p)
		if err != nil {
			return err
		}
		if ok {
			adopted++
		}
	}
	marker = corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: SwitchoverMarker, Namespace: l.namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}},
		Data: map[string]string{"adoptedAt": l.now().UTC().Format("2006-01-02T15:04:05Z"), "adopted": strconv.Itoa(adopted)},
	}
	return client.IgnoreAlreadyExists(l.client.Create(ctx, &marker))
}

// adoptionCandidates are the user TaskRuns, created before this controller started and without a
// record, that carry a host label (not localhost) or the finalizer: those the controller berth
// replaced may have left holding a host. They are copies, since adopting one writes on it.
func (l *line) adoptionCandidates(ctx context.Context) ([]*pipelinev1.TaskRun, error) {
	// The cache's own objects, read only (as restoreQueue reads them).
	var list pipelinev1.TaskRunList
	if err := l.client.List(ctx, &list, userTasks, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var candidates []*pipelinev1.TaskRun
	for i := range list.Items {
		tr := &list.Items[i]
		host := tr.Labels[contract.AssignedHostLabel]
		if l.gate.classify(tr) != userTask || host == contract.Localhost ||
			(host == "" && !controllerutil.ContainsFinalizer(tr, contract.Finalizer)) {
			continue
		}
		// A TaskRun created after this controller started was never served by another one:
		// its labels are the tenant's, not a record of anything (the apiserver sets the
		// creation time; a tenant cannot).
		if !tr.CreationTimestamp.Time.Before(l.started) {
			continue
		}
		var existing berthv1.Allocation
		err := l.client.Get(ctx, client.ObjectKey{Namespace: l.namespace, Name: string(tr.UID)}, &existing)
		if err == nil {
			continue
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
		candidates = append(candidates, tr.DeepCopy())
	}
	return candidates, nil
}

// adopt gives tr a record holding a slot of host and owing the build user p names.
func (l *line) adopt(ctx context.Context, tr *pipelinev1.TaskRun, host *config.StaticHost, p proof) (bool, error) {
	// The controller berth replaces never over-committed, so a task beyond the host's
	// concurrency was not really there; it is served like a new task instead, unless a secret
	// of that controller answers it already (answeredElsewhere).
	if !l.capacity.Adopt(taskOf(tr), host.Name, string(host.Platform)) {
		tell(ctx, l.recorder, tr, host.Name, corev1.EventTypeWarning, "AdoptionRefused", "host %s is full, so this TaskRun cannot have been running there; berth serves it as a new task unless it has its secret already", host.Name)
		return false, nil
	}
	rec := l.records.forTask(tr, config.StrategyStatic)
	login := hostconfig.Login(host)
	rec.Status = berthv1.AllocationStatus{Phase: berthv1.PhaseReady, Login: &login,
		BuildUser: p.user, Message: "adopted from the controller berth replaced",
		ReservedAt: microStamp(l.now())}
	if err := l.client.Create(ctx, rec); err != nil {
		l.capacity.Release(taskOf(tr))
		return false, client.IgnoreAlreadyExists(err)
	}
	tell(ctx, l.recorder, tr, host.Name, corev1.EventTypeNormal, "Adopted", "berth took over this TaskRun's slot on host %s (%s); its build user %s is removed when it ends", host.Name, p.seen, rec.Status.BuildUser)
	return true, nil
}
