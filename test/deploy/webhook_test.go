package deploy

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/berth-ci/berth/internal/webhook"
)

// config/certmanager: cert-manager's objects for the webhook's certificate. Its kinds exist only
// where cert-manager runs, so the apiserver of TestDefaultInstallsOnARealAPIServer cannot take
// them; what can break is how they name the rest, which this file checks.
const certManagerDir = "config/certmanager"

// The webhook's parts name each other: the configuration the path the controller serves and
// the Service in front of it, the Service a port of the controller that its --webhook-port
// opens, the controller a --webhook-cert-dir where a Secret is mounted, and config/certmanager
// a Certificate for that Service's DNS name, kept in that Secret, from an Issuer it has, whose
// CA the configuration's inject-ca-from annotation names.
func TestWebhookPartsFitTogether(t *testing.T) {
	objs := render(t, defaultDir)
	configs := ofKind[admissionregistrationv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration")
	if len(configs) != 1 || len(configs[0].Webhooks) != 1 {
		t.Fatalf("config/default has %d MutatingWebhookConfigurations, want berth's one with one webhook", len(configs))
	}
	cfg, hook := configs[0], configs[0].Webhooks[0]
	if cfg.Name != webhook.ConfigurationName {
		t.Errorf("the webhook configuration is %s; the controller's error messages name %s", cfg.Name, webhook.ConfigurationName)
	}
	if p := hook.FailurePolicy; p == nil || *p != admissionregistrationv1.Ignore {
		t.Errorf("failurePolicy %v: the webhook must never block a TaskRun", p)
	}
	svcRef := hook.ClientConfig.Service
	if svcRef == nil || svcRef.Path == nil || *svcRef.Path != webhook.AffinityPath {
		t.Fatalf("the webhook calls %+v, not the path the controller serves (%s)", svcRef, webhook.AffinityPath)
	}

	var svc *corev1.Service
	for _, s := range ofKind[corev1.Service](t, objs, "Service") {
		if s.Namespace == svcRef.Namespace && s.Name == svcRef.Name {
			svc = &s
		}
	}
	if svc == nil {
		t.Fatalf("the webhook calls Service %s/%s, which config/default does not have", svcRef.Namespace, svcRef.Name)
	}
	port := int32(443)
	if svcRef.Port != nil {
		port = *svcRef.Port
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port })
	if i < 0 {
		t.Fatalf("Service %s has no port %d, which the webhook calls", svc.Name, port)
	}
	target := svc.Spec.Ports[i].TargetPort

	deployments := ofKind[appsv1.Deployment](t, objs, "Deployment")
	if len(deployments) != 1 || len(deployments[0].Spec.Template.Spec.Containers) != 1 {
		t.Fatal("config/default has no Deployment with the controller as its one container")
	}
	pod := deployments[0].Spec.Template.Spec
	controller := pod.Containers[0]
	j := slices.IndexFunc(controller.Ports, func(p corev1.ContainerPort) bool { return p.Name == target.StrVal || p.ContainerPort == target.IntVal })
	if j < 0 {
		t.Fatalf("Service %s targets port %s, which the controller does not have", svc.Name, target.String())
	}
	if got, want := flag(controller.Args, "webhook-port"), controller.Ports[j].ContainerPort; got != strconv.Itoa(int(want)) {
		t.Errorf("the controller serves the webhook on --webhook-port=%s, its Service sends to %d", got, want)
	}
	certDir := flag(controller.Args, "webhook-cert-dir")
	m := slices.IndexFunc(controller.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == certDir })
	if m < 0 {
		t.Fatalf("--webhook-cert-dir=%s is no mount of the controller", certDir)
	}
	v := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == controller.VolumeMounts[m].Name })
	if v < 0 || pod.Volumes[v].Secret == nil {
		t.Fatalf("%s is not a Secret's volume", certDir)
	}
	tlsSecret := pod.Volumes[v].Secret.SecretName

	cm := render(t, certManagerDir)
	// The webhook's Certificate is the one the configuration takes its CA from (the OTP key
	// server's are beside it).
	from := cfg.Annotations["cert-manager.io/inject-ca-from"]
	c := slices.IndexFunc(cm, func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "Certificate" && o.GetNamespace()+"/"+o.GetName() == from
	})
	if c < 0 {
		t.Fatalf("the webhook configuration takes its CA from %q, which is no Certificate of %s", from, certManagerDir)
	}
	cert := cm[c]
	if got, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); got != tlsSecret {
		t.Errorf("Certificate %s is kept in Secret %q; the controller mounts %q", cert.GetName(), got, tlsSecret)
	}
	if cert.GetNamespace() != deployments[0].Namespace {
		t.Errorf("Certificate %s is in namespace %s, the controller (and the Secret it mounts) in %s", cert.GetName(), cert.GetNamespace(), deployments[0].Namespace)
	}
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	if want := svc.Name + "." + svc.Namespace + ".svc"; !slices.Contains(dnsNames, want) {
		t.Errorf("Certificate %s is for %v; the apiserver calls %s", cert.GetName(), dnsNames, want)
	}
	issuerKind, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "kind")
	issuerName, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
	if !slices.ContainsFunc(cm, func(o *unstructured.Unstructured) bool {
		return o.GetKind() == issuerKind && o.GetName() == issuerName && o.GetNamespace() == cert.GetNamespace()
	}) {
		t.Errorf("Certificate %s is issued by %s %s, which %s does not have", cert.GetName(), issuerKind, issuerName, certManagerDir)
	}
}

// flag is the value of --name=value in args ("" if absent).
func flag(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}
