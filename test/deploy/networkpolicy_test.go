package deploy

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// In every layout users install (config/default, the release's config/release, the OpenShift
// overlays, the OTP option), a NetworkPolicy admits to the controller's metrics port only the
// namespaces Prometheus runs in, and every other port the controller serves (the webhook, the
// health probes, the key server) from anywhere, so that the policy cuts nothing else off.
func TestNetworkPolicyAdmitsOnlyMonitoringToMetrics(t *testing.T) {
	plain := []string{"monitoring"}
	openshift := []string{"openshift-monitoring", "openshift-user-workload-monitoring"}
	for _, layout := range []struct {
		name       string
		resources  []string
		components []string
		monitoring []string
	}{
		{"default", []string{defaultDir}, nil, plain},
		{"release", []string{"config/release"}, nil, plain},
		{"otp", []string{defaultDir, certManagerDir}, []string{"config/otp"}, plain},
		{"openshift", []string{defaultDir}, []string{openshiftDir}, openshift},
		{"openshift-otp", []string{defaultDir}, []string{openshiftOTPDir}, openshift},
	} {
		t.Run(layout.name, func(t *testing.T) {
			objs := renderOverlay(t, layout.resources, layout.components)
			deployments := ofKind[appsv1.Deployment](t, objs, "Deployment")
			if len(deployments) != 1 {
				t.Fatalf("%d Deployments, want the controller's", len(deployments))
			}
			d := deployments[0]
			var policies []networkingv1.NetworkPolicy
			for _, p := range ofKind[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy") {
				sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
				if err != nil {
					t.Fatalf("NetworkPolicy %s: %v", p.Name, err)
				}
				if p.Namespace == d.Namespace && slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
					policies = append(policies, p)
				}
			}
			if len(policies) == 0 {
				t.Fatal("no NetworkPolicy selects the controller's pods: any pod in the cluster reaches the metrics port")
			}
			// A namespace by its name, labelled as the apiserver labels every namespace.
			namespace := func(name string) labels.Set { return labels.Set{corev1.LabelMetadataName: name} }
			for _, c := range d.Spec.Template.Spec.Containers {
				for _, port := range c.Ports {
					from := func(ns string) bool { return admits(t, policies, d.Namespace, port, namespace(ns)) }
					if port.Name != "metrics" {
						for _, ns := range []string{"tenant", "kube-system", d.Namespace} {
							if !from(ns) {
								t.Errorf("port %s (%d) is shut to namespace %s: the policy must admit the controller's other ports", port.Name, port.ContainerPort, ns)
							}
						}
						if !admitsAnyAddress(policies, port) {
							t.Errorf("port %s (%d) admits only some pods: the apiserver and the kubelet, which call the webhook and the probes, are no pods", port.Name, port.ContainerPort)
						}
						continue
					}
					for _, ns := range layout.monitoring {
						if !from(ns) {
							t.Errorf("the metrics port is shut to %s, where Prometheus runs", ns)
						}
					}
					for _, ns := range []string{"tenant", "default", "kube-system", d.Namespace} {
						if from(ns) {
							t.Errorf("the metrics port admits namespace %s", ns)
						}
					}
					if admitsAnyAddress(policies, port) {
						t.Error("the metrics port admits any address")
					}
				}
			}
		})
	}
}

// admits says whether a pod of namespace ns (with those labels) may connect to port of the
// controller's pods under policies, which all select them.
func admits(t *testing.T, policies []networkingv1.NetworkPolicy, policyNS string, port corev1.ContainerPort, ns labels.Set) bool {
	t.Helper()
	for _, p := range policies {
		for _, rule := range p.Spec.Ingress {
			if !rulePorts(rule, port) {
				continue
			}
			if len(rule.From) == 0 {
				return true
			}
			for _, peer := range rule.From {
				switch {
				case peer.IPBlock != nil:
					return true
				case peer.NamespaceSelector != nil:
					sel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
					if err != nil {
						t.Fatalf("NetworkPolicy %s: %v", p.Name, err)
					}
					if sel.Matches(ns) {
						return true
					}
				case peer.PodSelector != nil:
					if ns[corev1.LabelMetadataName] == policyNS {
						return true
					}
				}
			}
		}
	}
	return false
}

// admitsAnyAddress says whether some rule admits port from every address, pods or not.
func admitsAnyAddress(policies []networkingv1.NetworkPolicy, port corev1.ContainerPort) bool {
	for _, p := range policies {
		for _, rule := range p.Spec.Ingress {
			if !rulePorts(rule, port) {
				continue
			}
			if len(rule.From) == 0 || slices.ContainsFunc(rule.From, func(peer networkingv1.NetworkPolicyPeer) bool {
				return peer.IPBlock != nil && (peer.IPBlock.CIDR == "0.0.0.0/0" || peer.IPBlock.CIDR == "::/0") && len(peer.IPBlock.Except) == 0
			}) {
				return true
			}
		}
	}
	return false
}

// rulePorts says whether rule covers the container's port, by name or number.
func rulePorts(rule networkingv1.NetworkPolicyIngressRule, port corev1.ContainerPort) bool {
	if len(rule.Ports) == 0 {
		return true
	}
	return slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool {
		protocol := corev1.ProtocolTCP
		if p.Protocol != nil {
			protocol = *p.Protocol
		}
		if port.Protocol != "" && protocol != port.Protocol {
			return false
		}
		if p.Port == nil {
			return true
		}
		if p.Port.StrVal != "" {
			return p.Port.StrVal == port.Name
		}
		end := p.Port.IntVal
		if p.EndPort != nil {
			end = *p.EndPort
		}
		return port.ContainerPort >= p.Port.IntVal && port.ContainerPort <= end
	})
}
