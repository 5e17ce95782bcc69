package deploy

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The guarded metrics' parts name each other: the controller serves them over HTTPS
// (--metrics-secure not turned off) with the certificate of a Secret mounted at
// --metrics-cert-dir, which config/certmanager's Certificate fills for the metrics Service's DNS
// name; the ServiceMonitor scrapes https with Prometheus's token and trusts that Secret's CA for
// that name; the controller may ask the apiserver about tokens, and the binding in
// config/prometheus gives Prometheus the ClusterRole of config/default that may get /metrics.
func TestMetricsPartsFitTogether(t *testing.T) {
	objs := render(t, defaultDir)
	deployments := ofKind[appsv1.Deployment](t, objs, "Deployment")
	if len(deployments) != 1 || len(deployments[0].Spec.Template.Spec.Containers) != 1 {
		t.Fatal("config/default has no Deployment with the controller as its one container")
	}
	pod := deployments[0].Spec.Template.Spec
	controller := pod.Containers[0]
	if v := flag(controller.Args, "metrics-secure"); v != "" && v != "true" {
		t.Errorf("the controller runs with --metrics-secure=%s: anyone reaching the port reads the metrics", v)
	}
	certDir := flag(controller.Args, "metrics-cert-dir")
	m := slices.IndexFunc(controller.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == certDir })
	if certDir == "" || m < 0 {
		t.Fatalf("--metrics-cert-dir=%q is no mount of the controller", certDir)
	}
	v := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == controller.VolumeMounts[m].Name })
	if v < 0 || pod.Volumes[v].Secret == nil {
		t.Fatalf("%s is not a Secret's volume", certDir)
	}
	tlsSecret := pod.Volumes[v].Secret.SecretName

	prom := render(t, prometheusDir)
	svcName := scrapeJob(t, prom)
	dnsName := svcName + "." + deployments[0].Namespace + ".svc"

	cm := render(t, certManagerDir)
	c := slices.IndexFunc(cm, func(o *unstructured.Unstructured) bool {
		name, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
		return o.GetKind() == "Certificate" && name == tlsSecret && o.GetNamespace() == deployments[0].Namespace
	})
	if c < 0 {
		t.Fatalf("no Certificate of %s fills Secret %s/%s, which the controller mounts at --metrics-cert-dir", certManagerDir, deployments[0].Namespace, tlsSecret)
	}
	if dnsNames, _, _ := unstructured.NestedStringSlice(cm[c].Object, "spec", "dnsNames"); !slices.Contains(dnsNames, dnsName) {
		t.Errorf("Certificate %s is for %v; Prometheus scrapes %s", cm[c].GetName(), dnsNames, dnsName)
	}

	for _, o := range prom {
		if o.GetKind() != "ServiceMonitor" {
			continue
		}
		endpoints, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
		for _, e := range endpoints {
			ep := e.(map[string]any)
			if scheme, _, _ := unstructured.NestedString(ep, "scheme"); scheme != "https" {
				t.Errorf("ServiceMonitor %s scrapes with scheme %q, want https", o.GetName(), scheme)
			}
			if token, _, _ := unstructured.NestedString(ep, "bearerTokenFile"); token == "" {
				t.Errorf("ServiceMonitor %s sends no bearer token: every scrape would get 401", o.GetName())
			}
			if skip, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify"); skip {
				t.Errorf("ServiceMonitor %s trusts any certificate: its token would go to whoever answers", o.GetName())
			}
			if name, _, _ := unstructured.NestedString(ep, "tlsConfig", "serverName"); name != dnsName {
				t.Errorf("ServiceMonitor %s checks the certificate for %q, want %s", o.GetName(), name, dnsName)
			}
			if name, _, _ := unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "name"); name != tlsSecret {
				t.Errorf("ServiceMonitor %s trusts the CA of Secret %q, want %s (the metrics' certificate)", o.GetName(), name, tlsSecret)
			}
			if key, _, _ := unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "key"); key != "ca.crt" {
				t.Errorf("ServiceMonitor %s takes the CA from key %q, want ca.crt", o.GetName(), key)
			}
		}
	}

	controllerSA := pod.ServiceAccountName
	roles := map[string]rbacv1.ClusterRole{}
	for _, r := range ofKind[rbacv1.ClusterRole](t, objs, "ClusterRole") {
		roles[r.Name] = r
	}
	grants := func(role string, ok func(rbacv1.PolicyRule) bool) bool {
		return slices.ContainsFunc(roles[role].Rules, ok)
	}
	for _, want := range []struct{ group, resource string }{
		{"authentication.k8s.io", "tokenreviews"},
		{"authorization.k8s.io", "subjectaccessreviews"},
	} {
		rule := func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, want.group) && slices.Contains(r.Resources, want.resource) && slices.Contains(r.Verbs, "create")
		}
		if !slices.ContainsFunc(ofKind[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding"), func(b rbacv1.ClusterRoleBinding) bool {
			return grants(b.RoleRef.Name, rule) && slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == rbacv1.ServiceAccountKind && s.Name == controllerSA && s.Namespace == deployments[0].Namespace
			})
		}) {
			t.Errorf("no ClusterRoleBinding of config/default lets %s create %s: the metrics filter would answer every scrape 500", controllerSA, want.resource)
		}
	}

	readsMetrics := func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.NonResourceURLs, "/metrics") && slices.Contains(r.Verbs, "get")
	}
	bindings := ofKind[rbacv1.ClusterRoleBinding](t, prom, "ClusterRoleBinding")
	if len(bindings) != 1 {
		t.Fatalf("%s has %d ClusterRoleBindings, want the one for Prometheus", prometheusDir, len(bindings))
	}
	b := bindings[0]
	if !grants(b.RoleRef.Name, readsMetrics) {
		t.Errorf("ClusterRoleBinding %s binds ClusterRole %s, which config/default does not have with get on /metrics", b.Name, b.RoleRef.Name)
	}
	for _, s := range b.Subjects {
		// kustomize's namespace field rewrites a binding's ServiceAccount subjects to berth's
		// namespace unless told otherwise; Prometheus does not run there.
		if s.Kind != rbacv1.ServiceAccountKind || s.Namespace == deployments[0].Namespace {
			t.Errorf("ClusterRoleBinding %s binds %s %s/%s, not a Prometheus's ServiceAccount", b.Name, s.Kind, s.Namespace, s.Name)
		}
	}
}
