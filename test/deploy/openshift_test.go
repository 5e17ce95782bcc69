package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
	"github.com/berth-ci/berth/internal/localaffinity"
	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// The components an OpenShift overlay adds to config/default: one without the OTP option, one
// with it (config/otp included).
const (
	openshiftDir    = "config/openshift"
	openshiftOTPDir = "config/openshift-otp"
)

// What OpenShift's service CA operator (service-ca) acts on.
const (
	servingCertAnnotation = "service.beta.openshift.io/serving-cert-secret-name"
	injectCABundle        = "service.beta.openshift.io/inject-cabundle"
	serviceCAKey          = "service-ca.crt" // the key service-ca writes its CA under in a ConfigMap
)

// Both OpenShift overlays carry nothing of cert-manager, and service-ca's annotations are where
// they must be: on every Service whose TLS the controller serves, naming the Secret it mounts
// for it; on every webhook configuration; on the ConfigMap the OTP option's CA is read from.
// The pod asks for no fixed user or group, which restricted-v2 would refuse.
func TestOpenShiftComponentsAskServiceCAForEveryCertificate(t *testing.T) {
	for _, component := range []string{openshiftDir, openshiftOTPDir} {
		t.Run(filepath.Base(component), func(t *testing.T) {
			checkOpenShiftShape(t, openshiftOverlay(t, component), component == openshiftOTPDir)
		})
	}
}

// The OpenShift install on a real apiserver, with the test playing service-ca's part: both
// overlays apply strictly and stably; a pod of the controller's template is admitted in a
// namespace enforcing PodSecurity "restricted", and one asking for privilege escalation or a
// capability is refused there; once the Secrets, the caBundle and the CA ConfigMap are filled
// as service-ca fills them, bin/berth, run as the Deployment says (runAsDeployed: its args, a
// token of its ServiceAccount, those Secrets and ConfigMap as the kubelet mounts them), is
// called by the apiserver through the webhook configuration's Service reference and pins a
// local-platform TaskRun, and serves its metrics and its key server with certificates that the
// service CA, as berth hands it to tasks, verifies.
//
// The apiserver reaches a Service at its cluster IP. In a network namespace of the test's own,
// the test gives loopback each Service's cluster IP and forwards its ports to the controller's,
// as kube-proxy does in a cluster (clusterNetwork); so the run needs root.
func TestOpenShiftInstallWorksWithServiceCA(t *testing.T) {
	berthBinary(t) // skips here, not in the run below, which must pass
	if parent := inOwnNetwork(t); parent {
		return
	}
	cp := startControlPlane(t, controlplane.WithAdvertiseAddress("127.0.0.1"))
	ctx := context.Background()

	// Without the OTP option, then with it over the same install, as an operator turning it on.
	applyAll(t, cp, openshiftOverlay(t, openshiftDir))
	objs := openshiftOverlay(t, openshiftOTPDir)
	applyAll(t, cp, objs)
	deployments := ofKind[appsv1.Deployment](t, objs, "Deployment")
	if len(deployments) != 1 {
		t.Fatalf("%d Deployments, want the controller's", len(deployments))
	}
	ns := deployments[0].Namespace
	var d appsv1.Deployment
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: deployments[0].Name}, &d); err != nil {
		t.Fatal(err)
	}

	t.Run("PodSecurity restricted admits the controller's pod and refuses worse", func(t *testing.T) {
		checkPodSecurityRestricted(t, cp, d)
	})

	ca, err := tlscerts.NewCA("openshift-service-serving-signer")
	if err != nil {
		t.Fatal(err)
	}
	playServiceCA(t, cp, ns, ca)
	// Every Secret and ConfigMap the controller mounts is now there: service-ca's annotations
	// name exactly those.
	for _, v := range d.Spec.Template.Spec.Volumes {
		switch {
		case v.Secret != nil:
			if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.Secret.SecretName}, &corev1.Secret{}); err != nil {
				t.Errorf("the controller mounts Secret %s, which service-ca was not asked to write: %v", v.Secret.SecretName, err)
			}
		case v.ConfigMap != nil:
			var cm corev1.ConfigMap
			if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.ConfigMap.Name}, &cm); err != nil {
				t.Errorf("the controller mounts ConfigMap %s: %v", v.ConfigMap.Name, err)
				continue
			}
			for _, item := range v.ConfigMap.Items {
				if _, ok := cm.Data[item.Key]; !ok {
					t.Errorf("the controller mounts key %s of ConfigMap %s, which service-ca does not write", item.Key, cm.Name)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// An upgrade applies the install again: what service-ca wrote stays.
	applyAll(t, cp, objs)
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	for _, c := range ofKind[admissionregistrationv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration") {
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: c.Name}, &cfg); err != nil {
			t.Fatal(err)
		}
		for _, w := range cfg.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, ca.PEM) {
				t.Errorf("applying the install again dropped the caBundle service-ca wrote into webhook %s", w.Name)
			}
		}
	}

	// A host config with local platforms, for the webhook to pin to.
	hostConfig := readRepoObject(t, "config/samples/host-config-local.yaml")
	hostConfig.SetNamespace(ns)
	applyAll(t, cp, []*unstructured.Unstructured{hostConfig})

	// The manifest's ports and the Services' cluster IPs, so that the apiserver calls the
	// webhook through the configuration's Service reference, trusting the injected caBundle.
	run := runAsDeployed(t, cp, objs, deployOptions{routing: clusterNetwork})

	t.Run("the apiserver calls the webhook with service-ca's caBundle", func(t *testing.T) {
		if err := cp.EnsureNamespace(ctx, "builds"); err != nil {
			t.Fatal(err)
		}
		const platform = "linux/amd64"
		node, _ := localaffinity.NodeOf(platform)
		// failurePolicy Ignore admits the TaskRun unpinned when the call fails (the apiserver
		// may not know the Service yet): wait for a pinned one, and fail if none comes.
		stacktest.Eventually(t, "a TaskRun of local platform "+platform+" is pinned to "+node.OS+"/"+node.Arch+" nodes", func() (bool, error) {
			run.checkRunning(t)
			tr := &pipelinev1.TaskRun{
				ObjectMeta: metav1.ObjectMeta{Namespace: "builds", Name: "build-amd64"},
				Spec: pipelinev1.TaskRunSpec{
					TaskRef: &pipelinev1.TaskRef{Name: "buildah"},
					Params:  pipelinev1.Params{{Name: "PLATFORM", Value: *pipelinev1.NewStructuredValues(platform)}},
				},
			}
			if err := cp.Client.Create(ctx, tr, client.DryRunAll); err != nil {
				t.Fatalf("creating a TaskRun (dry run): %v", err)
			}
			if !localaffinity.Enforced(localaffinity.Of(tr), node) {
				return false, fmt.Errorf("admitted unpinned: %+v", tr.Spec.PodTemplate)
			}
			return true, nil
		})
	})

	t.Run("Prometheus checks the metrics' certificate against the CA service-ca writes", func(t *testing.T) {
		// The ServiceMonitor of an overlay with config/prometheus too: its endpoint's CA, read
		// where the Prometheus Operator reads it, and its server name.
		var monitor *unstructured.Unstructured
		for _, o := range renderOverlay(t, []string{defaultDir, prometheusDir}, []string{openshiftDir}) {
			if o.GetKind() == "ServiceMonitor" {
				monitor = o
			}
		}
		if monitor == nil {
			t.Fatal("config/prometheus with config/openshift has no ServiceMonitor")
		}
		endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
		if len(endpoints) != 1 {
			t.Fatalf("the ServiceMonitor has %d endpoints, want one", len(endpoints))
		}
		e := endpoints[0].(map[string]any)
		serverName, _, _ := unstructured.NestedString(e, "tlsConfig", "serverName")
		var caPEM []byte
		if name, ok, _ := unstructured.NestedString(e, "tlsConfig", "ca", "configMap", "name"); ok {
			key, _, _ := unstructured.NestedString(e, "tlsConfig", "ca", "configMap", "key")
			var cm corev1.ConfigMap
			if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: monitor.GetNamespace(), Name: name}, &cm); err != nil {
				t.Fatalf("the ServiceMonitor's CA, ConfigMap %s: %v", name, err)
			}
			caPEM = []byte(cm.Data[key])
		} else if name, ok, _ := unstructured.NestedString(e, "tlsConfig", "ca", "secret", "name"); ok {
			key, _, _ := unstructured.NestedString(e, "tlsConfig", "ca", "secret", "key")
			var s corev1.Secret
			if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: monitor.GetNamespace(), Name: name}, &s); err != nil {
				t.Fatalf("the ServiceMonitor's CA, Secret %s: %v", name, err)
			}
			caPEM = s.Data[key]
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			t.Fatalf("the ServiceMonitor checks the metrics' certificate against %v, where service-ca wrote no CA", e["tlsConfig"])
		}
		svc := openshiftService(t, objs, "berth-controller-metrics")
		host := svc.Name + "." + svc.Namespace + ".svc"
		raw, err := run.svc.dial(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(svc.Spec.Ports[0].Port))))
		if err != nil {
			t.Fatal(err)
		}
		conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: serverName})
		defer conn.Close()
		if err := conn.HandshakeContext(ctx); err != nil {
			t.Fatalf("connecting to %s as Prometheus does, with the ServiceMonitor's CA and server name %s: %v", host, serverName, err)
		}
	})

	t.Run("tasks reach the key server trusting the CA berth hands them", func(t *testing.T) {
		c := d.Spec.Template.Spec.Containers[0]
		serverURL, caFile := flag(c.Args, "otp-server-url"), flag(c.Args, "otp-ca-file")
		// What berth writes into task secrets as otp-ca, read where the controller reads it.
		caPEM, err := keyserver.ReadCA(run.path(caFile))
		if err != nil {
			t.Fatalf("--otp-ca-file=%s: %v", caFile, err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		u, err := url.Parse(serverURL)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: run.svc.dial, TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := hc.Get((&url.URL{Scheme: "https", Host: u.Host, Path: "/healthz"}).String())
		if err != nil {
			t.Fatalf("GET %s/healthz, trusting otp-ca: %v", u.Host, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s/healthz: %s", u.Host, resp.Status)
		}
	})
}

// openshiftOverlay renders an operator's overlay: config/default with the component.
func openshiftOverlay(t *testing.T, component string) []*unstructured.Unstructured {
	t.Helper()
	return renderOverlay(t, []string{defaultDir}, []string{component})
}

// checkOpenShiftShape checks what TestOpenShiftComponentsAskServiceCAForEveryCertificate says.
func checkOpenShiftShape(t *testing.T, objs []*unstructured.Unstructured, withOTP bool) {
	t.Helper()
	for _, o := range objs {
		if strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") {
			t.Errorf("%s is cert-manager's", key(o))
		}
		for a := range o.GetAnnotations() {
			if strings.HasPrefix(a, "cert-manager.io/") {
				t.Errorf("%s keeps cert-manager's annotation %s", key(o), a)
			}
		}
	}
	deployments := strictly[appsv1.Deployment](t, objs, "Deployment")
	if len(deployments) != 1 || len(deployments[0].Spec.Template.Spec.Containers) != 1 {
		t.Fatal("no Deployment with the controller as its one container")
	}
	d := deployments[0]
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	services := strictly[corev1.Service](t, objs, "Service")

	// mounted is the volume at a directory the controller is given.
	mounted := func(dir string) *corev1.Volume {
		for _, m := range c.VolumeMounts {
			if m.MountPath == dir {
				if i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }); i >= 0 {
					return &pod.Volumes[i]
				}
			}
		}
		t.Errorf("%s is no mount of the controller", dir)
		return nil
	}
	// Each TLS server of the controller: the flag of its address, the flag of its certificate.
	servers := []struct{ bind, certDir string }{
		{"webhook-port", "webhook-cert-dir"},
		{"metrics-bind-address", "metrics-cert-dir"},
	}
	if withOTP {
		servers = append(servers, struct{ bind, certDir string }{"otp-bind-address", "otp-cert-dir"})
	}
	annotated := map[string]bool{}
	for _, s := range servers {
		bind, dir := flag(c.Args, s.bind), flag(c.Args, s.certDir)
		if bind == "" || dir == "" {
			t.Errorf("the controller is not given --%s and --%s: %v", s.bind, s.certDir, c.Args)
			continue
		}
		if _, p, err := net.SplitHostPort(bind); err == nil {
			bind = p
		}
		port, err := strconv.Atoi(bind)
		if err != nil {
			t.Fatalf("--%s=%s: %v", s.bind, bind, err)
		}
		v := mounted(dir)
		if v == nil || v.Secret == nil {
			t.Errorf("--%s=%s is not a Secret's volume", s.certDir, dir)
			continue
		}
		found := false
		for _, svc := range services {
			for _, sp := range svc.Spec.Ports {
				if !targetsPort(c, sp.TargetPort, int32(port)) {
					continue
				}
				found = true
				annotated[svc.Name] = true
				if got := svc.Annotations[servingCertAnnotation]; got != v.Secret.SecretName {
					t.Errorf("Service %s (port %s, --%s) asks service-ca for Secret %q; the controller mounts %q at --%s",
						svc.Name, sp.Name, s.bind, got, v.Secret.SecretName, s.certDir)
				}
			}
		}
		if !found {
			t.Errorf("no Service leads to the controller's port %d (--%s)", port, s.bind)
		}
	}
	for _, svc := range services {
		if a, ok := svc.Annotations[servingCertAnnotation]; ok && !annotated[svc.Name] {
			t.Errorf("Service %s asks service-ca for Secret %s, which no server of the controller uses", svc.Name, a)
		}
	}

	configs := strictly[admissionregistrationv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration")
	if len(configs) == 0 {
		t.Error("no webhook configuration")
	}
	for _, cfg := range configs {
		if cfg.Annotations[injectCABundle] != "true" {
			t.Errorf("webhook configuration %s is not annotated %s: \"true\"", cfg.Name, injectCABundle)
		}
		for _, w := range cfg.Webhooks {
			if w.ClientConfig.Service == nil {
				t.Errorf("webhook %s calls no Service, so service-ca's certificate cannot be for it", w.Name)
			}
		}
	}
	if len(strictly[admissionregistrationv1.ValidatingWebhookConfiguration](t, objs, "ValidatingWebhookConfiguration")) > 0 {
		t.Error("a ValidatingWebhookConfiguration: this test checks only the mutating ones' annotations")
	}

	// The OTP option hands tasks the CA of the key server's certificate: service-ca's, from the
	// ConfigMap it fills, since its Secrets hold no ca.crt.
	if withOTP {
		if flag(c.Args, "otp-server-url") == "" {
			t.Error("the OTP component gives the controller no --otp-server-url")
		}
		caFile := flag(c.Args, "otp-ca-file")
		if caFile == "" {
			t.Fatal("--otp-ca-file is not given: berth would read ca.crt from the key server's Secret, which service-ca does not write")
		}
		v := mounted(filepath.Dir(caFile))
		if v == nil || v.ConfigMap == nil {
			t.Fatalf("--otp-ca-file=%s is not in a ConfigMap's volume", caFile)
		}
		i := slices.IndexFunc(v.ConfigMap.Items, func(k corev1.KeyToPath) bool { return k.Path == filepath.Base(caFile) })
		if i < 0 || v.ConfigMap.Items[i].Key != serviceCAKey {
			t.Errorf("--otp-ca-file=%s is not the key %s of ConfigMap %s", caFile, serviceCAKey, v.ConfigMap.Name)
		}
		j := slices.IndexFunc(strictly[corev1.ConfigMap](t, objs, "ConfigMap"), func(cm corev1.ConfigMap) bool {
			return cm.Name == v.ConfigMap.Name && cm.Namespace == d.Namespace && cm.Annotations[injectCABundle] == "true"
		})
		if j < 0 {
			t.Errorf("ConfigMap %s is not in the install with annotation %s: \"true\"", v.ConfigMap.Name, injectCABundle)
		}
	}

	// restricted-v2 assigns the user and groups from the namespace's range: a fixed one is
	// refused (outside the range) or wrong.
	if s := pod.SecurityContext; s != nil && (s.RunAsUser != nil || s.RunAsGroup != nil || s.FSGroup != nil || len(s.SupplementalGroups) > 0) {
		t.Errorf("the pod fixes its user or groups (%+v); restricted-v2 assigns them", s)
	}
	for _, c := range pod.Containers {
		if s := c.SecurityContext; s != nil && (s.RunAsUser != nil || s.RunAsGroup != nil) {
			t.Errorf("container %s fixes its user or group; restricted-v2 assigns them", c.Name)
		}
	}
}

// targetsPort tells whether a Service's targetPort is the controller's container port port.
func targetsPort(c corev1.Container, target intstr.IntOrString, port int32) bool {
	for _, p := range c.Ports {
		if p.ContainerPort == port && ((target.Type == intstr.String && p.Name == target.StrVal) || (target.Type == intstr.Int && target.IntVal == port)) {
			return true
		}
	}
	return false
}

// checkPodSecurityRestricted has the apiserver's PodSecurity admission, at level restricted on
// the controller's namespace, judge a pod of the Deployment's template, and two that break one
// rule each, which it must refuse.
func checkPodSecurityRestricted(t *testing.T, cp *controlplane.ControlPlane, d appsv1.Deployment) {
	ctx := context.Background()
	var ns corev1.Namespace
	if err := cp.Client.Get(ctx, client.ObjectKey{Name: d.Namespace}, &ns); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(ns.DeepCopy())
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	ns.Labels["pod-security.kubernetes.io/enforce-version"] = "latest"
	if err := cp.Client.Patch(ctx, &ns, patch); err != nil {
		t.Fatal(err)
	}
	podOf := func(name string, change func(*corev1.PodSpec)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: name, Labels: d.Spec.Template.Labels},
			Spec:       *d.Spec.Template.Spec.DeepCopy(),
		}
		change(&p.Spec)
		return p
	}
	// A dry run goes through admission as a create does, and leaves no pod behind.
	if err := cp.Client.Create(ctx, podOf("berth-controller", func(*corev1.PodSpec) {}), client.DryRunAll); err != nil {
		t.Errorf("a pod of the controller's template, in a namespace enforcing PodSecurity restricted: %v", err)
	}
	for _, bad := range []struct {
		what   string
		change func(*corev1.PodSpec)
	}{
		{"allows privilege escalation", func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		}},
		{"adds capability NET_ADMIN", func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}},
	} {
		err := cp.Client.Create(ctx, podOf("berth-controller-bad", bad.change), client.DryRunAll)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "violates PodSecurity") {
			t.Errorf("a pod that %s was not refused by PodSecurity: %v", bad.what, err)
		}
	}
}

// playServiceCA does what service-ca does on OpenShift: a kubernetes.io/tls Secret for every
// Service that asks for one, its certificate for the Service's DNS names signed by ca; ca as
// the caBundle of every webhook of a configuration, and as service-ca.crt of every ConfigMap,
// annotated inject-cabundle.
func playServiceCA(t *testing.T, cp *controlplane.ControlPlane, ns string, ca *tlscerts.CA) {
	t.Helper()
	ctx := context.Background()
	var services corev1.ServiceList
	if err := cp.Client.List(ctx, &services, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	issued := 0
	for _, svc := range services.Items {
		name := svc.Annotations[servingCertAnnotation]
		if name == "" {
			continue
		}
		cert, err := ca.Issue(svc.Name+"."+svc.Namespace+".svc", svc.Name+"."+svc.Namespace+".svc.cluster.local")
		if err != nil {
			t.Fatal(err)
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: cert.CertPEM, corev1.TLSPrivateKeyKey: cert.KeyPEM},
		}
		if err := cp.Client.Create(ctx, secret); err != nil {
			t.Fatalf("Secret %s for Service %s: %v", name, svc.Name, err)
		}
		issued++
	}
	var configs admissionregistrationv1.MutatingWebhookConfigurationList
	if err := cp.Client.List(ctx, &configs); err != nil {
		t.Fatal(err)
	}
	injected := 0
	for _, cfg := range configs.Items {
		if cfg.Annotations[injectCABundle] != "true" {
			continue
		}
		for i := range cfg.Webhooks {
			cfg.Webhooks[i].ClientConfig.CABundle = ca.PEM
		}
		if err := cp.Client.Update(ctx, &cfg); err != nil {
			t.Fatal(err)
		}
		injected++
	}
	bundles := injectCABundles(t, cp, ns, ca)
	t.Logf("as service-ca: %d serving certificates, %d webhook configurations, %d CA bundles", issued, injected, bundles)
	if issued == 0 || injected == 0 || bundles == 0 {
		t.Fatal("the install asks service-ca for nothing of one of the three")
	}
}

// openshiftService is the install's Service name.
func openshiftService(t *testing.T, objs []*unstructured.Unstructured, name string) corev1.Service {
	t.Helper()
	for _, s := range ofKind[corev1.Service](t, objs, "Service") {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("the install has no Service %s", name)
	return corev1.Service{}
}

// readRepoObject reads one object from a YAML file of the checkout.
func readRepoObject(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), path))
	if err != nil {
		t.Fatal(err)
	}
	var o unstructured.Unstructured
	if err := yaml.Unmarshal(data, &o.Object); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &o
}

// injectCABundles writes the CA into the ConfigMaps of ns annotated for it, as service-ca's CA
// bundle injector does, and returns how many.
func injectCABundles(t *testing.T, cp *controlplane.ControlPlane, ns string, ca *tlscerts.CA) int {
	t.Helper()
	ctx := context.Background()
	var cms corev1.ConfigMapList
	if err := cp.Client.List(ctx, &cms, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	bundles := 0
	for _, cm := range cms.Items {
		if cm.Annotations[injectCABundle] != "true" {
			continue
		}
		patch := client.MergeFrom(cm.DeepCopy())
		cm.Data = map[string]string{serviceCAKey: string(ca.PEM)}
		if err := cp.Client.Patch(ctx, &cm, patch); err != nil {
			t.Fatal(err)
		}
		bundles++
	}
	return bundles
}
