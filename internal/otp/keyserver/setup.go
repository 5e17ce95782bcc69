package keyserver

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// The files of a certificate directory, as cert-manager writes a Certificate's Secret and the
// kubelet mounts it: the serving certificate, its key, and the CA that signed it.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// ServeOptions shape the key server served in a manager.
type ServeOptions struct {
	// Addr is where it listens (host:port).
	Addr string
	// CertDir holds tls.crt and tls.key; they are read again whenever they change.
	CertDir string
	// StoreKeyServiceAccounts ("namespace/name") may POST /store-key; none: nobody may.
	StoreKeyServiceAccounts []string
}

// Serve adds the key server of store to mgr: its certificate watcher, its HTTPS endpoint on
// every replica, and a readiness check that passes once it accepts connections.
func Serve(mgr manager.Manager, store *Store, o ServeOptions) error {
	allowed, err := ParseServiceAccounts(o.StoreKeyServiceAccounts)
	if err != nil {
		return fmt.Errorf("the ServiceAccounts that may store keys: %w", err)
	}
	certs, err := certwatcher.New(filepath.Join(o.CertDir, CertFile), filepath.Join(o.CertDir, KeyFile))
	if err != nil {
		return fmt.Errorf("the key server's certificate in %s: %w", o.CertDir, err)
	}
	if err := mgr.Add(certs); err != nil {
		return err
	}
	h := &Handler{Store: store, Log: mgr.GetLogger().WithName("otp-server")}
	if len(allowed) > 0 {
		h.StoreKey = ServiceAccounts{Client: store.Client, Allowed: allowed}
	}
	endpoint := &Endpoint{Addr: o.Addr, Certs: certs, Handler: h}
	if err := mgr.Add(endpoint); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("otp-server", func(*http.Request) error {
		if !endpoint.Serving() {
			return errors.New("the key server does not accept connections yet")
		}
		return nil
	})
}

// ReadCA reads the CA certificate tasks are given to check the server's certificate with
// (otp-ca), and makes sure it is one: a broken file would fail every task's redemption.
func ReadCA(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the key server's CA certificate: %w", err)
	}
	rest, found := data, false
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, fmt.Errorf("the key server's CA certificate %s: %w", path, err)
		}
		found = true
	}
	if !found {
		return nil, fmt.Errorf("the key server's CA certificate %s holds no PEM certificate", path)
	}
	return data, nil
}
