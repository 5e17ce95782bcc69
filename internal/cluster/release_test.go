package cluster

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestDeprovisionDeletesTheInstanceAndWaitsForTheServiceToFinish(t *testing.T) {
	ctx := context.Background()
	space, _ := newSpace(t)
	makeInstance(t, space.Namespace, "run", "small")
	inst := newObject(instanceGVK, space.Namespace, "run")
	if err := kube.Get(ctx, client.ObjectKeyFromObject(inst), inst); err != nil {
		t.Fatal(err)
	}
	// The CaaS service's finalizer holds the instance until the cluster is torn down.
	const finalizer = "clustertemplateinstance.openshift.io/finalizer"
	inst.SetFinalizers([]string{finalizer})
	if err := kube.Update(ctx, inst); err != nil {
		t.Fatal(err)
	}
	err := Deprovision(ctx, space, "run", Polling{Timeout: 300 * time.Millisecond, Interval: fast.Interval}, &log{})
	mustContain(t, "the error", errText(err), "is still there 300ms after its deletion (finalizers: "+finalizer+")")

	torndown := make(chan error, 1)
	var progress log
	go func() {
		torndown <- Deprovision(ctx, space, "run", fast, &progress)
	}()
	eventually(t, "the second deprovision to start waiting", func() bool { return progress.String() != "" })
	if err := kube.Get(ctx, client.ObjectKeyFromObject(inst), inst); err != nil {
		t.Fatal(err)
	}
	inst.SetFinalizers(nil)
	if err := kube.Update(ctx, inst); err != nil {
		t.Fatal(err)
	}
	if err := <-torndown; err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if err := kube.Get(ctx, client.ObjectKeyFromObject(inst), inst); !apierrors.IsNotFound(err) {
		t.Fatalf("the instance is still there: %v", err)
	}
	if err := Deprovision(ctx, space, "run", fast, &log{}); err != nil {
		t.Fatalf("deprovisioning a deprovisioned cluster: %v", err)
	}
}

func TestReleaseSpaceDeletesTheRequest(t *testing.T) {
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
	if err := ReleaseSpace(ctx, kube, tenant, req.Name, fast, &log{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: tenant, Name: req.Name}, newObject(spaceRequestGVK, tenant, req.Name)); !apierrors.IsNotFound(err) {
		t.Fatalf("the SpaceRequest is still there: %v", err)
	}
	var progress log
	if err := ReleaseSpace(ctx, kube, tenant, req.Name, fast, &progress); err != nil {
		t.Fatalf("releasing a released space: %v", err)
	}
	mustContain(t, "the progress", progress.String(), "gone already")
}
