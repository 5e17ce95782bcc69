package cluster

import (
	"context"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// newRun is the TaskRun a space belongs to.
func newRun(t *testing.T, namespace string) Owner {
	t.Helper()
	tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "integration-run"},
		Spec: pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "integration"}}}
	if err := kube.Create(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	return Owner{Kind: "TaskRun", Name: tr.Name, UID: tr.UID}
}

// served is what the test's space service did.
type served struct {
	access SpaceAccess
	err    error
}

// serveSpace waits for a SpaceRequest and then serves it as the space service does.
func serveSpace(namespace, name string) <-chan served {
	out := make(chan served, 1)
	go func() {
		sr, err := awaitSpaceRequest(namespace, name)
		if err != nil {
			out <- served{err: err}
			return
		}
		access := SpaceAccess{Namespace: namespace + "-" + name, TenantNamespace: namespace, SecretName: name + "-kubeconfig", ClusterURL: cp.Config.Host}
		if err := grantSpace(namespace, access.Namespace, access.SecretName); err != nil {
			out <- served{err: err}
			return
		}
		out <- served{access: access, err: setStatus(sr, map[string]any{
			"targetClusterURL": access.ClusterURL,
			"namespaceAccess":  []any{map[string]any{"name": access.Namespace, "secretRef": access.SecretName}},
			"conditions":       []any{condition("Ready", "True", "Provisioned", "")},
		})}
	}()
	return out
}

// awaitSpaceRequest polls until a SpaceRequest exists.
func awaitSpaceRequest(namespace, name string) (*unstructured.Unstructured, error) {
	return awaitObject(newObject(spaceRequestGVK, namespace, name))
}

func TestProvisionSpaceWaitsUntilReadyAndReusesTheRequestOnARerun(t *testing.T) {
	ctx := context.Background()
	tenant := newNamespace(t, "tenant")
	req := SpaceRequest{Namespace: tenant, Name: "integration-run", TierName: "appstudio-env", API: SpaceAPISpaceRequest, Owner: newRun(t, tenant)}
	service := serveSpace(tenant, req.Name)
	var progress log
	access, err := ProvisionSpace(ctx, kube, req, fast, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if s := <-service; s.err != nil || access != s.access {
		t.Fatalf("got access %+v, the service granted %+v (%v)", access, s.access, s.err)
	}
	mustContain(t, "the progress", progress.String(), "created SpaceRequest "+tenant+"/integration-run", "Ready=True (Provisioned)")

	actsAndIsReused(t, req, access, "reusing SpaceRequest")
	list := newList(spaceRequestGVK)
	if err := kube.List(ctx, list, client.InNamespace(tenant)); err != nil || len(list.Items) != 1 {
		t.Fatalf("want one SpaceRequest after two runs, got %d (%v)", len(list.Items), err)
	}
}

// actsAndIsReused checks that the space's kubeconfig acts in the space and that a re-run of
// req gets the same space, its progress saying reused.
func actsAndIsReused(t *testing.T, req SpaceRequest, access SpaceAccess, reused string) {
	t.Helper()
	ctx := context.Background()
	space, err := SpaceFromSecret(ctx, kube, access)
	if err != nil {
		t.Fatal(err)
	}
	if err := makeTemplateInstanceProbe(ctx, space); err != nil {
		t.Fatalf("the space's kubeconfig does not act in the space: %v", err)
	}
	var progress log
	if again, err := ProvisionSpace(ctx, kube, req, fast, &progress); err != nil || again != access {
		t.Fatalf("a re-run got %+v, %v; want the same space %+v", again, err, access)
	}
	mustContain(t, "the re-run's progress", progress.String(), reused)
}

// The space lives as long as its run: deleting the run deletes the SpaceRequest (and the
// space service then the space). The test runs beside the others because kube-controller-
// manager's garbage collector notices CRDs installed after its start only at its next
// discovery, up to 30 seconds later.
func TestDeletingTheRunDeletesItsSpace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tenant := newNamespace(t, "tenant")
	req := SpaceRequest{Namespace: tenant, Name: "run", TierName: "appstudio-env", API: SpaceAPISpaceRequest, Owner: newRun(t, tenant)}
	service := serveSpace(tenant, req.Name)
	if _, err := ProvisionSpace(ctx, kube, req, fast, &log{}); err != nil {
		t.Fatal(err)
	}
	if s := <-service; s.err != nil {
		t.Fatal(s.err)
	}
	if err := kube.Delete(ctx, &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: req.Owner.Name}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the garbage collector to delete the SpaceRequest of the deleted TaskRun", func() bool {
		return apierrors.IsNotFound(kube.Get(ctx, client.ObjectKey{Namespace: tenant, Name: req.Name}, newObject(spaceRequestGVK, tenant, req.Name)))
	})
}

// makeTemplateInstanceProbe lists cluster instances in the space as its kubeconfig's
// ServiceAccount.
func makeTemplateInstanceProbe(ctx context.Context, space *Space) error {
	return space.Client.List(ctx, newList(instanceGVK), client.InNamespace(space.Namespace))
}

func TestProvisionSpaceFailsAtOnceWhenTheServiceCannotServeIt(t *testing.T) {
	ctx := context.Background()
	tenant := newNamespace(t, "tenant")
	req := SpaceRequest{Namespace: tenant, Name: "run", TierName: "no-such-tier", API: SpaceAPISpaceRequest, Owner: newRun(t, tenant)}
	refused := make(chan error, 1)
	go func() {
		sr, err := awaitSpaceRequest(tenant, req.Name)
		if err == nil {
			err = setStatus(sr, map[string]any{"conditions": []any{condition("Ready", "False", "Provisioning", "")}})
		}
		if err == nil {
			err = setStatus(sr, map[string]any{"conditions": []any{condition("Ready", "False", "UnableToCreateSpace", "tier no-such-tier does not exist")}})
		}
		refused <- err
	}()
	// A timeout far beyond the test's patience: only failing fast passes.
	_, err := ProvisionSpace(ctx, kube, req, Polling{Timeout: time.Hour, Interval: fast.Interval}, &log{})
	if err := <-refused; err != nil {
		t.Fatal(err)
	}
	mustContain(t, "the error", errText(err), "cannot serve SpaceRequest "+tenant+"/run", "UnableToCreateSpace", "tier no-such-tier does not exist")
}

func TestProvisionSpaceTimesOutSayingWhereItStood(t *testing.T) {
	tenant := newNamespace(t, "tenant")
	req := SpaceRequest{Namespace: tenant, Name: "run", TierName: "appstudio-env", API: SpaceAPISpaceRequest, Owner: newRun(t, tenant)}
	_, err := ProvisionSpace(context.Background(), kube, req, Polling{Timeout: 300 * time.Millisecond, Interval: fast.Interval}, &log{})
	mustContain(t, "the error", errText(err), "SpaceRequest "+tenant+"/run is not ready after 300ms", "Ready=Unknown")
}

func TestProvisionSpaceRefusesAnOwnerThatWouldDeleteItAtOnce(t *testing.T) {
	ctx := context.Background()
	tenant := newNamespace(t, "tenant")
	owner := newRun(t, tenant)
	for name, o := range map[string]Owner{
		"wrong UID":     {Kind: "TaskRun", Name: owner.Name, UID: "0b7c1e5e-0000-4000-8000-000000000000"},
		"missing run":   {Kind: "PipelineRun", Name: "no-such-run", UID: owner.UID},
		"not a run":     {Kind: "Pod", Name: owner.Name, UID: owner.UID},
		"no owner name": {Kind: "TaskRun", UID: owner.UID},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ProvisionSpace(ctx, kube, SpaceRequest{Namespace: tenant, Name: "run", TierName: "appstudio-env", API: SpaceAPISpaceRequest, Owner: o}, fast, &log{})
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
		})
	}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: tenant, Name: "run"}, newObject(spaceRequestGVK, tenant, "run")); !apierrors.IsNotFound(err) {
		t.Fatalf("a SpaceRequest was made for a bad owner: %v", err)
	}
}

// A kubeconfig that names no namespace needs one given: the steps never guess "default".
func TestSpaceFromKubeconfigWantsANamespace(t *testing.T) {
	_, err := SpaceFromKubeconfig(cp.KubeConfig, "")
	mustContain(t, "the error", errText(err), "the space kubeconfig names no namespace")
	space, err := SpaceFromKubeconfig(cp.KubeConfig, "given")
	if err != nil || space.Namespace != "given" {
		t.Fatalf("SpaceFromKubeconfig with a namespace = %+v, %v", space, err)
	}
}
