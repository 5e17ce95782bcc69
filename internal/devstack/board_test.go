package devstack

import (
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
)

// A TaskRun's state on the board: berth's record says while there is one; without one, the
// TaskRun's own labels and condition.
func TestStateOf(t *testing.T) {
	running := func(labels map[string]string, finalizers ...string) *pipelinev1.TaskRun {
		tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Labels: labels, Finalizers: finalizers}}
		tr.Spec.Params = pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues("linux/s390x")}}
		return tr
	}
	ended := func(status corev1.ConditionStatus, finalizers ...string) *pipelinev1.TaskRun {
		tr := running(nil, finalizers...)
		tr.Status.Status = duckv1.Status{Conditions: duckv1.Conditions{{Type: apis.ConditionSucceeded, Status: status}}}
		return tr
	}
	record := func(phase berthv1.Phase) *berthv1.Allocation {
		return &berthv1.Allocation{Status: berthv1.AllocationStatus{Phase: phase}}
	}
	noPlatform := &pipelinev1.TaskRun{}
	for _, tc := range []struct {
		name string
		tr   *pipelinev1.TaskRun
		rec  *berthv1.Allocation
		want string
	}{
		{"not seen by berth yet", running(nil), nil, StateWaiting},
		{"queued", running(nil), record(berthv1.PhaseWaiting), StateWaiting},
		{"slot reserved", running(nil), record(berthv1.PhaseProvisioning), StateProvisioning},
		{"secret handed over", running(nil), record(berthv1.PhaseReady), StateRunning},
		{"run locally", running(map[string]string{contract.AssignedHostLabel: contract.Localhost}), nil, StateRunning},
		{"no platform: not berth's", noPlatform, nil, StateRunning},
		{"ended, user still on the host", ended(corev1.ConditionTrue), record(berthv1.PhaseCleaning), StateCleaning},
		{"ended, finalizer still there", ended(corev1.ConditionTrue, contract.Finalizer), nil, StateCleaning},
		{"succeeded and cleaned up", ended(corev1.ConditionTrue), nil, StateDone},
		{"failed and cleaned up", ended(corev1.ConditionFalse), nil, StateError},
	} {
		if got := stateOf(tc.tr, tc.rec); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
