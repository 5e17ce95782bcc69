package keyserver

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
	// KubeAPIQPS and KubeAPIBurst limit the requests of the server's own client to the
	// apiserver (redemptions, TokenReviews, its index's watch): it shares no client and no
	// limiter with the process it runs in, so a flood held up there holds up no one else.
	// Zero takes DefaultKubeAPIQPS and DefaultKubeAPIBurst.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// Limits bound each source's requests, and the redemptions at the apiserver at once, shared
	// in turns by namespace (DefaultLimits for zero fields).
	Limits Limits
	// UnsureReads (per second) and UnsureBurst bound the apiserver reads of tokens the index
	// cannot judge while its watch is not current (DefaultUnsureReads, DefaultUnsureBurst).
	UnsureReads float64
	UnsureBurst int
}

// The key server's own apiserver budget by default. A redemption takes at most four requests
// (read the key, its record, the TaskRun; delete the key): 50 a second is a dozen redemptions a
// second, and a burst of 100 serves 25 tasks that start together without waiting.
const (
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 100
)

// While the index is not current (its first list, or the moment between one watch and the
// next), a token it does not know is read from the apiserver: at most this many a second, in
// bursts of this many, whatever the number of clients. Past that it is answered 503 "try
// again": a flood then still costs the apiserver nothing more.
const (
	DefaultUnsureReads = 5
	DefaultUnsureBurst = 10
)

// Serve adds the key server of store to mgr: its certificate watcher, its HTTPS endpoint on
// every replica, its index of kept keys, and a readiness check that passes once it accepts
// connections and its index has listed the keys. Redemptions go through a client of the
// server's own (o.KubeAPIQPS, o.KubeAPIBurst), never store's; store is told of the index so
// that a key it keeps is known at once.
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
	cfg := rest.CopyConfig(mgr.GetConfig())
	cfg.QPS, cfg.Burst, cfg.RateLimiter = o.KubeAPIQPS, o.KubeAPIBurst, nil
	if cfg.QPS <= 0 {
		cfg.QPS = DefaultKubeAPIQPS
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultKubeAPIBurst
	}
	own, err := client.New(cfg, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return fmt.Errorf("the key server's own client: %w", err)
	}
	reads, burst := o.UnsureReads, o.UnsureBurst
	if reads <= 0 {
		reads = DefaultUnsureReads
	}
	if burst <= 0 {
		burst = DefaultUnsureBurst
	}
	index, err := NewIndex(cfg, store.Namespace, reads, burst)
	if err != nil {
		return err
	}
	if err := mgr.Add(index); err != nil {
		return err
	}
	store.Index = index
	redeemer := &Store{Client: own, Namespace: store.Namespace, TTL: store.TTL, Now: store.Now, Index: index,
		Attempts: store.Attempts, Turns: NewTurns(o.Limits.Concurrency, 0)}
	h := &Handler{Store: redeemer, Limits: NewLimiter(o.Limits), Log: mgr.GetLogger().WithName("otp-server")}
	if len(allowed) > 0 {
		h.StoreKey = ServiceAccounts{Client: own, Allowed: allowed}
	}
	endpoint := &Endpoint{Addr: o.Addr, Certs: certs, Handler: h}
	if err := mgr.Add(endpoint); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("otp-server", func(*http.Request) error {
		if !endpoint.Serving() {
			return errors.New("the key server does not accept connections yet")
		}
		if !index.HasSynced() {
			return errors.New("the key server has not listed the kept keys yet")
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
