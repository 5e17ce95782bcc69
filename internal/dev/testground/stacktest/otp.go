package stacktest

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
)

// RestartController replaces the stack's running controller with one started with o, as a
// crash and restart would.
func RestartController(t *testing.T, s *devstack.Stack, o controller.Options) {
	t.Helper()
	if err := s.StopController(); err != nil {
		t.Fatalf("stopping the controller: %v", err)
	}
	if err := s.StartController(o); err != nil {
		t.Fatalf("starting the controller: %v", err)
	}
}

// OTPController restarts the stack's controller with o and the OTP option until the test ends,
// then with o alone, so that the package's other tests meet the controller they started with.
// berth's key server listens on a loopback port with a certificate of a CA of the test's own;
// OTPController returns its URL, as the tasks' secrets name it, and the CA.
func OTPController(t *testing.T, s *devstack.Stack, o controller.Options) (url string, ca *tlscerts.CA) {
	t.Helper()
	return OTPControllerOn(t, s, o, "127.0.0.1")
}

// OTPControllerOn is OTPController with the key server listening on bindHost ("" for every
// address of this machine) and its certificate good for the further addresses too, so that a
// client in a test host's network namespace reaches it at this machine's end of the host's
// link. The tasks' secrets still name 127.0.0.1, where the Tekton stand-in runs their steps.
func OTPControllerOn(t *testing.T, s *devstack.Stack, o controller.Options, bindHost string, addresses ...string) (url string, ca *tlscerts.CA) {
	t.Helper()
	ca, err := tlscerts.NewCA("berth-otp-stack-test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := ca.WriteDir(dir, append([]string{"127.0.0.1"}, addresses...)...); err != nil {
		t.Fatal(err)
	}
	// The URL goes into the secrets before the server listens: its port is chosen here.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	withOTP := o
	// The rest of o.OTP (the server's limits, say) is kept.
	withOTP.OTP.ServerURL, withOTP.OTP.BindAddress, withOTP.OTP.CertDir = "https://"+addr+"/otp", net.JoinHostPort(bindHost, port), dir
	RestartController(t, s, withOTP)
	t.Cleanup(func() { RestartController(t, s, o) })
	return withOTP.OTP.ServerURL, ca
}

// Redeem POSTs a one-time token to berth's key server at url, trusting only the CA certificate
// caPEM, as the buildah-remote Tasks' curl does with their secret's otp-server and otp-ca, and
// returns the status and body of its answer.
func Redeem(url string, caPEM []byte, token string) (int, []byte, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return 0, nil, errors.New("the CA holds no certificate")
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := hc.Post(url, "application/x-www-form-urlencoded", strings.NewReader(token))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}
