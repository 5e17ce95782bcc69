package keyserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SweepInterval is how often the sweeper looks for keys that can no longer be redeemed.
const SweepInterval = time.Minute

// Sweep deletes every kept key that can no longer be redeemed: expired, or made for a task
// that has ended or moved on to another build user. It is what makes a crash harmless at any
// point between keeping a key and handing its token over: a key whose token never reached a
// task is deleted at the latest when its TTL passes, and one whose record has moved on at the
// next sweep. A key redeemed by an attempt of a TaskRun that Tekton may still retry stays past
// its TTL: it is kept for the next attempt, and goes when its task ends. It returns how many
// keys it deleted.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	var list corev1.SecretList
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingLabels{KeyLabel: "true"}); err != nil {
		return 0, fmt.Errorf("listing one-time keys: %w", err)
	}
	var errs []error
	swept := 0
	for i := range list.Items {
		secret := &list.Items[i]
		_, refusal, err := s.judge(ctx, secret)
		if err != nil || refusal == nil {
			errs = append(errs, err)
			continue
		}
		if err := s.withdraw(ctx, secret); err != nil {
			errs = append(errs, err)
			continue
		}
		reason := "ended"
		if errors.Is(refusal, ErrExpired) {
			reason = "expired"
		}
		withdrawn.WithLabelValues(reason).Inc()
		swept++
	}
	return swept, errors.Join(errs...)
}

// Sweeper runs Sweep every SweepInterval. One replica sweeps: it needs the leader's lease.
type Sweeper struct {
	Store *Store
}

// NeedLeaderElection: two replicas sweeping would only race to delete the same keys.
func (Sweeper) NeedLeaderElection() bool { return true }

// Start sweeps at once, then every SweepInterval, until ctx ends.
func (w Sweeper) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("otp-sweeper")
	ticker := time.NewTicker(SweepInterval)
	defer ticker.Stop()
	for {
		n, err := w.Store.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			log.Error(err, "sweeping one-time keys")
		}
		if n > 0 {
			log.Info("deleted one-time keys that can no longer be redeemed", "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}
