package vms

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
)

// init makes the owners, each given only what it uses; the first call does it.
func (f *Fleet) init() {
	f.once.Do(func() {
		f.kick = make(chan struct{}, 1)
		records := vmRecords{apiReader: f.APIReader, namespace: f.Namespace}
		inst := &installation{client: f.Client, apiReader: f.APIReader, namespace: f.Namespace}
		clouds := &providers{config: f.Config, secret: f.Secret, built: map[string]cloud.Provider{}, lastSpec: map[string]providerSpec{}}
		f.trouble = &troubles{namespace: f.Namespace, config: f.Config, capacity: f.Capacity, now: f.now, byPlatform: map[string]trouble{}}
		f.readyVMs = &readyVMs{config: f.Config, capacity: f.Capacity, logins: map[string]berthv1.HostLogin{}, specs: map[string]*berthv1.InstanceSpec{}}
		f.vm = &vmLoop{client: f.Client, config: f.Config, capacity: f.Capacity, recorder: f.Recorder, debts: f.Debts, prober: f.Prober,
			providers: clouds, installation: inst, trouble: f.trouble, readyVMs: f.readyVMs, now: f.now, kick: f.Kick}
		f.planner = &planner{client: f.Client, namespace: f.Namespace, config: f.Config, capacity: f.Capacity, records: records,
			readyVMs: f.readyVMs, trouble: f.trouble, providers: clouds, vm: f.vm, now: f.now, kick: f.Kick}
		f.sweeper = &sweeper{config: f.Config, records: records, installation: inst, providers: clouds, recorder: f.Recorder,
			now: f.now, leakGrace: f.LeakGrace}
	})
}

// SetupWithManager registers the VM loop and the planner.
func (f *Fleet) SetupWithManager(mgr ctrl.Manager) error {
	if f.APIReader == nil {
		f.APIReader = mgr.GetAPIReader()
	}
	f.init()
	f.Config.OnChange(f.configChanged)
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("vm").
		For(&berthv1.BuildHost{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.(*berthv1.BuildHost).Spec.Instance != nil
		}))).
		Complete(f); err != nil {
		return err
	}
	return mgr.Add(f)
}

// NeedLeaderElection: one planner per cluster, or two would launch for the same queue.
func (f *Fleet) NeedLeaderElection() bool { return true }

// Start runs the planner and the sweeper until ctx ends. Decisions are taken in this one
// goroutine, one platform at a time, counting every record read from the apiserver: launches
// never race each other, and max-instances holds across restarts.
func (f *Fleet) Start(ctx context.Context) error {
	f.init()
	log := logr.FromContextOrDiscard(ctx).WithName("vms")
	interval, sweepEvery := f.PlanInterval, f.SweepInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	if sweepEvery <= 0 {
		sweepEvery = time.Minute
	}
	// Decide nothing before the ledger knows who holds and who waits for what.
	for !f.Capacity.Restored() {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := f.planner.restore(ctx); err != nil && ctx.Err() == nil {
		log.Error(err, "restoring VMs")
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	lastSweep := time.Time{}
	for {
		if err := f.planner.planAll(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "planning VMs")
		}
		if time.Since(lastSweep) >= sweepEvery {
			lastSweep = time.Now()
			if err := f.sweeper.sweep(ctx); err != nil && ctx.Err() == nil {
				log.Error(err, "sweeping for leaked instances")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-f.kick:
		case <-tick.C:
		}
	}
}
