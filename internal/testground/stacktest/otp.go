package stacktest

import (
	"net"
	"testing"

	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/devstack"
	"github.com/berth-ci/berth/internal/testground/tlscerts"
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
	ca, err := tlscerts.NewCA("berth-otp-stack-test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := ca.WriteDir(dir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	// The URL goes into the secrets before the server listens: its port is chosen here.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	withOTP := o
	withOTP.OTP = controller.OTPOptions{ServerURL: "https://" + addr + "/otp", BindAddress: addr, CertDir: dir}
	RestartController(t, s, withOTP)
	t.Cleanup(func() { RestartController(t, s, o) })
	return withOTP.OTP.ServerURL, ca
}
