package controller

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"

	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// metricsOptions say how the manager serves /metrics. The metrics name every host, its slots
// and quarantine and every platform's queue, which is no tenant's business, and any pod can reach
// the port: so by default only a client whose bearer token the apiserver accepts (TokenReview)
// and whom it allows `get` on the non-resource URL /metrics (SubjectAccessReview; the
// ClusterRole berth-metrics-reader grants that) reads them, over TLS so that the token and the
// figures are not readable on the wire. The reviews are made within a small budget of their own
// (metricsauth.go), so knocking with made-up tokens costs the apiserver next to nothing; the
// NetworkPolicy of config/manager admits only the monitoring namespace to the port.
func metricsOptions(o Options) (metricsserver.Options, error) {
	m := metricsserver.Options{BindAddress: o.MetricsAddress}
	if o.MetricsAddress == "0" {
		return m, nil
	}
	// The metrics server listens only once the manager runs (after making its serving
	// certificate and authorization filter), and when it cannot, the manager stops moments
	// after the controller has passed for ready. An address another program holds is found
	// here, before anything starts.
	l, err := net.Listen("tcp", o.MetricsAddress)
	if err != nil {
		return m, fmt.Errorf("the metrics address: %w", err)
	}
	if err := l.Close(); err != nil {
		return m, err
	}
	if !o.MetricsSecure {
		return m, nil
	}
	if o.MetricsCertDir != "" {
		for _, name := range []string{"tls.crt", "tls.key"} {
			if _, err := os.Stat(filepath.Join(o.MetricsCertDir, name)); err != nil {
				// controller-runtime would quietly serve a self-signed certificate instead, which
				// a Prometheus that checks the CA then refuses, scrape after scrape.
				return m, fmt.Errorf("the metrics' serving certificate: %w; mount its Secret (berth-metrics-tls, from config/certmanager) at --metrics-cert-dir, or leave the flag out for a self-signed certificate", err)
			}
		}
	}
	m.SecureServing = true
	m.CertDir = o.MetricsCertDir
	m.FilterProvider = metricsAuthFilter(o.MetricsReviewQPS, o.MetricsReviewBurst)
	// HTTP/1.1 only, as the webhook: HTTP/2's stream handling has been a denial-of-service
	// target (CVE-2023-44487), and Prometheus scrapes over HTTP/1.1.
	m.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	return m, nil
}
