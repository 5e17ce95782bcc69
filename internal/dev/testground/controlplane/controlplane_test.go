package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var cp *ControlPlane

func TestMain(m *testing.M) { os.Exit(RunTests(m, &cp)) }

// The version the Go code looks for must be the one hack/tools builds, or every test package
// would fail on a fresh machine with a confusing "missing binary".
func TestKubernetesVersionMatchesToolsModule(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "hack", "tools", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes v(\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("hack/tools/go.mod does not require k8s.io/kubernetes")
	}
	if string(m[1]) != KubernetesVersion {
		t.Fatalf("hack/tools builds kubernetes %s but KubernetesVersion is %s", m[1], KubernetesVersion)
	}
}

func TestTaskRunLifecycleOnRealAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cp.EnsureNamespace(ctx, "lifecycle"); err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(cp.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &pipelinev1.TaskRunList{}, client.InNamespace("lifecycle"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "build-s390x", Namespace: "lifecycle"},
		Spec: pipelinev1.TaskRunSpec{
			Params:   pipelinev1.Params{{Name: "PLATFORM", Value: *pipelinev1.NewStructuredValues("linux/s390x")}},
			TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "build", Image: "busybox", Script: "true"}}},
		},
	}
	if err := cp.Client.Create(ctx, tr); err != nil {
		t.Fatalf("creating a v1 TaskRun: %v", err)
	}

	tr.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionSucceeded, Status: corev1.ConditionUnknown, Reason: "Running"}}
	tr.Status.PodName = "build-s390x-pod"
	if err := cp.Client.Status().Update(ctx, tr); err != nil {
		t.Fatalf("updating TaskRun status: %v", err)
	}

	var got pipelinev1.TaskRun
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(tr), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.PodName != "build-s390x-pod" || got.Status.GetCondition(apis.ConditionSucceeded).Reason != "Running" {
		t.Fatalf("status did not persist through the status subresource: %+v", got.Status)
	}
	if got.Spec.Params[0].Value.StringVal != "linux/s390x" {
		t.Fatalf("PLATFORM param lost: %+v", got.Spec.Params)
	}

	seen := map[watch.EventType]bool{}
	for !(seen[watch.Added] && seen[watch.Modified]) {
		select {
		case ev := <-w.ResultChan():
			seen[ev.Type] = true
		case <-ctx.Done():
			t.Fatalf("watch saw %v, want Added and Modified", seen)
		}
	}
}

func TestTektonCRDsAreServed(t *testing.T) {
	ctx := context.Background()
	for _, list := range []client.ObjectList{&pipelinev1.TaskList{}, &pipelinev1.TaskRunList{}, &pipelinev1.PipelineRunList{}} {
		if err := cp.Client.List(ctx, list); err != nil {
			t.Errorf("listing %T: %v", list, err)
		}
	}
}

// gcPatience bounds the waits for kube-controller-manager; its controllers act within seconds
// once they have synced, which takes a few seconds after the control plane starts.
const gcPatience = time.Minute

func eventuallyGone(t *testing.T, what string, obj client.Object) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, gcPatience, true, func(ctx context.Context) (bool, error) {
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("%s is still there after %s: %v", what, gcPatience, err)
	}
}

func TestOwnerReferencesAreFollowed(t *testing.T) {
	if !cp.CollectsGarbage() {
		t.Fatal("the package's control plane runs no kube-controller-manager")
	}
	ctx := context.Background()
	if err := cp.EnsureNamespace(ctx, "gc"); err != nil {
		t.Fatal(err)
	}
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "gc"}}
	if err := cp.Client.Create(ctx, owner); err != nil {
		t.Fatal(err)
	}
	dependent := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dependent", Namespace: "gc",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}}}}
	if err := cp.Client.Create(ctx, dependent); err != nil {
		t.Fatal(err)
	}
	bystander := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bystander", Namespace: "gc"}}
	if err := cp.Client.Create(ctx, bystander); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Delete(ctx, owner); err != nil {
		t.Fatal(err)
	}
	eventuallyGone(t, "the ConfigMap whose owner was deleted", dependent)
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(bystander), bystander); err != nil {
		t.Fatalf("a ConfigMap without owner went too: %v", err)
	}
}

func TestDeletedNamespaceIsGone(t *testing.T) {
	ctx := context.Background()
	if err := cp.EnsureNamespace(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "build", Namespace: "doomed"},
		Spec:       pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "build", Image: "busybox", Script: "true"}}}},
	}
	if err := cp.Client.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}
	if err := cp.Client.Delete(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// Only the namespace controller empties a namespace (custom resources included) and then
	// removes it.
	eventuallyGone(t, "the deleted namespace", ns)
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(tr), tr); !apierrors.IsNotFound(err) {
		t.Fatalf("the TaskRun of the deleted namespace: %v, want not found", err)
	}
}
