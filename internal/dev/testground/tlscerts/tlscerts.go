// Package tlscerts makes the certificates the test ground's HTTPS servers present: a CA of
// their own and serving certificates it signs, for loopback addresses and names, as
// cert-manager would issue them in a cluster. Test and development use only.
package tlscerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA signs serving certificates.
type CA struct {
	// PEM is the CA's certificate, what clients are told to trust.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// validity of what is made here: a test ground outlives no year.
const validity = 365 * 24 * time.Hour

// NewCA makes a CA named name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}, nil
}

// Serving is a serving certificate and its key, in PEM.
type Serving struct {
	CertPEM, KeyPEM []byte
}

// TLS is the certificate as a server presents it.
func (s Serving) TLS() (tls.Certificate, error) { return tls.X509KeyPair(s.CertPEM, s.KeyPEM) }

// Issue signs a serving certificate for hosts: IP addresses and DNS names.
func (ca *CA) Issue(hosts ...string) (Serving, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Serving{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Serving{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Serving{}, err
	}
	return Serving{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// WriteDir writes a serving certificate for hosts into dir as cert-manager's Secret is mounted:
// tls.crt, tls.key and ca.crt. Each file is replaced whole (written aside, then renamed), as
// the kubelet swaps a mounted Secret's files, so a reader never sees half a file.
func (ca *CA) WriteDir(dir string, hosts ...string) (Serving, error) {
	s, err := ca.Issue(hosts...)
	if err != nil {
		return Serving{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Serving{}, err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"ca.crt", ca.PEM}, {"tls.key", s.KeyPEM}, {"tls.crt", s.CertPEM}} {
		tmp := filepath.Join(dir, "."+f.name+".new")
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			return Serving{}, err
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			return Serving{}, err
		}
	}
	return s, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}
