package taskrun

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
)

// HostChecks starts an update TaskRun for every static host each Interval (unless one is still
// running for it). It runs on the leader only.
type HostChecks struct {
	Reconciler *Reconciler
	Interval   time.Duration
}

// NeedLeaderElection: two replicas must not check every host twice.
func (h *HostChecks) NeedLeaderElection() bool { return true }

// Start checks at once, then every Interval, until ctx ends.
func (h *HostChecks) Start(ctx context.Context) error {
	if h.Interval <= 0 {
		return nil
	}
	log := logr.FromContextOrDiscard(ctx).WithName("host-checks")
	ticker := time.NewTicker(h.Interval)
	defer ticker.Stop()
	for {
		if err := h.checkAll(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "starting host checks")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (h *HostChecks) checkAll(ctx context.Context) error {
	r := h.Reconciler
	cfg := r.Config.Config()
	if cfg == nil {
		return nil
	}
	var running pipelinev1.TaskRunList
	if err := r.Client.List(ctx, &running, client.InNamespace(r.Namespace),
		client.MatchingLabels{contract.TaskTypeLabel: contract.TaskTypeUpdate}); err != nil {
		return err
	}
	busy := map[string]bool{}
	for _, tr := range running.Items {
		if !tr.IsDone() {
			busy[tr.Labels[contract.AssignedHostLabel]] = true
		}
	}
	now := r.now()
	for _, host := range cfg.Hosts {
		if busy[host.Name] {
			continue
		}
		if err := r.Client.Create(ctx, r.updateTaskRun(host, now)); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}
