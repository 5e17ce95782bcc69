package cluster

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// phaseReady is the phase of a ClusterTemplateInstance whose cluster is up. The terminal
// failures are the *Failed phases (CredentialsFailed and Failed among them).
const phaseReady = "Ready"

// Ready tells whether the cluster is up: phase Ready and a Ready condition that is True.
func (i Instance) Ready() bool {
	c := i.condition("Ready")
	return i.Phase == phaseReady && c != nil && c.Status == metav1.ConditionTrue
}

// Failure describes a terminal failure, or is empty: a failure phase, or a condition that is
// False for a reason that says something failed.
func (i Instance) Failure() string {
	var failed []string
	for _, c := range i.Conditions {
		if c.Status == metav1.ConditionFalse && strings.Contains(c.Reason, "Failed") {
			s := fmt.Sprintf("condition %s=False (%s)", c.Type, c.Reason)
			if c.Message != i.Message {
				s += messageSuffix(c.Message)
			}
			failed = append(failed, s)
		}
	}
	// The operator's newer phases end in "FailedPhase" (ClusterSetupFailedPhase).
	failedPhase := strings.HasSuffix(i.Phase, "Failed") || strings.HasSuffix(i.Phase, "FailedPhase")
	if !failedPhase && len(failed) == 0 {
		return ""
	}
	return strings.Join(append([]string{i.state()}, failed...), "; ")
}

func (i Instance) condition(t string) *metav1.Condition {
	for k := range i.Conditions {
		if i.Conditions[k].Type == t {
			return &i.Conditions[k]
		}
	}
	return nil
}

func (i Instance) state() string { return "phase " + orNone(i.Phase) + messageSuffix(i.Message) }

func messageSuffix(m string) string {
	if m == "" {
		return ""
	}
	return ": " + m
}

// Wait polls a ClusterTemplateInstance until it is ready, writing a line to progress whenever
// its phase or message changes. A terminal failure ends the wait at once with the service's
// message; a timeout says which phase the cluster was stuck in.
func Wait(ctx context.Context, space *Space, name string, p Polling, progress io.Writer) (Instance, error) {
	var (
		last     Instance
		lastLine string
		start    = time.Now()
		ref      = fmt.Sprintf("ClusterTemplateInstance %s/%s", space.Namespace, name)
	)
	err := poll(ctx, p, progress, func(ctx context.Context) (bool, error) {
		inst, err := getInstance(ctx, space, name)
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("%s does not exist: it was never created or has been deleted", ref)
		}
		if err != nil {
			return false, fmt.Errorf("reading %s: %w", ref, err)
		}
		last = inst
		if line := inst.state(); line != lastLine {
			fmt.Fprintf(progress, "[%s] %s: %s\n", elapsed(start), ref, line)
			lastLine = line
		}
		if inst.Ready() {
			return true, nil
		}
		if why := inst.Failure(); why != "" {
			return false, fmt.Errorf("cluster %s failed: %s", name, why)
		}
		return false, nil
	})
	if isTimeout(err) {
		return last, fmt.Errorf("cluster %s is not ready after %s: still in %s", name, p.Timeout, last.stuckIn())
	}
	if err != nil {
		return last, err
	}
	fmt.Fprintf(progress, "[%s] cluster %s is ready: %s\n", elapsed(start), name, orNone(last.APIServerURL))
	return last, nil
}

// stuckIn names the phase a wait ended in, and a Ready condition that disagrees with it.
func (i Instance) stuckIn() string {
	s := i.state()
	if c := i.condition("Ready"); i.Phase == phaseReady && (c == nil || c.Status != metav1.ConditionTrue) {
		s += " without a Ready=True condition"
	}
	return s
}
