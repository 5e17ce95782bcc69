package spacestandin

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

var (
	cp      *controlplane.ControlPlane
	standIn *StandIn
)

func TestMain(m *testing.M) {
	crds, err := realdata.CRDDir()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(1)
	}
	claims, err := ClaimCRD()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(1)
	}
	opts := []controlplane.Option{controlplane.WithCRDs(crds), controlplane.WithCRDObjects(claims)}
	os.Exit(controlplane.RunTestsWith(m, &cp, opts, func(ctx context.Context) error {
		return startStandIn(ctx)
	}))
}

func startStandIn(ctx context.Context) error {
	s, err := New(cp.Config, Options{})
	if err != nil {
		return err
	}
	if err := s.Start(ctx); err != nil {
		return err
	}
	standIn = s
	return nil
}

// patience bounds every wait; the namespace controller takes a few seconds to empty a namespace.
const patience = time.Minute

func tenant(t *testing.T, name string) string {
	t.Helper()
	if err := cp.EnsureNamespace(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return name
}

func createRequest(t *testing.T, namespace, name, tier string) types.NamespacedName {
	t.Helper()
	u := newUnstructured()
	u.SetNamespace(namespace)
	u.SetName(name)
	if err := unstructured.SetNestedField(u.Object, tier, "spec", "tierName"); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("creating SpaceRequest %s/%s: %v", namespace, name, err)
	}
	return types.NamespacedName{Namespace: namespace, Name: name}
}

// waitForRequest polls the request until cond holds and returns it.
func waitForRequest(t *testing.T, key types.NamespacedName, what string, cond func(*spaceRequest) bool) *spaceRequest {
	t.Helper()
	return waitFor(t, spaceRequestGVK, key, what, fromUnstructured, cond)
}

// waitFor polls the object of gvk at key until cond holds on the stand-in's view of it (read)
// and returns that.
func waitFor[T any](t *testing.T, gvk schema.GroupVersionKind, key types.NamespacedName, what string,
	read func(*unstructured.Unstructured) (*T, error), cond func(*T) bool) *T {
	t.Helper()
	var last *T
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, patience, true, func(ctx context.Context) (bool, error) {
		u := newObject(gvk)
		if err := cp.Client.Get(ctx, key, u); err != nil {
			return false, err
		}
		v, err := read(u)
		if err != nil {
			return false, err
		}
		last = v
		return cond(v), nil
	})
	if err != nil {
		t.Fatalf("%s %s: %s: %v; last seen %+v", gvk.Kind, key, what, err, last)
	}
	return last
}

func isReady(sr *spaceRequest) bool {
	c := sr.Status.ready()
	return c != nil && c.Status == "True"
}

func waitGone(t *testing.T, what string, obj func() error) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, patience, true, func(context.Context) (bool, error) {
		err := obj()
		return apierrors.IsNotFound(err), client404(err)
	})
	if err != nil {
		t.Fatalf("%s is still there: %v", what, err)
	}
}

func client404(err error) error {
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// spaceClient acts with the kubeconfig the request's access Secret holds.
func spaceClient(t *testing.T, sr *spaceRequest) kubernetes.Interface {
	t.Helper()
	if len(sr.Status.NamespaceAccess) != 1 {
		t.Fatalf("namespaceAccess %+v, want one entry", sr.Status.NamespaceAccess)
	}
	var secret corev1.Secret
	key := types.NamespacedName{Namespace: sr.Namespace, Name: sr.Status.NamespaceAccess[0].SecretRef}
	if err := cp.Client.Get(context.Background(), key, &secret); err != nil {
		t.Fatalf("the access Secret: %v", err)
	}
	if !metav1.IsControlledBy(&secret, sr) {
		t.Fatalf("access Secret %s is not owned by its SpaceRequest: %+v", key, secret.OwnerReferences)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["kubeconfig"])
	if err != nil {
		t.Fatalf("the access Secret's kubeconfig does not load: %v", err)
	}
	if cfg.Host != strings.TrimSuffix(cp.Config.Host, "/") {
		t.Fatalf("the kubeconfig reaches %s, want the apiserver %s", cfg.Host, cp.Config.Host)
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

func TestSpaceRequestGivesAdminRightsInItsNamespaceOnly(t *testing.T) {
	ctx := context.Background()
	ns := tenant(t, "alice-tenant")
	first := createRequest(t, ns, "integration-env", "appstudio-env")
	second := createRequest(t, ns, "integration-env-2", "appstudio-env")
	sr := waitForRequest(t, first, "becomes ready", isReady)
	other := waitForRequest(t, second, "becomes ready", isReady)

	if c := sr.Status.ready(); c.Reason != reasonProvisioned {
		t.Errorf("Ready reason %q, want %q", c.Reason, reasonProvisioned)
	}
	if want := strings.TrimSuffix(cp.Config.Host, "/"); sr.Status.TargetClusterURL != want {
		t.Errorf("targetClusterURL %q, want %q", sr.Status.TargetClusterURL, want)
	}
	space := sr.Status.NamespaceAccess[0].Name
	otherSpace := other.Status.NamespaceAccess[0].Name
	if space == otherSpace || !strings.HasPrefix(space, "alice-") {
		t.Fatalf("space namespaces %q and %q: want two of alice's", space, otherSpace)
	}

	cs := spaceClient(t, sr)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "deployed-by-test"}}
	if _, err := cs.CoreV1().ConfigMaps(space).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating in the space namespace: %v", err)
	}
	if list, err := cs.CoreV1().ConfigMaps(space).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) == 0 {
		t.Fatalf("listing in the space namespace: %d items, %v", len(list.Items), err)
	}
	for _, elsewhere := range []string{ns, otherSpace, "default"} {
		if _, err := cs.CoreV1().ConfigMaps(elsewhere).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("listing ConfigMaps in %s: %v, want forbidden", elsewhere, err)
		}
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sneaky"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("creating a namespace: %v, want forbidden", err)
	}

	deleteRequest(t, first)
	// The request goes only after its namespace has.
	var gone corev1.Namespace
	if err := cp.Client.Get(ctx, types.NamespacedName{Name: space}, &gone); !apierrors.IsNotFound(err) {
		t.Fatalf("space namespace %s after its request went: %v, want not found", space, err)
	}
	if _, err := cs.CoreV1().ConfigMaps(space).List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) && !apierrors.IsForbidden(err) {
		t.Errorf("the deleted space's kubeconfig: %v, want unauthorized or forbidden", err)
	}
	if err := cp.Client.Get(ctx, types.NamespacedName{Name: otherSpace}, &gone); err != nil {
		t.Errorf("the other request's namespace: %v", err)
	}
}

// deleteRequest deletes a SpaceRequest and waits until it is gone.
func deleteRequest(t *testing.T, key types.NamespacedName) {
	t.Helper()
	deleteAndWait(t, spaceRequestGVK, key)
}

// deleteAndWait deletes the object of gvk at key and waits until it is gone.
func deleteAndWait(t *testing.T, gvk schema.GroupVersionKind, key types.NamespacedName) {
	t.Helper()
	u := newObject(gvk)
	u.SetNamespace(key.Namespace)
	u.SetName(key.Name)
	if err := cp.Client.Delete(context.Background(), u); err != nil {
		t.Fatalf("deleting %s %s: %v", gvk.Kind, key, err)
	}
	waitGone(t, gvk.Kind+" "+key.String(), func() error {
		return cp.Client.Get(context.Background(), key, newObject(gvk))
	})
}

func TestFailingTierReportsNotReady(t *testing.T) {
	standIn.FailTier("broken-tier", "")
	key := createRequest(t, tenant(t, "bob-tenant"), "env", "broken-tier")
	sr := waitForRequest(t, key, "reports Ready=False", func(sr *spaceRequest) bool {
		c := sr.Status.ready()
		return c != nil && c.Status == "False" && c.Reason == reasonUnableToProvision
	})
	if msg := sr.Status.ready().Message; !strings.Contains(msg, "broken-tier") {
		t.Errorf("message %q does not name the tier", msg)
	}
	if len(sr.Status.NamespaceAccess) != 0 || sr.Status.TargetClusterURL != "" {
		t.Errorf("a failed request reports access: %+v", sr.Status)
	}
	namespaces, err := standIn.spaceNamespaces(context.Background(), sr)
	if err != nil || len(namespaces) != 0 {
		t.Errorf("a failed request has namespaces %v (%v)", namespaces, err)
	}
	deleteRequest(t, key)
}

// A stand-in keeps nothing in memory: one started after another finishes what the first left.
func TestRestartedStandInReleasesWhatTheLastOneMade(t *testing.T) {
	key := createRequest(t, tenant(t, "carol-tenant"), "env", "appstudio-env")
	sr := waitForRequest(t, key, "becomes ready", isReady)
	space := sr.Status.NamespaceAccess[0].Name
	if err := standIn.Stop(); err != nil {
		t.Fatal(err)
	}
	u := newUnstructured()
	u.SetNamespace(key.Namespace)
	u.SetName(key.Name)
	if err := cp.Client.Delete(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	if err := startStandIn(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "SpaceRequest "+key.String(), func() error {
		return cp.Client.Get(context.Background(), key, newUnstructured())
	})
	if err := cp.Client.Get(context.Background(), types.NamespacedName{Name: space}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Fatalf("space namespace %s: %v, want not found", space, err)
	}
}

func TestSpaceNamesFitANamespace(t *testing.T) {
	for _, tenantNS := range []string{"a-tenant", "team", strings.Repeat("x", 62) + "-tenant", strings.Repeat("y", 52) + "-z-tenant"} {
		sr := &spaceRequest{}
		sr.Namespace, sr.UID = tenantNS, "1a2b3c4d-0000-0000-0000-000000000000"
		space, ns := spaceNames(sr)
		if len(ns) > 63 || !strings.HasSuffix(space, "-1a2b3") || ns != space+"-env" || strings.Contains(ns, "--") {
			t.Errorf("tenant %s: space %q, namespace %q", tenantNS, space, ns)
		}
	}
}
