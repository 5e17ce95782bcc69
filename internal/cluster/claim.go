package cluster

import (
	"cmp"
	"context"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys the eaas composition writes to a claim's connection Secret beside kubeconfig.
const (
	namespaceKey = "namespace"
	apiServerKey = "apiserver"
)

// claimSecretName is the connection Secret of a claim, named as Konflux's eaas-provision-space
// names it.
func claimSecretName(claim string) string { return claim + "-secret" }

// newClaim is the eaas Namespace claim Konflux's eaas-provision-space creates: named as asked
// (the Task gives its TaskRun's name), owned by the run, its connection details written to the
// Secret <name>-secret.
func newClaim(req SpaceRequest) *unstructured.Unstructured {
	u := newObject(claimGVK, req.Namespace, req.Name)
	u.SetOwnerReferences(req.Owner.references())
	u.Object["spec"] = map[string]any{
		"writeConnectionSecretToRef": map[string]any{"name": claimSecretName(req.Name)},
	}
	return u
}

func provisionClaim(ctx context.Context, tenant client.Client, req SpaceRequest, p Polling, progress io.Writer) (SpaceAccess, error) {
	if req.TierName != "" {
		fmt.Fprintf(progress, "the tier %s is not used: a Namespace claim has none\n", req.TierName)
	}
	obj := newClaim(req)
	secret := claimSecretName(req.Name)
	detail := fmt.Sprintf("connection Secret %s, owned by %s %s", secret, req.Owner.Kind, req.Owner.Name)
	err := createOrReuse(ctx, tenant, obj, detail, progress, func(existing *unstructured.Unstructured) (string, error) {
		c, err := decode[claimView](existing)
		if err != nil {
			return "", err
		}
		if got := c.Spec.WriteConnectionSecretToRef.name(); got != secret {
			return fmt.Sprintf("connection Secret %q, not %q", got, secret), nil
		}
		return "", nil
	})
	if err != nil {
		return SpaceAccess{}, err
	}
	fmt.Fprintf(progress, "waiting for %s to be Ready: Crossplane's eaas composition makes the namespace and writes its kubeconfig to Secret %s\n", describe(obj), secret)
	return awaitSpace(ctx, tenant, obj, req.Owner, p, progress, func(ctx context.Context, u *unstructured.Unstructured) (spaceLook, error) {
		return lookAtClaim(ctx, tenant, u, secret)
	})
}

// lookAtClaim says where a claim stands: its Ready and Synced conditions (Crossplane's), and
// once it is Ready, whether its Secret holds a kubeconfig yet. Crossplane retries a claim that
// fails (Synced=False), so only one being deleted is refused.
func lookAtClaim(ctx context.Context, tenant client.Reader, u *unstructured.Unstructured, secretName string) (spaceLook, error) {
	c, err := decode[claimView](u)
	if err != nil {
		return spaceLook{}, err
	}
	ready := findCondition(c.Status.Conditions, "Ready")
	look := spaceLook{state: "Ready=" + ready.describe()}
	if synced := findCondition(c.Status.Conditions, "Synced"); synced.status != "Unknown" {
		look.state += "; Synced=" + synced.describe()
	}
	if c.DeletionTimestamp != nil {
		look.refused = "it is being deleted"
		return look, nil
	}
	if ready.status != "True" {
		return look, nil
	}
	key := client.ObjectKey{Namespace: c.Namespace, Name: secretName}
	var s corev1.Secret
	switch err := tenant.Get(ctx, key, &s); {
	case apierrors.IsNotFound(err):
		look.state += fmt.Sprintf("; Secret %s is not written yet", secretName)
		return look, nil
	case err != nil:
		return look, fmt.Errorf("reading Secret %s, which the claim writes: %w", key, err)
	case len(s.Data[kubeconfigKey]) == 0:
		look.state += fmt.Sprintf("; Secret %s has no key %s yet", secretName, kubeconfigKey)
		return look, nil
	}
	namespace, server, err := spaceTarget(s.Data)
	if err != nil {
		return look, fmt.Errorf("Secret %s: %w", key, err)
	}
	look.access = &SpaceAccess{Namespace: namespace, TenantNamespace: c.Namespace, SecretName: secretName, ClusterURL: server}
	return look, nil
}

// spaceTarget is the namespace and apiserver a claim's connection Secret is for: its keys
// namespace and apiserver (the eaas composition writes them), else its kubeconfig's context.
func spaceTarget(data map[string][]byte) (namespace, server string, err error) {
	namespace, server = string(data[namespaceKey]), string(data[apiServerKey])
	if namespace != "" && server != "" {
		return namespace, server, nil
	}
	cfg, err := clientcmd.Load(data[kubeconfigKey])
	if err != nil {
		// clientcmd's parse errors name a line, never the content.
		return "", "", fmt.Errorf("its kubeconfig does not parse: %w", err)
	}
	if ctx := cfg.Contexts[cfg.CurrentContext]; ctx != nil {
		namespace = cmp.Or(namespace, ctx.Namespace)
		if cluster := cfg.Clusters[ctx.Cluster]; cluster != nil {
			server = cmp.Or(server, cluster.Server)
		}
	}
	return namespace, server, nil
}
