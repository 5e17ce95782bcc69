package controller

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// A controller's heap is what is live (its caches, cut down by their transforms) plus the
// headroom Go lets garbage take before a collection: GOGC percent of what is live, 100 unless
// set. berth sets the percent it is given (Options.GCPercent: Go's 100 unless the operator
// asks for less headroom), and collects once when its TaskRun informer has synced: the sync
// receives every TaskRun of the cluster, each decoded whole and cut down at once, and what it
// leaves behind would otherwise set the size of the heap's next growth. An operator who sets
// GOGC has chosen: berth leaves the percent alone. (docs/memory.md has the measurements.)

// useGCPercent sets the GC percent for the process and, on the leader, collects once the
// TaskRuns have synced. percent ≤ 0, or GOGC in the environment, leaves the runtime's percent
// (the collection after the sync happens either way).
func useGCPercent(mgr ctrl.Manager, percent int) error {
	setGCPercent(percent)
	return mgr.Add(collectAfterSync{cache: mgr.GetCache()})
}

// setGCPercent sets the percent unless percent ≤ 0 or GOGC is set, and tells whether it did.
func setGCPercent(percent int) bool {
	if percent <= 0 || os.Getenv("GOGC") != "" {
		return false
	}
	debug.SetGCPercent(percent)
	return true
}

// collectAfterSync waits for the TaskRun informer to sync, then collects.
type collectAfterSync struct {
	cache cache.Informers
	// collect is runtime.GC, unless a test counts the collections.
	collect func()
}

// NeedLeaderElection: the leader is the one whose controllers watch TaskRuns.
func (c collectAfterSync) NeedLeaderElection() bool { return true }

// Start returns once the TaskRuns have synced and the collection ran, or ctx ended. A TaskRun
// informer that cannot start is the controller's to report (its watch fails the same way).
func (c collectAfterSync) Start(ctx context.Context) error {
	if _, err := c.cache.GetInformer(ctx, &pipelinev1.TaskRun{}, cache.BlockUntilSynced(true)); err != nil {
		if ctx.Err() == nil {
			logr.FromContextOrDiscard(ctx).Info("no collection after the TaskRuns' sync: the informer did not sync", "error", err.Error())
		}
		return nil
	}
	if c.collect == nil {
		c.collect = runtime.GC
	}
	c.collect()
	return nil
}
