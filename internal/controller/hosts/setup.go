package hosts

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
)

// init makes the owners, each given only what it uses; the first call does it.
func (o *Owner) init() {
	o.once.Do(func() {
		o.kick = make(chan struct{}, 1)
		cleans := &cleanVerdicts{}
		debts := forgetting{cleans: cleans, debts: o.Debts}
		o.static = &staticHosts{client: o.Client, apiReader: o.APIReader, namespace: o.Namespace, config: o.Config,
			capacity: o.Capacity, recorder: o.Recorder, now: o.now, checker: o.Checker, debts: debts, cleans: cleans,
			quarantineAfter: o.QuarantineAfterCleanFailures}
		o.checks = &hostChecks{hosts: o.static, interval: o.CheckInterval}
		records := vmRecords{apiReader: o.APIReader, namespace: o.Namespace}
		inst := &installation{client: o.Client, apiReader: o.APIReader, namespace: o.Namespace}
		clouds := &providers{config: o.Config, secret: o.Secret, built: map[string]cloud.Provider{}, lastSpec: map[string]providerSpec{}}
		o.trouble = &troubles{namespace: o.Namespace, config: o.Config, capacity: o.Capacity, now: o.now, byPlatform: map[string]trouble{}}
		o.readyVMs = &readyVMs{config: o.Config, capacity: o.Capacity, logins: map[string]berthv1.HostLogin{}, specs: map[string]*berthv1.InstanceSpec{}}
		o.vm = &vmLoop{client: o.Client, config: o.Config, capacity: o.Capacity, recorder: o.Recorder, debts: debts, prober: o.Prober,
			providers: clouds, installation: inst, trouble: o.trouble, readyVMs: o.readyVMs, now: o.now, kick: o.Kick}
		o.planner = &planner{client: o.Client, namespace: o.Namespace, config: o.Config, capacity: o.Capacity, records: records,
			readyVMs: o.readyVMs, trouble: o.trouble, providers: clouds, vm: o.vm, now: o.now, kick: o.Kick}
		o.sweeper = &sweeper{config: o.Config, records: records, installation: inst, providers: clouds, recorder: o.Recorder,
			now: o.now, leakGrace: o.LeakGrace}
	})
}

// SetupWithManager registers the one controller of BuildHost records, the planner and the
// sweeper, and the static hosts' checks.
func (o *Owner) SetupWithManager(mgr ctrl.Manager) error {
	if o.APIReader == nil {
		o.APIReader = mgr.GetAPIReader()
	}
	o.init()
	o.Config.OnChange(o.configChanged)
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("buildhost").
		For(&berthv1.BuildHost{}).
		// A cloud that is slow to answer one VM's call must not hold up a drain or a forget.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(o); err != nil {
		return err
	}
	if err := mgr.Add(o.checks); err != nil {
		return err
	}
	return mgr.Add(o)
}

// NeedLeaderElection: one planner per cluster, or two would launch for the same queue.
func (o *Owner) NeedLeaderElection() bool { return true }

// Start runs the planner and the sweeper until ctx ends. Decisions are taken in this one
// goroutine, one platform at a time, counting every record read from the apiserver: launches
// never race each other, and max-instances holds across restarts.
func (o *Owner) Start(ctx context.Context) error {
	o.init()
	log := logr.FromContextOrDiscard(ctx).WithName("vms")
	interval, sweepEvery := o.PlanInterval, o.SweepInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	if sweepEvery <= 0 {
		sweepEvery = time.Minute
	}
	// Decide nothing before the ledger knows who holds and who waits for what.
	for !o.Capacity.Restored() {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := o.planner.restore(ctx); err != nil && ctx.Err() == nil {
		log.Error(err, "restoring VMs")
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	lastSweep := time.Time{}
	for {
		if err := o.planner.planAll(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "planning VMs")
		}
		if time.Since(lastSweep) >= sweepEvery {
			lastSweep = time.Now()
			if err := o.sweeper.sweep(ctx); err != nil && ctx.Err() == nil {
				log.Error(err, "sweeping for leaked instances")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-o.kick:
		case <-tick.C:
		}
	}
}
