//go:build linux

package realtekton

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestFailingStepByAttempt(t *testing.T) {
	pod := func(name string, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}}
	}
	always := map[string]string{FailStepAnnotation: "build"}
	firstTwo := map[string]string{FailStepAnnotation: "build", FailAttemptsAnnotation: "2"}
	for _, c := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{pod("tr-pod", nil), ""},
		{pod("tr-pod", always), "build"},
		{pod("tr-pod-retry5", always), "build"},
		{pod("tr-pod", firstTwo), "build"},
		{pod("tr-pod-retry1", firstTwo), "build"},
		{pod("tr-pod-retry2", firstTwo), ""},
		{pod("tr-pod-retry2", map[string]string{FailStepAnnotation: "build", FailAttemptsAnnotation: "two"}), "build"},
	} {
		if got := failingStep(c.pod); got != c.want {
			t.Errorf("pod %s with %v: failing step %q, want %q", c.pod.Name, c.pod.Annotations, got, c.want)
		}
	}
}
