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
		// handedOver: the task's secret names the record's build user
		handedOver bool
		want       string
	}{
		{"not seen by berth yet", running(nil), nil, false, StateWaiting},
		{"queued", running(nil), record(berthv1.PhaseWaiting), false, StateWaiting},
		{"slot reserved", running(nil), record(berthv1.PhaseProvisioning), false, StateProvisioning},
		{"secret handed over", running(nil), record(berthv1.PhaseProvisioning), true, StateRunning},
		{"adopted from the controller berth replaced", running(nil), record(berthv1.PhaseReady), false, StateRunning},
		{"run locally", running(map[string]string{contract.AssignedHostLabel: contract.Localhost}), nil, false, StateRunning},
		{"no platform: not berth's", noPlatform, nil, false, StateRunning},
		{"ended, clean owed after a failure", ended(corev1.ConditionTrue), record(berthv1.PhaseCleaning), false, StateCleaning},
		{"ended, user still on the host", ended(corev1.ConditionTrue), record(berthv1.PhaseProvisioning), true, StateCleaning},
		{"ended, finalizer still there", ended(corev1.ConditionTrue, contract.Finalizer), nil, false, StateCleaning},
		{"succeeded and cleaned up", ended(corev1.ConditionTrue), nil, false, StateDone},
		{"failed and cleaned up", ended(corev1.ConditionFalse), nil, false, StateError},
	} {
		if got := stateOf(tc.tr, tc.rec, tc.handedOver); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
