package security_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
)

// The package's controller serves its metrics as the shipped Deployment does: over HTTPS with a
// certificate from a CA of the test's (cert-manager's in a cluster), to a bearer token the
// apiserver allows get on /metrics. Chosen once, so that a controller restarted by another test
// serves at the same address with the same certificate.
var metricsTLS struct {
	once    sync.Once
	addr    string
	certDir string
	roots   *x509.CertPool
}

// metricsServing is where and how the controller serves its metrics (controllerOptions).
func metricsServing() (addr string, secure bool, certDir string) {
	metricsTLS.once.Do(func() {
		var err error
		if metricsTLS.addr, err = devstack.MetricsAddress(); err != nil {
			panic(fmt.Sprintf("an address for the controller's metrics: %v", err))
		}
		if metricsTLS.certDir, err = os.MkdirTemp("", "berth-metrics-tls-"); err != nil {
			panic(err)
		}
		ca, err := tlscerts.NewCA("berth metrics test CA")
		if err != nil {
			panic(err)
		}
		if _, err := ca.WriteDir(metricsTLS.certDir, "127.0.0.1"); err != nil {
			panic(fmt.Sprintf("the metrics' serving certificate: %v", err))
		}
		metricsTLS.roots = x509.NewCertPool()
		metricsTLS.roots.AppendCertsFromPEM(ca.PEM)
	})
	return metricsTLS.addr, true, metricsTLS.certDir
}

// scrape GETs the controller's /metrics over HTTPS, checking its certificate, with token as the
// bearer ("" sends none).
func scrape(t *testing.T, token string) (int, string) {
	t.Helper()
	addr, _, _ := metricsServing()
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: metricsTLS.roots}}}
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("scraping https://%s/metrics: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// tokenOf is a token the apiserver issues for a ServiceAccount, as its pods get.
func tokenOf(t *testing.T, namespace, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	seconds := int64(600)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}
	if err := admin().SubResource("token").Create(context.Background(), sa, req); err != nil {
		t.Fatalf("a token for %s/%s: %v", namespace, name, err)
	}
	return req.Status.Token
}

// The metrics name every host with its slots and quarantine, and every platform's queue: a
// pod that merely reaches the port, or a tenant with its own ServiceAccount's token, reads
// none of it; a scraper bound to the shipped berth-metrics-reader role reads all of it.
func TestMetricsOnlyForAllowedScrapers(t *testing.T) {
	applyConfig(t, 1, nil)
	hosts := hostsByName()
	scraper, err := stack.MetricsScraperToken(context.Background(), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Allowed first: the refusals below are then refusals of a server that does serve.
	var body string
	eventually(t, "the allowed scraper reads the metrics of every host", func() (bool, error) {
		var code int
		if code, body = scrape(t, scraper); code != http.StatusOK {
			return false, fmt.Errorf("HTTP %d: %.200s", code, body)
		}
		for _, h := range hosts {
			if !strings.Contains(body, fmt.Sprintf("berth_host_slots_capacity{host=%q", h.Name)) {
				return false, fmt.Errorf("no berth_host_slots_capacity of host %s", h.Name)
			}
		}
		return true, nil
	})

	tn := newTenant(t, "")
	for _, c := range []struct {
		who, token string
		want       int
	}{
		{"a client with no token", "", http.StatusUnauthorized},
		{"the tenant's ServiceAccount", tokenOf(t, tn.ns, "tenant"), http.StatusForbidden},
	} {
		code, body := scrape(t, c.token)
		if code != c.want {
			t.Errorf("%s got HTTP %d (%.200s), want %d", c.who, code, body, c.want)
		}
		if strings.Contains(body, "berth_") || strings.Contains(body, hosts[0].Name) {
			t.Errorf("%s read metrics: %.300s", c.who, body)
		}
	}

	// A token the apiserver never issued is refused too: 401, or 429 should the review budget be
	// spent (internal/controller/metricsauth.go; controller-runtime's filter answered 500).
	code, junk := scrape(t, "not-a-token-the-apiserver-issued")
	if code == http.StatusOK || strings.Contains(junk, "berth_") {
		t.Errorf("a made-up token got HTTP %d: %.300s", code, junk)
	}
	t.Logf("a made-up token gets HTTP %d: %s", code, strings.TrimSpace(junk))

	// Plain HTTP on the port is no way around it.
	addr, _, _ := metricsServing()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err == nil {
		plain, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(plain), "berth_") {
			t.Errorf("plain HTTP got %d: %.300s", resp.StatusCode, plain)
		}
	}
}
