// Package controller assembles berth's controller: a controller-runtime manager with the
// host-config watcher, the TaskRun reconciler and the leader-only host checks.
package controller

import (
	"fmt"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/controller/hostconfig"
	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/kubescheme"
)

// Options configure the controller; the defaults are those of `berth controller`.
type Options struct {
	Namespace            string
	MetricsAddress       string // "0" disables
	HealthProbeAddress   string // "0" disables
	LeaderElection       bool
	LeaderElectionID     string
	ConcurrentReconciles int
	WaitTimeout          time.Duration
	FailedTaskRetention  time.Duration
	HostCheckInterval    time.Duration
	ProvisionTask        string
	CleanTask            string
	UpdateTask           string
	TaskServiceAccount   string
	// Restartable allows a later manager in the same process (a test or the dev stack
	// replacing a stopped controller); controller-runtime otherwise refuses repeated names.
	Restartable bool
}

// DefaultOptions are what a platform team gets without flags.
func DefaultOptions() Options {
	return Options{
		Namespace:            hostconfig.DefaultNamespace,
		MetricsAddress:       ":8080",
		HealthProbeAddress:   ":8081",
		LeaderElectionID:     "berth-controller",
		ConcurrentReconciles: 10,
		WaitTimeout:          time.Hour,
		FailedTaskRetention:  10 * time.Minute,
		HostCheckInterval:    10 * time.Minute,
		ProvisionTask:        "provision-shared-host",
		CleanTask:            "clean-shared-host",
		UpdateTask:           "update-host",
		TaskServiceAccount:   "berth-host-tasks",
	}
}

// New builds the manager; Start it to run the controller.
func New(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  kubescheme.New(),
		Cache:                   taskrun.CacheOptions(o.Namespace),
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddress},
		HealthProbeBindAddress:  o.HealthProbeAddress,
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: o.Namespace,
		// A new leader rebuilds its ledger from labels; stepping down at once on shutdown
		// lets it take over without waiting for the lease to expire.
		LeaderElectionReleaseOnCancel: true,
		Controller:                    ctrlconfig.Controller{SkipNameValidation: &o.Restartable},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	store := hostconfig.NewStore()
	recorder := mgr.GetEventRecorder("berth")
	watcher := &hostconfig.Watcher{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: o.Namespace, Store: store, Recorder: recorder}
	if err := watcher.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	reconciler := &taskrun.Reconciler{
		Client: mgr.GetClient(), Namespace: o.Namespace, Config: store, Ledger: allocation.New(), Recorder: recorder,
		ProvisionTask: o.ProvisionTask, CleanTask: o.CleanTask, UpdateTask: o.UpdateTask, TaskServiceAccount: o.TaskServiceAccount,
		WaitTimeout: o.WaitTimeout, FailedTaskRetention: o.FailedTaskRetention,
	}
	if err := reconciler.SetupWithManager(mgr, o.ConcurrentReconciles); err != nil {
		return nil, err
	}
	if err := mgr.Add(&taskrun.HostChecks{Reconciler: reconciler, Interval: o.HostCheckInterval}); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}
