package spacestandin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// The claim's CRD is what Crossplane makes of the real XRD: the XRD's group and claim names,
// namespaced, the claim fields Crossplane adds, and a status subresource. The apiserver serves
// it, takes the real example claim, and fills Crossplane's defaults.
func TestClaimCRDIsWhatCrossplaneDerivesFromTheRealXRD(t *testing.T) {
	crd, err := ClaimCRD()
	if err != nil {
		t.Fatal(err)
	}
	if crd.Name != "namespaces.eaas.konflux-ci.dev" || crd.Spec.Group != "eaas.konflux-ci.dev" || crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
		t.Errorf("CRD %s, group %s, scope %s", crd.Name, crd.Spec.Group, crd.Spec.Scope)
	}
	if n := crd.Spec.Names; n.Kind != "Namespace" || n.Plural != "namespaces" || n.ListKind != "NamespaceList" || !slices.Contains(n.Categories, "claim") {
		t.Errorf("names %+v", n)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("versions %+v, want the XRD's one", crd.Spec.Versions)
	}
	v := crd.Spec.Versions[0]
	if v.Name != "v1alpha1" || !v.Served || !v.Storage || v.Subresources == nil || v.Subresources.Status == nil {
		t.Errorf("version %s served %v storage %v subresources %+v", v.Name, v.Served, v.Storage, v.Subresources)
	}
	props := v.Schema.OpenAPIV3Schema.Properties
	for _, f := range []string{"writeConnectionSecretToRef", "compositionRef", "compositionSelector", "compositeDeletePolicy", "compositionUpdatePolicy", "resourceRef"} {
		if _, ok := props["spec"].Properties[f]; !ok {
			t.Errorf("spec has no %s", f)
		}
	}
	for _, f := range []string{"conditions", "connectionDetails"} {
		if _, ok := props["status"].Properties[f]; !ok {
			t.Errorf("status has no %s", f)
		}
	}

	dir, err := realdata.CRDDir()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "crossplane_xnamespace_claim.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	example := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &example.Object); err != nil {
		t.Fatal(err)
	}
	example.SetNamespace(tenant(t, "example-tenant"))
	if err := cp.Client.Create(context.Background(), example); err != nil {
		t.Fatalf("the apiserver refuses the real example claim: %v", err)
	}
	if got, _, _ := unstructured.NestedString(example.Object, "spec", "compositeDeletePolicy"); got != "Background" {
		t.Errorf("compositeDeletePolicy defaults to %q, want Crossplane's Background", got)
	}
	c := waitForClaim(t, keyOf(example), "becomes ready", claimReady)
	if c.secretName() != "my-namespace-1.0-secret" || !strings.HasPrefix(claimNamespaceName(c), "my-namespace-1-0-") {
		t.Errorf("claim %s: Secret %q, namespace %q", c.Name, c.secretName(), claimNamespaceName(c))
	}
	deleteClaim(t, keyOf(example))
}

func TestClaimXRDsWithoutAClaimAreRefused(t *testing.T) {
	for name, xrd := range map[string]string{
		"no claim names":  "kind: CompositeResourceDefinition\nmetadata: {name: x}\nspec: {group: g.dev, names: {kind: X, plural: xs}, versions: [{name: v1, served: true, referenceable: true, schema: {openAPIV3Schema: {type: object}}}]}",
		"claim is the XR": "kind: CompositeResourceDefinition\nmetadata: {name: x}\nspec: {group: g.dev, names: {kind: X, plural: xs}, claimNames: {kind: X, plural: xs}, versions: [{name: v1, served: true, referenceable: true, schema: {openAPIV3Schema: {type: object}}}]}",
		"no storage":      "kind: CompositeResourceDefinition\nmetadata: {name: x}\nspec: {group: g.dev, names: {kind: X, plural: xs}, claimNames: {kind: C, plural: cs}, versions: [{name: v1, served: true, schema: {openAPIV3Schema: {type: object}}}]}",
		"not an XRD":      "kind: CustomResourceDefinition\nmetadata: {name: x}",
	} {
		if _, err := claimCRDFromXRD([]byte(xrd)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// keyOf is the key of an object.
func keyOf(u *unstructured.Unstructured) types.NamespacedName {
	return types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}
}

func createClaim(t *testing.T, namespace, name, secret string) types.NamespacedName {
	t.Helper()
	u := newClaimUnstructured()
	u.SetNamespace(namespace)
	u.SetName(name)
	u.Object["spec"] = map[string]any{"writeConnectionSecretToRef": map[string]any{"name": secret}}
	if err := cp.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("creating Namespace claim %s/%s: %v", namespace, name, err)
	}
	return keyOf(u)
}

// waitForClaim polls the claim until cond holds and returns it.
func waitForClaim(t *testing.T, key types.NamespacedName, what string, cond func(*claim) bool) *claim {
	t.Helper()
	return waitFor(t, claimGVK, key, what, claimFromUnstructured, cond)
}

func claimCondition(c *claim, typ string) *condition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == typ {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}

func claimReady(c *claim) bool {
	r := claimCondition(c, conditionReady)
	return r != nil && r.Status == "True"
}

func deleteClaim(t *testing.T, key types.NamespacedName) {
	t.Helper()
	deleteAndWait(t, claimGVK, key)
}

// A claim gets what the eaas composition makes: a namespace of its own, a Secret with the
// composition's keys whose kubeconfig acts there and nowhere else, and Crossplane's Ready and
// Synced conditions. Deleting the claim deletes the namespace.
func TestNamespaceClaimGivesAdminRightsInItsNamespaceOnly(t *testing.T) {
	ctx := context.Background()
	ns := tenant(t, "dave-tenant")
	key := createClaim(t, ns, "integration-run", "integration-run-secret")
	c := waitForClaim(t, key, "becomes ready", claimReady)
	if r := claimCondition(c, conditionReady); r.Reason != reasonAvailable {
		t.Errorf("Ready reason %q, want %q", r.Reason, reasonAvailable)
	}
	if s := claimCondition(c, conditionSynced); s == nil || s.Status != "True" || s.Reason != reasonReconcileSuccess {
		t.Errorf("Synced %+v, want True (%s)", s, reasonReconcileSuccess)
	}
	if c.Status.ConnectionDetails == nil || c.Status.ConnectionDetails.LastPublishedTime == nil {
		t.Errorf("no connectionDetails.lastPublishedTime: %+v", c.Status)
	}

	var secret corev1.Secret
	if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "integration-run-secret"}, &secret); err != nil {
		t.Fatalf("the connection Secret: %v", err)
	}
	if !metav1.IsControlledBy(&secret, c) || secret.Type != connectionSecretType {
		t.Errorf("connection Secret of type %q owned by %+v", secret.Type, secret.OwnerReferences)
	}
	for _, k := range []string{keyKubeconfig, keyNamespace, keyServiceAccount, keyToken, keyAPIServer} {
		if len(secret.Data[k]) == 0 {
			t.Errorf("the connection Secret has no %s", k)
		}
	}
	space := string(secret.Data[keyNamespace])
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data[keyKubeconfig])
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	if _, err := cs.CoreV1().ConfigMaps(space).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing in the claim's namespace %s: %v", space, err)
	}
	for _, elsewhere := range []string{ns, "default"} {
		if _, err := cs.CoreV1().ConfigMaps(elsewhere).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("listing ConfigMaps in %s: %v, want forbidden", elsewhere, err)
		}
	}

	deleteClaim(t, key)
	if err := cp.Client.Get(ctx, types.NamespacedName{Name: space}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the claim's namespace %s after the claim went: %v, want not found", space, err)
	}
}

// A stalled claim stays Ready=False (Waiting) and says why in Synced, as Crossplane reports a
// composition that fails; it gets no namespace.
func TestStalledClaimWaitsAndSaysWhy(t *testing.T) {
	ns := tenant(t, "erin-tenant")
	standIn.StallClaims(ns, "cannot compose resources: function-go-templating failed")
	key := createClaim(t, ns, "run", "run-secret")
	c := waitForClaim(t, key, "reports Synced=False", func(c *claim) bool {
		s := claimCondition(c, conditionSynced)
		return s != nil && s.Status == "False"
	})
	if s := claimCondition(c, conditionSynced); s.Reason != reasonReconcileError || !strings.Contains(s.Message, "function-go-templating failed") {
		t.Errorf("Synced %+v", s)
	}
	if r := claimCondition(c, conditionReady); r == nil || r.Status != "False" || r.Reason != reasonWaiting {
		t.Errorf("Ready %+v, want False (%s)", r, reasonWaiting)
	}
	if namespaces, err := standIn.claimNamespaces(context.Background(), c); err != nil || len(namespaces) != 0 {
		t.Errorf("a stalled claim has namespaces %v (%v)", namespaces, err)
	}
	deleteClaim(t, key)
}

func TestClaimNamespaceNamesFitANamespace(t *testing.T) {
	for _, name := range []string{"run", "my-namespace-1.0", strings.Repeat("x", 70), strings.Repeat("y", 57) + "-z"} {
		c := &claim{}
		c.Name, c.UID = name, "1a2b3c4d-0000-0000-0000-000000000000"
		got := claimNamespaceName(c)
		if len(got) > 63 || !strings.HasSuffix(got, "-1a2b3") || strings.Contains(got, ".") || strings.Contains(got, "--") {
			t.Errorf("claim %s: namespace %q", name, got)
		}
	}
}
