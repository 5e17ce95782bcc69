package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/berth-ci/berth/internal/cli"
)

// The OTP option as docs/otp.md installs it: config/default with the certificates of
// config/certmanager and the component config/otp. The pieces fit: the URL written into task
// secrets reaches the key server through its Service, the certificate mounted is the one
// cert-manager issues for that URL's host, and the controller takes every flag it is given.
func TestOTPComponentFitsTogether(t *testing.T) {
	objs := renderOverlay(t, []string{defaultDir, certManagerDir}, []string{"config/otp"})
	deployments := strictly[appsv1.Deployment](t, objs, "Deployment")
	if len(deployments) != 1 {
		t.Fatalf("%d Deployments, want the controller's", len(deployments))
	}
	d := deployments[0]
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]

	// The args of config/default stay; the component's come after them.
	plain := strictly[appsv1.Deployment](t, render(t, defaultDir), "Deployment")[0].Spec.Template.Spec.Containers[0].Args
	if !slices.Equal(c.Args[:len(plain)], plain) {
		t.Errorf("the controller's args %v lost those of config/default %v", c.Args, plain)
	}
	flag := func(name string) string {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		t.Fatalf("the controller is not given --%s: %v", name, c.Args)
		return ""
	}
	serverURL, bind, certDir := flag("otp-server-url"), flag("otp-bind-address"), flag("otp-cert-dir")

	// Every flag parses: the controller would exit at once on one it does not know.
	cmd := cli.NewRootCommand()
	cmd.SetArgs(append(append(slices.Clone(c.Command[1:]), c.Args...), "--help"))
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.Execute(); err != nil {
		t.Errorf("berth %s: %v", strings.Join(c.Args, " "), err)
	}

	// The URL: the Service in the controller's namespace, the port it maps to the key server's.
	u, err := url.Parse(serverURL)
	if err != nil || u.Scheme != "https" || u.Path != "/otp" {
		t.Fatalf("--otp-server-url=%s: want https://<service>.<namespace>.svc:<port>/otp", serverURL)
	}
	svcName, rest, _ := strings.Cut(u.Hostname(), ".")
	if want := d.Namespace + ".svc"; rest != want {
		t.Errorf("the URL's host %s is not a Service of namespace %s", u.Hostname(), d.Namespace)
	}
	var svc *corev1.Service
	for _, s := range strictly[corev1.Service](t, objs, "Service") {
		if s.Name == svcName && s.Namespace == d.Namespace {
			svc = &s
		}
	}
	if svc == nil {
		t.Fatalf("no Service %s/%s, which --otp-server-url names", d.Namespace, svcName)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Service %s selects %v, not the controller's pods", svc.Name, svc.Spec.Selector)
	}
	_, bindPort, err := net.SplitHostPort(bind)
	if err != nil {
		t.Fatal(err)
	}
	reached := false
	for _, p := range svc.Spec.Ports {
		if fmt.Sprint(p.Port) != u.Port() {
			continue
		}
		for _, cp := range c.Ports {
			if (cp.Name == p.TargetPort.StrVal || cp.ContainerPort == p.TargetPort.IntVal) && fmt.Sprint(cp.ContainerPort) == bindPort {
				reached = true
			}
		}
	}
	if !reached {
		t.Errorf("port %s of Service %s does not lead to the key server's port %s", u.Port(), svc.Name, bindPort)
	}

	// The certificate mounted at --otp-cert-dir is the one issued for the URL's host.
	var secretName string
	for _, m := range c.VolumeMounts {
		if m.MountPath == certDir {
			for _, v := range pod.Volumes {
				if v.Name == m.Name && v.Secret != nil {
					secretName = v.Secret.SecretName
				}
			}
		}
	}
	if secretName == "" {
		t.Fatalf("no Secret is mounted at --otp-cert-dir=%s", certDir)
	}
	issued := false
	for _, cert := range ofKindUnstructured(objs, "Certificate") {
		name, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
		hosts, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		if name == secretName && cert.GetNamespace() == d.Namespace && slices.Contains(hosts, u.Hostname()) {
			issued = true
		}
	}
	if !issued {
		t.Errorf("no Certificate of config/certmanager issues Secret %s for %s", secretName, u.Hostname())
	}
}

// strictly decodes every object of a kind into T, refusing a field T does not have: what the
// apiserver's strict field validation would refuse.
func strictly[T any](t *testing.T, objs []*unstructured.Unstructured, kind string) []T {
	t.Helper()
	var out []T
	for _, o := range ofKindUnstructured(objs, kind) {
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		var v T
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s %s: %v", kind, o.GetName(), err)
		}
		out = append(out, v)
	}
	return out
}

func ofKindUnstructured(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}
