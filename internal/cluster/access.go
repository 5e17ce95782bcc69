package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Space is a space namespace and the means to act there, as the space's kubeconfig allows.
type Space struct {
	Namespace string
	Client    client.Client
	// pods reads container logs, which the controller-runtime client cannot.
	pods corev1client.PodsGetter
}

// NewSpace reaches a space namespace with a rest.Config acting there.
func NewSpace(cfg *rest.Config, namespace string) (*Space, error) {
	if namespace == "" {
		return nil, fmt.Errorf("no space namespace given")
	}
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("building a client for space %s: %w", namespace, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building a client for space %s: %w", namespace, err)
	}
	return &Space{Namespace: namespace, Client: c, pods: cs.CoreV1()}, nil
}

// SpaceFromKubeconfig reaches a space with a kubeconfig file's content, as a Tekton step sees
// it mounted from the space's Secret. An empty namespace means the kubeconfig context's.
func SpaceFromKubeconfig(kubeconfig []byte, namespace string) (*Space, error) {
	cc, err := clientcmd.NewClientConfigFromBytes(kubeconfig)
	if err != nil {
		// clientcmd's parse errors name a line, never the content.
		return nil, fmt.Errorf("the space kubeconfig does not parse: %w", err)
	}
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("the space kubeconfig is not usable: %w", err)
	}
	if namespace == "" {
		ns, explicit, err := cc.Namespace()
		if err != nil {
			return nil, fmt.Errorf("reading the space kubeconfig's namespace: %w", err)
		}
		if !explicit {
			return nil, fmt.Errorf("the space kubeconfig names no namespace; give the space namespace")
		}
		namespace = ns
	}
	return NewSpace(cfg, namespace)
}

// SpaceFromSecret reaches a space through the Secret its SpaceRequest names, read with the
// tenant's client.
func SpaceFromSecret(ctx context.Context, tenant client.Reader, access SpaceAccess) (*Space, error) {
	var s corev1.Secret
	if err := tenant.Get(ctx, client.ObjectKey{Namespace: access.TenantNamespace, Name: access.SecretName}, &s); err != nil {
		return nil, fmt.Errorf("reading the space's Secret %s/%s: %w", access.TenantNamespace, access.SecretName, err)
	}
	kubeconfig := s.Data[kubeconfigKey]
	if len(kubeconfig) == 0 {
		return nil, fmt.Errorf("the space's Secret %s/%s has no key %q", access.TenantNamespace, access.SecretName, kubeconfigKey)
	}
	return SpaceFromKubeconfig(kubeconfig, access.Namespace)
}
