package taskrun

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/localaffinity"
	"github.com/berth-ci/berth/internal/otp"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// cachedSize is the size of what the cache keeps of obj, as JSON: a measure that grows with
// every byte kept.
func cachedSize(t *testing.T, obj any) int {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return len(data)
}

// TestStripSecretKeepsWhatBerthJudgesBy: a task secret berth sealed, then given 1 MiB of data
// and 256 KiB of annotations by its tenant, is cached in well under a kilobyte, and the cached
// copy is judged as the live one is: the seal checked on the digest, tampering told by it.
func TestStripSecretKeepsWhatBerthJudgesBy(t *testing.T) {
	uid := types.UID("3b8e6c1e-0000-4000-8000-000000000001")
	rec := &berthv1.Allocation{Spec: berthv1.AllocationSpec{TaskRun: berthv1.TaskRunRef{Namespace: "tenant", Name: "build", UID: uid}}}
	rec.Status.Phase, rec.Status.BuildUser, rec.Status.Login = berthv1.PhaseReady, "u-1", &berthv1.HostLogin{Host: "h1"}
	var err error
	if rec.Status.SealKey, err = newSealKey(); err != nil {
		t.Fatal(err)
	}
	token := otp.NewToken().String()
	handed := tasksecret.ForOTP(tasksecret.Owner{Name: "build", Namespace: "tenant", UID: uid}, tasksecret.Name("build"), token, "https://otp.example/otp", []byte("ca"), "h1", "/home/u-1")
	want := seal(handed, rec)

	cached := func(s *corev1.Secret) *corev1.Secret {
		t.Helper()
		out, err := stripSecret(s.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		return out.(*corev1.Secret)
	}
	c := cached(handed)
	if !handedOverWith(c, rec, cachedDigest(c)) || cachedDigest(c) != want || string(c.Data["otp"]) != token {
		t.Fatalf("the cached copy of the handed-over secret is not judged handed over (digest %q, want %q; otp %q)", cachedDigest(c), want, c.Data["otp"])
	}

	big := handed.DeepCopy()
	big.Data["blob"] = []byte(strings.Repeat("x", 1<<20))
	big.Data["otp"] = []byte(strings.Repeat("y", 1<<10))
	big.Annotations["tenant.example/blob"] = strings.Repeat("z", 256<<10)
	big.Annotations[SealAnnotation] = strings.Repeat("s", 64<<10)
	big.Labels["tenant.example/label"] = "x"
	// Decoys of the same name before berth's reference, and a thousand after it.
	decoys := []metav1.OwnerReference{{Kind: "TaskRun", Name: "build", UID: "decoy-1"}, {Kind: "TaskRun", Name: "build", UID: "decoy-1"}, {Kind: "TaskRun", Name: "build", UID: "decoy-2"}}
	big.OwnerReferences = append(decoys, big.OwnerReferences...)
	for i := range 1000 {
		big.OwnerReferences = append(big.OwnerReferences, metav1.OwnerReference{Kind: "TaskRun", Name: "build", UID: types.UID(fmt.Sprint("decoy-after-", i))})
	}
	c = cached(big)
	if n := cachedSize(t, c); n > 1024 {
		t.Errorf("a 1.3 MiB secret is cached in %d bytes: %s", n, c.String())
	}
	if cachedDigest(c) != digest(big.Data) || cachedDigest(c) == want {
		t.Errorf("the cached digest %q does not tell the tampering (live digest %q, handed over %q)", cachedDigest(c), digest(big.Data), want)
	}
	if len(c.Data["otp"]) != 0 || c.Annotations[SealAnnotation] != "" {
		t.Errorf("a malformed token or seal was cached: %v %v", c.Data, c.Annotations)
	}
	if !ownedBy(c, uid) {
		t.Errorf("berth's owner reference was not kept: %v", c.OwnerReferences)
	}
	// A secret read past the cache never passes for a cached one, whatever it says.
	forged := handed.DeepCopy()
	forged.Annotations[cachedDigestKey] = want
	if cachedDigest(forged) != "" {
		t.Errorf("a live secret's digest was read from the secret itself")
	}
}

// TestStripTaskRunIsBounded: a user TaskRun with 1 MiB of params, 256 KiB of annotations,
// a long status message and thousands of volumes is cached in a couple of kilobytes, keeping
// what berth reads of it.
func TestStripTaskRunIsBounded(t *testing.T) {
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "build", Namespace: "tenant", UID: "u", Finalizers: []string{contract.Finalizer},
			Labels:        map[string]string{contract.WaitingForPlatformLabel: "linux-arm64", "tenant.example/l": "x"},
			Annotations:   map[string]string{contract.QueuePositionAnnotation: "3", "tenant.example/blob": strings.Repeat("a", 256<<10)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "tenant"}}},
		Spec: pipelinev1.TaskRunSpec{Params: pipelinev1.Params{
			{Name: "blob", Value: *pipelinev1.NewStructuredValues(strings.Repeat("p", 1<<20))},
			{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues("linux/arm64")},
		}, StatusMessage: pipelinev1.TaskRunSpecStatusMessage(strings.Repeat("m", 64<<10))},
	}
	tr.Status.TaskSpec = &pipelinev1.TaskSpec{Description: strings.Repeat("d", 64<<10)}
	for i := range 2000 {
		tr.Status.TaskSpec.Volumes = append(tr.Status.TaskSpec.Volumes, corev1.Volume{Name: "v" + strings.Repeat("x", i%50),
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + "build"}}})
	}
	tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionUnknown, Reason: "Running", Message: strings.Repeat("m", 32<<10)})

	out, err := stripTaskRun(tr.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	c := out.(*pipelinev1.TaskRun)
	if n := cachedSize(t, c); n > 2048 {
		t.Errorf("a 1.4 MiB TaskRun is cached in %d bytes", n)
	}
	if classifyUser(c) != userTask || contract.Platform(c) != "linux/arm64" || c.IsDone() || !c.HasStarted() && c.Status.GetCondition(apis.ConditionSucceeded) == nil {
		t.Errorf("what berth reads was lost: class %v, platform %q, condition %v", classifyUser(c), contract.Platform(c), c.Status.GetCondition(apis.ConditionSucceeded))
	}
	if c.Labels[contract.WaitingForPlatformLabel] != "linux-arm64" || c.Annotations[contract.QueuePositionAnnotation] != "3" || len(c.Finalizers) != 1 {
		t.Errorf("berth's mirrors were lost: %v %v %v", c.Labels, c.Annotations, c.Finalizers)
	}
	if _, kept := c.Labels["tenant.example/l"]; kept {
		t.Errorf("a label berth does not read was kept")
	}

	long := tr.DeepCopy()
	long.Spec.Params[1].Value = *pipelinev1.NewStructuredValues("linux/" + strings.Repeat("a", 1<<20))
	out, err = stripTaskRun(long)
	if err != nil {
		t.Fatal(err)
	}
	if p := contract.Platform(out.(*pipelinev1.TaskRun)); p != platformTooLong {
		t.Errorf("an over-long PLATFORM is cached as %d bytes, not as %q", len(p), platformTooLong)
	}
}

// TestMapPatchAddsToACutDownMap: labels the cache dropped are not replaced by a patch.
func TestMapPatchAddsToACutDownMap(t *testing.T) {
	ops := mapPatch("/metadata/labels", map[string]string{}, map[string]string{"k": "v"})
	if len(ops) != 1 || ops[0].Op != "add" || ops[0].Path != "/metadata/labels/k" {
		t.Errorf("ops %+v: want one add of the key", ops)
	}
	ops = mapPatch("/metadata/labels", nil, map[string]string{"k": "v"})
	if len(ops) != 2 || ops[0].Op != "test" || ops[1].Path != "/metadata/labels" {
		t.Errorf("ops %+v: want a test that there are none and an add of the map", ops)
	}
}

// tenantFinalizers are n finalizers of the longest name the apiserver takes (a DNS subdomain
// prefix of 253 characters, a name of 63): 317 bytes each.
func tenantFinalizers(n int) []string {
	label := strings.Repeat("p", 63)
	out := make([]string, n)
	for i := range out {
		first := fmt.Sprintf("f%d", i)
		prefix := first + strings.Repeat("p", 63-len(first)) + "." + label + "." + label + "." + label[:61]
		out[i] = prefix + "/" + strings.Repeat("n", 63)
	}
	return out
}

// bigAffinity is a required node affinity of about size bytes that pins nothing to a platform.
func bigAffinity(size int) *pod.Template {
	values := make([]string, size/64)
	for i := range values {
		values[i] = fmt.Sprintf("%063d", i)
	}
	return &pod.Template{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "tenant.example/zone", Operator: corev1.NodeSelectorOpIn, Values: values}},
		}}},
	}}}
}

// TestStripTaskRunKeepsNoTenantSizedFinalizersOrAffinity: a megabyte of finalizers, on a
// TaskRun berth serves and on one it does not, and a megabyte of required node affinity are
// cached in a couple of kilobytes; what berth reads of them is kept: its own finalizer's
// presence, and whether the affinity pins the pod to its platform's nodes.
func TestStripTaskRunKeepsNoTenantSizedFinalizersOrAffinity(t *testing.T) {
	many := tenantFinalizers((1 << 20) / 317)
	strip := func(tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
		t.Helper()
		out, err := stripTaskRun(tr.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		c := out.(*pipelinev1.TaskRun)
		if n := cachedSize(t, c); n > 2048 {
			t.Errorf("%s: a TaskRun of a megabyte is cached in %d bytes", tr.Name, n)
		}
		return c
	}

	served := userTaskRun("served", s390x)
	served.Finalizers = append(slices.Clone(many[:len(many)/2]), append([]string{contract.Finalizer}, many[len(many)/2:]...)...)
	if c := strip(served); !slices.Contains(c.Finalizers, contract.Finalizer) || !slices.Contains(c.Finalizers, finalizersCut) {
		t.Errorf("served: cached finalizers %v, want berth's and the mark that others were cut", c.Finalizers)
	}
	unrelated := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Name: "unrelated", Namespace: tenantNS, Finalizers: many}}
	if c := strip(unrelated); !slices.Equal(c.Finalizers, []string{finalizersCut}) {
		t.Errorf("unrelated: cached finalizers %v, want only the mark that others were cut", c.Finalizers)
	}
	few := userTaskRun("few", s390x)
	few.Finalizers = []string{"chains.tekton.dev", contract.Finalizer}
	if c := strip(few); !slices.Equal(c.Finalizers, few.Finalizers) {
		t.Errorf("few: cached finalizers %v, want them as they are %v", c.Finalizers, few.Finalizers)
	}

	node, _ := localaffinity.NodeOf(amd64)
	pinned := userTaskRun("pinned", amd64)
	pinned.Spec.PodTemplate = bigAffinity(1 << 20)
	pinned.Spec.PodTemplate.Affinity.NodeAffinity = localaffinity.Require(pinned.Spec.PodTemplate.Affinity.NodeAffinity, node)
	if c := strip(pinned); !localaffinity.Enforced(localaffinity.Of(c), node) {
		t.Error("pinned: the cached TaskRun no longer shows its pod pinned to linux/amd64 nodes")
	}
	loose := userTaskRun("loose", amd64)
	loose.Spec.PodTemplate = bigAffinity(1 << 20)
	if c := strip(loose); localaffinity.Enforced(localaffinity.Of(c), node) {
		t.Error("loose: the cached TaskRun shows its pod pinned to linux/amd64 nodes, and it is not")
	}
	remote := userTaskRun("remote", s390x)
	remote.Spec.PodTemplate = bigAffinity(1 << 20)
	strip(remote)
}

// TestBerthsFinalizerComesAndGoesAmongAMegabyteOfOthers: the cache keeps only berth's
// finalizer of a TaskRun whose tenant gave it a megabyte of them, and berth still adds its own
// when the task gets a host and removes it when the task ends, leaving the tenant's in place
// and in order.
func TestBerthsFinalizerComesAndGoesAmongAMegabyteOfOthers(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	theirs := tenantFinalizers((1 << 20) / 317)
	tr := userTaskRun("build", s390x)
	tr.Finalizers = slices.Clone(theirs)
	created := h.create(tr)
	h.settle()
	h.handedOver(created)
	got := h.get("build")
	if want := append(slices.Clone(theirs), contract.Finalizer); !slices.Equal(got.Finalizers, want) {
		t.Fatalf("with a host: %d finalizers, berth's last: %v; want the tenant's %d and berth's after them", len(got.Finalizers), slices.Contains(got.Finalizers, contract.Finalizer), len(theirs))
	}
	h.finish("build")
	h.settle()
	if got := h.get("build"); !slices.Equal(got.Finalizers, theirs) {
		t.Fatalf("ended: %d finalizers, berth's among them: %v; want the tenant's %d alone", len(got.Finalizers), slices.Contains(got.Finalizers, contract.Finalizer), len(theirs))
	}
}
