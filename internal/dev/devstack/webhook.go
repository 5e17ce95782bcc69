package devstack

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// WebhookServing is where the stack's controller serves berth's admission webhook: the
// address the apiserver was told, and the serving certificate that the caBundle it was given
// trusts.
type WebhookServing struct {
	Host    string
	Port    int
	CertDir string // tls.crt, tls.key
}

// quietPort is a free port on host below the range the kernel picks the local ports of
// outgoing connections from: the webhook's port stays unbound between the stack's controllers
// (and before the first), and a port of that range can be taken meanwhile by any of the many
// connections a test run opens ("address already in use" when the controller listens).
// Ports are tried at random, so that stacks of packages tested side by side rarely try the
// same one; 0 (any port) when the range leaves no room below it.
func quietPort(host string) (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const from = 10000
	if low-from < 1000 {
		return 0, nil
	}
	for range 100 {
		port := from + rand.IntN(low-from)
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			continue
		}
		if err := ln.Close(); err != nil {
			return 0, err
		}
		return port, nil
	}
	return 0, fmt.Errorf("no free port on %s between %d and %d", host, from, low)
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
	port, err := quietPort("127.0.0.1")
	if err != nil {
		return "", err
	}
	install := &envtest.WebhookInstallOptions{Paths: []string{manifest}, LocalServingHost: "127.0.0.1", LocalServingPort: port}
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
