package devstack

import (
	"fmt"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/berth-ci/berth/internal/testground/controlplane"
)

// WebhookServing is where the stack's controller serves berth's admission webhook: the
// address the apiserver was told, and the serving certificate that the caBundle it was given
// trusts.
type WebhookServing struct {
	Host    string
	Port    int
	CertDir string // tls.crt, tls.key
}

// installWebhook registers the webhook configuration berth ships (config/webhook) with the
// control plane as envtest does: a CA and a serving certificate for 127.0.0.1 made into a
// directory of their own, the configuration's service reference replaced by that address on a
// free port, and its caBundle by that CA. The port stays the stack's, so a restarted
// controller serves at the same address.
func (s *Stack) installWebhook() (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	manifest := filepath.Join(root, "config", "webhook", "manifests.yaml")
	install := &envtest.WebhookInstallOptions{Paths: []string{manifest}, LocalServingHost: "127.0.0.1"}
	err = install.Install(s.ControlPlane.Config)
	if install.LocalServingCertDir != "" {
		s.dirs = append(s.dirs, install.LocalServingCertDir)
	}
	if err != nil {
		return "", fmt.Errorf("registering the webhook of %s: %w", manifest, err)
	}
	if len(install.MutatingWebhooks) == 0 {
		return "", fmt.Errorf("%s holds no MutatingWebhookConfiguration", manifest)
	}
	s.Webhook = WebhookServing{Host: install.LocalServingHost, Port: install.LocalServingPort, CertDir: install.LocalServingCertDir}
	return fmt.Sprintf("webhook %s served at https://%s:%d", install.MutatingWebhooks[0].Name, s.Webhook.Host, s.Webhook.Port), nil
}
