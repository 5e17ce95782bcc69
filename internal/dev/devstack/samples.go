package devstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// SampleNamespace is where the sample TaskRuns run.
const SampleNamespace = "builds"

// ApplySamples creates the sample TaskRuns of config/samples/taskrun-*.yaml.
func (s *Stack) ApplySamples(ctx context.Context) ([]*pipelinev1.TaskRun, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "samples", "taskrun-*.yaml"))
	if err != nil {
		return nil, err
	}
	if err := s.ControlPlane.EnsureNamespace(ctx, SampleNamespace); err != nil {
		return nil, err
	}
	var samples []*pipelinev1.TaskRun
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		tr := &pipelinev1.TaskRun{}
		if err := yaml.UnmarshalStrict(data, tr); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if err := s.ControlPlane.Client.Create(ctx, tr); err != nil {
			return nil, fmt.Errorf("creating sample %s: %w", tr.Name, err)
		}
		samples = append(samples, tr)
	}
	return samples, nil
}

// WaitForSamples waits until every sample has finished and berth has cleaned up after it (no
// finalizer, no secret), and returns a one-line account. It fails if a sample failed.
func (s *Stack) WaitForSamples(ctx context.Context, samples []*pipelinev1.TaskRun, limit time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	hostOf := map[string]string{}
	c := s.ControlPlane.Client
	for {
		finished, failed, unfinished := 0, []string{}, []string{}
		for _, sample := range samples {
			var tr pipelinev1.TaskRun
			if err := c.Get(ctx, client.ObjectKeyFromObject(sample), &tr); err != nil {
				if ctx.Err() != nil {
					return "", samplesUnfinished(ctx, limit, unfinished)
				}
				return "", err
			}
			host := tr.Labels[contract.AssignedHostLabel]
			if host != "" {
				hostOf[tr.Name] = host
			}
			if !tr.IsDone() || len(tr.Finalizers) > 0 || (host != "" && host != contract.Localhost) {
				unfinished = append(unfinished, tr.Name)
				continue // running, or berth has not cleaned up yet
			}
			// berth's record of the task goes once its build user is removed from the host (the
			// secret, whose key now logs in to nothing, stays with the TaskRun).
			err := c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: string(tr.UID)}, &berthv1.Allocation{})
			if !apierrors.IsNotFound(err) {
				unfinished = append(unfinished, tr.Name)
				continue
			}
			finished++
			if !tr.IsSuccessful() {
				failed = append(failed, fmt.Sprintf("%s: %s", tr.Name, tr.Status.GetCondition("Succeeded").GetMessage()))
			}
		}
		if finished == len(samples) {
			var parts []string
			for _, sample := range samples {
				where := "on " + hostOf[sample.Name]
				if hostOf[sample.Name] == contract.Localhost || hostOf[sample.Name] == "" {
					where = "locally"
				}
				parts = append(parts, sample.Name+" "+where)
			}
			summary := fmt.Sprintf("%d sample TaskRuns finished in %.1fs (%s); build users, records and finalizers cleaned up",
				len(samples), time.Since(start).Seconds(), strings.Join(parts, ", "))
			if len(failed) > 0 {
				return summary, fmt.Errorf("samples failed: %s", strings.Join(failed, "; "))
			}
			return summary, nil
		}
		select {
		case <-ctx.Done():
			return "", samplesUnfinished(ctx, limit, unfinished)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// samplesUnfinished says why WaitForSamples stopped waiting: its limit ran out, or ctx ended
// (with the stack's failure as its cause, when a component stopped).
func samplesUnfinished(ctx context.Context, limit time.Duration, unfinished []string) error {
	if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
		return fmt.Errorf("waiting for the samples: %w", cause)
	}
	return fmt.Errorf("the samples did not finish within %s: %s still running or not cleaned up", limit, strings.Join(unfinished, ", "))
}
