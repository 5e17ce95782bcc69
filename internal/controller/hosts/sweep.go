package hosts

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// sweeper terminates the instances berth launched and lost track of.
type sweeper struct {
	config       *hostconfig.Store
	records      vmRecords
	installation *installation
	providers    *providers
	recorder     events.EventRecorder
	now          func() time.Time
	// leakGrace is how old an instance without a record must be before it is terminated.
	leakGrace time.Duration
}

// sweep terminates instances that carry this installation's tag and that no record accounts
// for, once they are older than leakGrace (a launch whose record is being written is younger).
// An instance without the tag is never touched, whoever launched it.
func (s *sweeper) sweep(ctx context.Context) error {
	cfg := s.config.Config()
	if cfg == nil {
		return nil
	}
	installation, err := s.installation.id(ctx)
	if err != nil {
		return err
	}
	records, err := s.records.list(ctx)
	if err != nil {
		return err
	}
	ids, tokens := map[string]bool{}, map[string]bool{}
	for _, rec := range records {
		tokens[Token(rec)] = true
		if rec.Status.Instance != nil && rec.Status.Instance.ID != "" {
			ids[rec.Status.Instance.ID] = true
		}
	}
	grace := s.leakGrace
	if grace <= 0 {
		grace = 10 * time.Minute
	}
	var errs []error
	for _, p := range slices.Sorted(maps.Keys(cfg.Dynamic)) {
		platform := string(p)
		provider, err := s.providers.forPlatform(platform)
		if err != nil {
			continue // reported by the planner
		}
		found, err := provider.List(ctx, map[string]string{cloud.TagInstallation: installation, cloud.TagPlatform: p.Label()})
		if err != nil {
			errs = append(errs, fmt.Errorf("listing the instances of platform %s: %w", platform, err))
			continue
		}
		for _, inst := range found {
			if ids[inst.ID] || (inst.Token != "" && tokens[inst.Token]) || s.now().Sub(inst.LaunchedAt) < grace {
				continue
			}
			if err := provider.Terminate(ctx, inst.ID); err != nil {
				errs = append(errs, fmt.Errorf("terminating leaked instance %s of platform %s: %w", inst.ID, platform, err))
				continue
			}
			leaks.WithLabelValues(platform).Inc()
			// Every leak's Event regards the installation's ConfigMap: the instance goes into
			// the action too, as the events library folds Events that differ only in their
			// note into one series that keeps the first note, and each leak must be named.
			s.recorder.Eventf(s.installation.object(), nil, corev1.EventTypeWarning, "LeakTerminated", "Terminate "+inst.ID,
				"instance %s of platform %s (record %s) had no record of berth's: terminated", inst.ID, platform, recordTag(inst.Tags))
		}
	}
	return errors.Join(errs...)
}

func recordTag(tags map[string]string) string {
	if r := tags[cloud.TagRecord]; r != "" {
		return strings.TrimSpace(r)
	}
	return "unknown"
}
