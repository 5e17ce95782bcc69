// Package vms is berth's loop over the VMs it launches for dynamic and dynamic-pool platforms.
// Each VM has a BuildHost record with an instance section, written before the cloud is asked
// for it, so that a crash at any instant neither launches twice nor loses a VM. The VM
// reconciler walks one record through its phases (launching, booting, ready, terminating); the
// planner decides, one platform at a time, how many VMs to launch, retire and terminate; the
// sweeper terminates instances carrying this installation's tag that no record accounts for.
package vms

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
)

// Debts are the build users still to be removed from hosts, which the task records hold
// (package taskrun keeps them): a VM berth terminates takes its users with it.
type Debts interface {
	// ForgetHost drops every build user owed to a host that is gone.
	ForgetHost(ctx context.Context, host string) error
}

// Prober logs in to a VM for the first time and returns the host key it presented (or checks
// the configured one).
type Prober interface {
	FirstContact(ctx context.Context, login berthv1.HostLogin) (hostKey string, err error)
}

// Fleet launches, watches and ends the VMs of every dynamic platform. It is the entry the
// manager and the task controller know; the work is done by small owners, each holding only
// what it uses (see init): the VM loop walks one record, the planner decides per platform, the
// sweeper ends leaks, and the providers, the installation, the ready VMs and the platforms'
// launch troubles are each kept by one of them.
type Fleet struct {
	Client    client.Client
	APIReader client.Reader
	Namespace string
	Config    *hostconfig.Store
	// Capacity is the ledger and its wake-ups, shared with the task controller.
	Capacity *capacity.Capacity
	Recorder events.EventRecorder
	Debts    Debts
	Prober   Prober
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

	vm       *vmLoop
	planner  *planner
	sweeper  *sweeper
	readyVMs *readyVMs
	trouble  *troubles
}

func (f *Fleet) now() time.Time {
	if f.Now != nil {
		return f.Now()
	}
	return time.Now()
}

// Kick asks the planner for a pass soon; kicks coalesce.
func (f *Fleet) Kick() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Login is how berth reaches a ready VM as its admin.
func (f *Fleet) Login(host string) (berthv1.HostLogin, bool) {
	return f.readyVMs.login(host)
}

// Gone tells whether a VM named host has no record any more (its instance is terminated).
func (f *Fleet) Gone(ctx context.Context, host string) (bool, error) {
	var bh berthv1.BuildHost
	err := f.Client.Get(ctx, client.ObjectKey{Namespace: f.Namespace, Name: host}, &bh)
	if err == nil {
		return false, nil
	}
	return client.IgnoreNotFound(err) == nil, client.IgnoreNotFound(err)
}

// Unservable tells whether a task waiting since queued on platform should get an error now:
// the cloud refused the platform's launches for good, or has had no capacity for longer than
// the platform's allocation timeout. recheck is when to ask again.
func (f *Fleet) Unservable(platform string, waited time.Duration) (reason, message string, recheck time.Duration) {
	return f.trouble.unservable(platform, waited)
}

// Released is told that a task's last hold on host is going: a single-use VM is retired in
// its record first, so no restart can hand it to a second task.
func (f *Fleet) Released(ctx context.Context, host string) error {
	var rec berthv1.BuildHost
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: f.Namespace, Name: host}, &rec); err != nil {
		return client.IgnoreNotFound(err)
	}
	if rec.Spec.Instance == nil || rec.Spec.Instance.Pooled {
		return nil
	}
	return f.vm.retire(ctx, &rec, "it served its task")
}

// Reconcile walks one VM record through its phases (see vmLoop).
func (f *Fleet) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	return f.vm.reconcile(ctx, req)
}

// configChanged takes a new config in: new settings may cure a refused platform, so it may
// launch again; and VMs launched with settings their platform no longer has are closed
// before a task can take one (the planner writes why into their records).
func (f *Fleet) configChanged(cfg *config.Config) {
	f.trouble.reset()
	for _, name := range f.readyVMs.outdated(cfg) {
		f.Capacity.RetireHost(name)
	}
	f.Kick()
}

// dynamic is the platform's settings in the config in force; nil when it is not a dynamic
// platform there (or no config is in force yet).
func dynamic(store *hostconfig.Store, p config.Platform) *config.DynamicPlatform {
	if cfg := store.Config(); cfg != nil {
		return cfg.Dynamic[p]
	}
	return nil
}
