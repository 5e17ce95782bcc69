// Package hosts owns the BuildHost records: one per static host of the config, and one per VM
// berth launches for a dynamic or dynamic-pool platform.
//
// A static host's record is kept by its checks (health, quarantine, what build users left)
// and by what operators write to its spec (drain, undrain, forget). A VM's record has an
// instance section, written before the cloud is asked for it, so that a crash at any instant
// neither launches twice nor loses a VM: the VM loop walks one record through its phases
// (launching, booting, ready, terminating); the planner decides, one platform at a time, how
// many VMs to launch, retire and terminate; the sweeper terminates instances carrying this
// installation's tag that no record accounts for.
package hosts

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/provision"
)

// Debts are the build users still to be removed from hosts, which the task records hold
// (package taskrun keeps them): a VM berth terminates takes its users with it, and so does a
// static host an operator forgets.
type Debts interface {
	// ForgetHost drops every build user owed to a host that is gone.
	ForgetHost(ctx context.Context, host string) error
	// RetryCleans makes the cleans owed to a host due now, whatever their backoff: it passed
	// its check after failing.
	RetryCleans(ctx context.Context, host string) error
}

// Checker logs in to a static host and tells whether it can take builds.
type Checker interface {
	Check(ctx context.Context, login berthv1.HostLogin) provision.Health
}

// Prober logs in to a VM for the first time and returns the host key it presented (or checks
// the configured one).
type Prober interface {
	FirstContact(ctx context.Context, login berthv1.HostLogin) (hostKey string, err error)
}

// Owner keeps every BuildHost record: it checks the static hosts, and launches, watches and
// ends the VMs of every dynamic platform. It is the entry the manager and the task controller
// know; the work is done by small owners, each holding only what it uses (see init): the
// static hosts' keeper and their checks, the VM loop that walks one VM's record, the planner
// that decides per platform, the sweeper that ends leaks; and the providers, the
// installation, the ready VMs and the platforms' launch troubles are each kept by one of them.
// Those parts are made at the first call of any of its methods.
type Owner struct {
	Client    client.Client
	APIReader client.Reader
	Namespace string
	Config    *hostconfig.Store
	// Capacity is the ledger and its wake-ups, shared with the task controller.
	Capacity *capacity.Capacity
	Recorder events.EventRecorder
	Debts    Debts
	Prober   Prober
	// Checker checks the static hosts, every CheckInterval (never when 0).
	Checker       Checker
	CheckInterval time.Duration
	// QuarantineAfterCleanFailures quarantines a host once cleans that show it broken (see
	// cleanVerdicts.failed) failed that many times in a row; 0 never does.
	QuarantineAfterCleanFailures int
	// Secret reads a Secret of the controller's namespace (cloud credentials), on demand.
	Secret cloud.SecretReader
	// PlanInterval is the longest the planner waits between two passes when nothing kicks it.
	PlanInterval time.Duration
	// SweepInterval is how often the sweeper lists the clouds; LeakGrace how old an instance
	// without a record must be before it is terminated as a leak.
	SweepInterval, LeakGrace time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	once sync.Once
	kick chan struct{}

	static   *staticHosts
	checks   *hostChecks
	vm       *vmLoop
	planner  *planner
	sweeper  *sweeper
	readyVMs *readyVMs
	trouble  *troubles
}

func (o *Owner) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// Kick asks the planner for a pass soon; kicks coalesce.
func (o *Owner) Kick() {
	o.init()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// Login is how berth reaches a ready VM as its admin.
func (o *Owner) Login(host string) (berthv1.HostLogin, bool) {
	o.init()
	return o.readyVMs.login(host)
}

// Gone tells whether a VM named host has no record any more (its instance is terminated).
func (o *Owner) Gone(ctx context.Context, host string) (bool, error) {
	o.init()
	var bh berthv1.BuildHost
	err := o.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: host}, &bh)
	if err == nil {
		return false, nil
	}
	return client.IgnoreNotFound(err) == nil, client.IgnoreNotFound(err)
}

// Unservable tells whether a task waiting since queued on platform should get an error now:
// the cloud refused the platform's launches for good, or has had no capacity for longer than
// the platform's allocation timeout. recheck is when to ask again.
func (o *Owner) Unservable(platform string, waited time.Duration) (reason, message string, recheck time.Duration) {
	o.init()
	return o.trouble.unservable(platform, waited)
}

// Released is told that a task's last hold on host is going: a single-use VM is retired in
// its record first, so no restart can hand it to a second task.
func (o *Owner) Released(ctx context.Context, host string) error {
	o.init()
	var rec berthv1.BuildHost
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: host}, &rec); err != nil {
		return client.IgnoreNotFound(err)
	}
	if rec.Spec.Instance == nil || rec.Spec.Instance.Pooled {
		return nil
	}
	return o.vm.retire(ctx, &rec, "it served its task")
}

// Reconcile keeps one BuildHost record, read once: a VM's walks through its phases (see
// vmLoop); and every record, once the capacity knows who holds what, carries out what an
// operator wrote to its spec (drain, undrain, forget) and shows it in its conditions (see
// staticHosts). It returns the sooner of the two requeues.
func (o *Owner) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	o.init()
	// Nothing is decided before the config is read: until then every platform looks
	// unconfigured, and a record being launched would be given up (deleted, its instance
	// left to the sweeper) as if the cloud had refused its settings for good.
	if !o.Config.Synced() {
		return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, nil
	}
	var rec berthv1.BuildHost
	if err := o.Client.Get(ctx, req.NamespacedName, &rec); err != nil {
		if client.IgnoreNotFound(err) == nil {
			o.readyVMs.drop(req.Name)
			o.vm.forget(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var vm reconcile.Result
	if rec.Spec.Instance != nil {
		var err error
		if vm, err = o.vm.reconcile(ctx, rec.DeepCopy()); err != nil {
			return vm, err
		}
	}
	res, err := o.static.reconcile(ctx, &rec)
	return sooner(vm, res), err
}

// sooner is the result that brings a record back first.
func sooner(a, b reconcile.Result) reconcile.Result {
	switch {
	case a.RequeueAfter == 0:
		return b
	case b.RequeueAfter == 0:
		return a
	}
	return reconcile.Result{RequeueAfter: min(a.RequeueAfter, b.RequeueAfter)}
}

// CheckNow checks every static host once, as the checks do each interval.
func (o *Owner) CheckNow(ctx context.Context) error {
	o.init()
	return o.static.checkAll(ctx)
}

// Cleaned is told that debt d, a build user, is gone from its host.
func (o *Owner) Cleaned(ctx context.Context, d berthv1.Debt) {
	o.init()
	o.static.cleaned(ctx, d)
}

// CleanFailed is told that removing rec's build user d failed, failures passes in a row, and
// is retried in retry: it judges whether the host or the user is to blame (see cleanVerdicts).
func (o *Owner) CleanFailed(ctx context.Context, rec *berthv1.Allocation, d berthv1.Debt, err error, failures int, retry time.Duration) {
	o.init()
	o.static.cleanFailed(ctx, rec, d, err, failures, retry)
}

// configChanged takes a new config in: new settings may cure a refused platform, so it may
// launch again; and VMs launched with settings their platform no longer has are closed
// before a task can take one (the planner writes why into their records).
func (o *Owner) configChanged(cfg *config.Config) {
	o.trouble.reset()
	for _, name := range o.readyVMs.outdated(cfg) {
		o.Capacity.RetireHost(name)
	}
	o.Kick()
}

// dynamic is the platform's settings in the config in force; nil when it is not a dynamic
// platform there (or no config is in force yet).
func dynamic(store *hostconfig.Store, p config.Platform) *config.DynamicPlatform {
	if cfg := store.Config(); cfg != nil {
		return cfg.Dynamic[p]
	}
	return nil
}
