package hosts

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/incident"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/warning"
)

// staticHosts keeps the BuildHost records of static hosts: health, quarantine, what build users
// left behind, and the conditions they show; and tells the capacity which hosts take builds.
type staticHosts struct {
	client    client.Client
	apiReader client.Reader
	namespace string
	config    *hostconfig.Store
	capacity  *capacity.Capacity
	recorder  events.EventRecorder
	now       func() time.Time
	// checker logs in to a host to check it.
	checker Checker
	// debts are the build users the task records owe the hosts.
	debts Debts
	// cleans judges failed cleans: a host's fault or one build user's (see cleanVerdicts).
	cleans *cleanVerdicts
	// quarantineAfter quarantines a host once cleans that show it broken failed that many
	// times in a row; 0 never does.
	quarantineAfter int
}

// hostChecks checks every static host each interval and keeps its BuildHost record: a failed
// check quarantines the host; a passing one lifts the quarantine once the build users still
// owed to the host are gone, and retries those cleanups at once. It runs on the leader only.
type hostChecks struct {
	hosts    *staticHosts
	interval time.Duration
}

// checkTimeout bounds one host's check.
const checkTimeout = time.Minute

// NeedLeaderElection: two replicas must not check every host twice.
func (hc *hostChecks) NeedLeaderElection() bool { return true }

// Start checks at once, then every interval, until ctx ends.
func (hc *hostChecks) Start(ctx context.Context) error {
	if hc.interval <= 0 {
		return nil
	}
	log := logr.FromContextOrDiscard(ctx).WithName("host-checks")
	ticker := time.NewTicker(hc.interval)
	defer ticker.Stop()
	for {
		if err := hc.hosts.checkAll(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "checking hosts")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// checkAll checks every static host of the config in force, each within checkTimeout, and
// records the outcomes.
func (h *staticHosts) checkAll(ctx context.Context) error {
	cfg := h.config.Config()
	if cfg == nil {
		return nil
	}
	// The checks run in parallel; their outcomes are recorded afterwards, against one reading
	// of what is owed to each host.
	healths := make([]provision.Health, len(cfg.Hosts))
	var wg sync.WaitGroup
	slots := make(chan struct{}, 8)
	for i, host := range cfg.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			cctx, cancel := context.WithTimeout(ctx, checkTimeout)
			healths[i] = h.checker.Check(cctx, hostconfig.Login(host))
			cancel()
		}()
	}
	wg.Wait()
	owed, err := h.owedByHost(ctx, h.client)
	if err != nil {
		return err
	}
	var errs []error
	for i, host := range cfg.Hosts {
		if err := h.recordHealth(ctx, host, &healths[i], owed[host.Name]); err != nil {
			errs = append(errs, fmt.Errorf("host %s: %w", host.Name, err))
		}
	}
	return errors.Join(errs...)
}

// owedByHost lists, per host, the build users the task records owe it, read through reader
// (read, never written: the task controller keeps those records).
func (h *staticHosts) owedByHost(ctx context.Context, reader client.Reader) (map[string][]owedClean, error) {
	var list berthv1.AllocationList
	if err := reader.List(ctx, &list, client.InNamespace(h.namespace)); err != nil {
		return nil, err
	}
	owed := map[string][]owedClean{}
	for _, rec := range list.Items {
		for _, d := range rec.Status.Debts {
			owed[d.Host] = append(owed[d.Host], owedClean{task: allocation.Task{Namespace: rec.Spec.TaskRun.Namespace, Name: rec.Spec.TaskRun.Name}, user: d.BuildUser})
		}
	}
	return owed, nil
}

// recordHealth writes a check's outcome into the host's record and the ledger; with no check
// (health nil), what the owed cleans alone change of the last check's outcome, which passed.
func (h *staticHosts) recordHealth(ctx context.Context, host *config.StaticHost, health *provision.Health, owed []owedClean) error {
	bh, err := h.recordOf(ctx, h.client, host.Name)
	if err != nil || bh == nil {
		return err // nil: the host left the config while it was checked
	}
	healthy, reason := true, ""
	next := bh.DeepCopy()
	next.Status.Platform, next.Status.Address = string(host.Platform), host.Address
	warned := false
	if health != nil {
		healthy, reason = health.Healthy, health.Reason
		checked := metav1.NewTime(h.now())
		next.Status.LastCheck = &checked
		if healthy { // a failed check tells nothing of systemd
			warned = next.SetBuildsBounded(health.Warning, h.now())
		}
	}
	next.Status.PendingCleans = len(owed)
	// A user told as dirty and no longer owed was removed (or forgotten) since, perhaps by a
	// controller that did not know it was told.
	next.Status.Leftovers = slices.DeleteFunc(next.Status.Leftovers, func(l berthv1.Leftover) bool {
		return !slices.ContainsFunc(owed, func(o owedClean) bool { return o.user == l.BuildUser })
	})
	// What a build user left keeps only that user's slot: it never keeps the host out of
	// service (see cleanVerdicts).
	dirty := h.cleans.dirty(host.Name)
	for _, l := range next.Status.Leftovers {
		dirty = append(dirty, l.BuildUser)
	}
	blocking := slices.DeleteFunc(slices.Clone(owed), func(o owedClean) bool { return slices.Contains(dirty, o.user) })
	switch {
	case !healthy:
		next.Quarantine(berthv1.QuarantineCheckFailed, reason, h.now())
	case len(blocking) > 0 && bh.Status.Quarantined:
		// Reachable again: its dirty slots are cleaned before it takes new builds, now rather
		// than when their backoff ends.
		next.Quarantine(berthv1.QuarantineCleansPending,
			fmt.Sprintf("reachable again; %d build user(s) still to be removed before it takes builds", len(blocking)), h.now())
		if err := h.debts.RetryCleans(ctx, host.Name); err != nil {
			logf.FromContext(ctx).Error(err, "retrying the cleans owed to a host reachable again", "host", host.Name)
		}
		for _, o := range owed {
			h.capacity.Wake(o.task)
		}
	default:
		next.Status.Quarantined, next.Status.QuarantineReason = false, ""
	}
	if err := h.writeStatus(ctx, next); err != nil {
		return err
	}
	if warned {
		h.event(ctx, next, corev1.EventTypeWarning, "BuildsUnbounded", "Check", "%s", health.Warning)
	}
	switch {
	case next.Status.Quarantined && !bh.Status.Quarantined:
		h.event(ctx, next, corev1.EventTypeWarning, "HostQuarantined", "Check", "host %s takes no new builds until a check passes: %s", host.Name, reason)
	case !next.Status.Quarantined && bh.Status.Quarantined:
		h.event(ctx, next, corev1.EventTypeNormal, "HostHealthy", "Check", "host %s passed its check and takes builds again", host.Name)
	}
	h.capacity.Follow(next)
	return nil
}

// event tells the operator of a change to a host: an Event on its BuildHost, and a log line
// with the host and platform (a warning line for a Warning).
func (h *staticHosts) event(ctx context.Context, bh *berthv1.BuildHost, eventType, reason, action, format string, args ...any) {
	h.recorder.Eventf(bh, nil, eventType, reason, action, "%s", incident.Note(fmt.Sprintf(format, args...)))
	log := logf.FromContext(ctx).WithValues("host", bh.Host(), "platform", bh.Status.Platform, "reason", reason)
	if eventType == corev1.EventTypeWarning {
		warning.Log(log, fmt.Sprintf(format, args...))
		return
	}
	log.Info(fmt.Sprintf(format, args...))
}

// quarantineForCleans takes a host out of service whose cleanups keep failing in a way that
// shows it broken (see cleanVerdicts.failed). A failed read or write is logged: the next failed
// clean tries again.
func (h *staticHosts) quarantineForCleans(ctx context.Context, hostName, why string) {
	log := logf.FromContext(ctx).WithValues("host", hostName)
	bh, err := h.recordOf(ctx, h.client, hostName)
	if err != nil {
		log.Error(err, "reading the record of a host to quarantine for failing cleans")
		return
	}
	if bh == nil || bh.Status.Quarantined {
		return // neither a record nor a static host (a VM already gone), or out already
	}
	bh.Quarantine(berthv1.QuarantineCleansFailing, "cleanups keep failing: "+why, h.now())
	if err := h.writeStatus(ctx, bh); err != nil {
		log.Error(err, "quarantining a host for failing cleans")
		return
	}
	h.event(ctx, bh, corev1.EventTypeWarning, "HostQuarantined", "Clean", "host %s takes no new builds until a check passes and its build users are removed: %s", hostName, why)
	h.capacity.Follow(bh)
}

// cleansDone puts back in service, as soon as no build user is owed to it any more, a static
// host kept out only until they were removed (CleansPending), rather than at its next check.
// The records are read past the cache: the one just settled may not be in it yet.
func (h *staticHosts) cleansDone(ctx context.Context, hostName string) {
	host := h.config.Host(hostName)
	if host == nil {
		return
	}
	var bh berthv1.BuildHost
	if err := h.client.Get(ctx, client.ObjectKey{Namespace: h.namespace, Name: berthv1.BuildHostName(hostName)}, &bh); err != nil {
		return // no record: not quarantined
	}
	q := meta.FindStatusCondition(bh.Status.Conditions, berthv1.HostQuarantined)
	if !bh.Status.Quarantined || q == nil || q.Reason != berthv1.QuarantineCleansPending {
		return
	}
	owed, err := h.owedByHost(ctx, h.apiReader)
	if err == nil {
		err = h.recordHealth(ctx, host, nil, owed[hostName])
	}
	if err != nil {
		logf.FromContext(ctx).Error(err, "putting a host back in service once its build users are removed", "host", hostName)
	}
}

// owedClean is a build user a record owes a host: the task of the record, and the user.
type owedClean struct {
	task allocation.Task
	user string
}

// recordOf reads the host's record through reader (the cache, or the apiserver for a read
// that must be fresh), creating a static host's on first sight; nil, with no error, for a host
// with neither record nor config. A create writes no status: the new record comes back with
// its platform and address filled in for the caller's status write (every caller writes one);
// until then it is a host in service, as it was before it had a record.
func (h *staticHosts) recordOf(ctx context.Context, reader client.Reader, hostName string) (*berthv1.BuildHost, error) {
	var bh berthv1.BuildHost
	key := client.ObjectKey{Namespace: h.namespace, Name: berthv1.BuildHostName(hostName)}
	err := reader.Get(ctx, key, &bh)
	if err == nil {
		return &bh, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	host := h.config.Host(hostName)
	if host == nil {
		return nil, nil
	}
	bh = berthv1.BuildHost{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: h.namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "berth"}},
		Spec:       berthv1.BuildHostSpec{HostName: host.Name},
	}
	if err := h.client.Create(ctx, &bh); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return &bh, h.apiReader.Get(ctx, key, &bh)
		}
		return nil, err
	}
	bh.Status.Platform, bh.Status.Address = string(host.Platform), host.Address
	return &bh, nil
}

// writeStatus writes the status of a host's record, its conditions first brought in line
// with the rest (see BuildHost.SetConditions). It writes nothing of the spec.
func (h *staticHosts) writeStatus(ctx context.Context, bh *berthv1.BuildHost) error {
	bh.SetConditions(h.now())
	return h.client.Status().Update(ctx, bh)
}

// reconcile applies what operators do to a host's record, a static host's or a VM's (drain,
// undrain, forget), once the capacity knows who holds what, and has the capacity follow it.
func (h *staticHosts) reconcile(ctx context.Context, bh *berthv1.BuildHost) (reconcile.Result, error) {
	if !h.capacity.Restored() {
		return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, nil
	}
	if bh.Spec.Forget {
		return reconcile.Result{}, h.forget(ctx, bh)
	}
	h.capacity.Follow(bh)
	return h.refreshConditions(ctx, bh)
}

// refreshConditions writes a static host's conditions again once an operator changed its spec
// (drain, undrain; the end of a forget). A VM's record is left to the VM loop,
// and a record berth has written no status to yet is left to its first check: this write
// would only race theirs.
func (h *staticHosts) refreshConditions(ctx context.Context, bh *berthv1.BuildHost) (reconcile.Result, error) {
	if bh.Spec.Instance != nil || bh.Status.ObservedGeneration == 0 {
		return reconcile.Result{}, nil
	}
	next := bh.DeepCopy()
	next.SetConditions(h.now())
	if equality.Semantic.DeepEqual(next.Status, bh.Status) {
		return reconcile.Result{}, nil
	}
	if err := h.client.Status().Update(ctx, next); err != nil {
		if apierrors.IsConflict(err) {
			// Written meanwhile (a check): the event of that write brings the record back.
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{}, nil
}

// forget drops every build user owed to the host, frees their slots, and leaves the host
// drained: for a host that is gone for good. The status is written first: spec.forget still
// holds until the second write, so a crash between the two forgets again after the restart.
func (h *staticHosts) forget(ctx context.Context, bh *berthv1.BuildHost) error {
	// Out of service first: dropping the debts frees their slots and wakes the waiters, and
	// none may be handed this host while the forget is still writing its record.
	h.capacity.Quarantine(bh.Host(), true)
	if err := h.debts.ForgetHost(ctx, bh.Host()); err != nil {
		return err
	}
	next := bh.DeepCopy()
	next.Status.PendingCleans, next.Status.Leftovers = 0, nil
	if err := h.writeStatus(ctx, next); err != nil {
		return err
	}
	next.Spec.Forget, next.Spec.Drained = false, true
	if err := h.client.Update(ctx, next); err != nil {
		return err
	}
	h.capacity.Follow(next)
	return nil
}

// forgetting is the task side's debts, made to forget first what is known of a gone host's
// cleans, so that a host of the same name that comes back starts with a clean slate.
type forgetting struct {
	cleans *cleanVerdicts
	debts  Debts
}

func (f forgetting) ForgetHost(ctx context.Context, host string) error {
	f.cleans.forgetHost(host)
	return f.debts.ForgetHost(ctx, host)
}

func (f forgetting) RetryCleans(ctx context.Context, host string) error {
	return f.debts.RetryCleans(ctx, host)
}
