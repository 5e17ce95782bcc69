package security_test

import (
	"context"
	"testing"

	"github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/localaffinity"
)

// TestTenantCannotUnpinALocalBuild: a tenant whose TaskRun on a local platform brings node
// affinity of its own, to have the pod land on a node of another architecture: a term that
// allows arm64 beside amd64, a term that says nothing of the architecture (terms are
// alternatives, so a node matching it alone would do), and a term that asks for arm64. As
// created, every term pins amd64 (the arm64 one then matches no node), so does the pod, and
// only then is the task told to build locally.
func TestTenantCannotUnpinALocalBuild(t *testing.T) {
	applyConfig(t, 1, map[string]string{"local-platforms": "linux/x86_64"})
	defer applyConfig(t, 1, nil)
	tn := newTenant(t, "a")
	arches := func(values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: values}
	}
	zone := corev1.NodeSelectorRequirement{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"arm-zone"}}
	tr := tn.taskRun("unpin", "linux/x86_64")
	tr.Spec.PodTemplate = &pod.Template{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{arches("amd64", "arm64")}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{zone}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{arches("arm64")}},
		}},
	}}}
	tn.create(t, tr)

	amd64 := localaffinity.Node{OS: "linux", Arch: "amd64"}
	created := get(t, tr)
	na := localaffinity.Of(created)
	if !localaffinity.Enforced(na, amd64) || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 3 {
		t.Fatalf("the tenant's terms as created: %+v", na)
	}
	var p corev1.Pod
	eventually(t, "the task's pod exists", func() (bool, error) {
		name := get(t, tr).Status.PodName
		if name == "" {
			return false, nil
		}
		err := admin().Get(context.Background(), client.ObjectKey{Namespace: tn.ns, Name: name}, &p)
		return err == nil, client.IgnoreNotFound(err)
	})
	if p.Spec.Affinity == nil || !localaffinity.Enforced(p.Spec.Affinity.NodeAffinity, amd64) {
		t.Errorf("the pod is not pinned to amd64 nodes: %+v", p.Spec.Affinity)
	}
	if s := secretOf(t, tr); string(s.Data["host"]) != contract.Localhost {
		t.Errorf("secret %v (error %q), want host=localhost", s.Data, s.Data["error"])
	}
	finish(t, tr)
	settled(t, tn.ns)
}
