package contract

import (
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
)

// A user task has a PLATFORM param and, in the spec Tekton resolved, a volume of a task
// secret; the spec as the tenant wrote it does not count.
func TestResolvedUserTask(t *testing.T) {
	volume := func(secret string) corev1.Volume {
		return corev1.Volume{Name: "ssh", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}
	}
	task := func(platform bool, resolved []corev1.Volume) *pipelinev1.TaskRun {
		tr := &pipelinev1.TaskRun{Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Volumes: []corev1.Volume{volume(SecretPrefix + "t")}}}}
		if platform {
			tr.Spec.Params = pipelinev1.Params{{Name: PlatformParam, Value: *pipelinev1.NewStructuredValues("linux/arm64")}}
		}
		if resolved != nil {
			tr.Status.TaskSpec = &pipelinev1.TaskSpec{Volumes: resolved}
		}
		return tr
	}
	for _, tc := range []struct {
		name string
		tr   *pipelinev1.TaskRun
		want bool
	}{
		{"resolved, mounting a task secret", task(true, []corev1.Volume{{Name: "empty"}, volume(SecretPrefix + "t")}), true},
		{"not yet resolved", task(true, nil), false},
		{"resolved, mounting another secret", task(true, []corev1.Volume{volume("registry")}), false},
		{"no PLATFORM param", task(false, []corev1.Volume{volume(SecretPrefix + "t")}), false},
	} {
		if got := ResolvedUserTask(tc.tr); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
