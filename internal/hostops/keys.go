package hostops

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"fmt"
	"sync/atomic"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/config"
)

// rsaBits is the size of rsa-3072 keys: 128-bit security, what NIST SP 800-57 asks of RSA
// keys used beyond 2030 (2048 bits is the least FIPS mode takes today).
const rsaBits = 3072

// NewKey makes a build user's key pair of type kt (the zero KeyType is the default): the
// private key as an unencrypted OpenSSH key file, for the task's secret, and the
// authorized_keys line, the only part that reaches the host. RSA keys sign with SHA-2
// (rsa-sha2-256/512) when the client and sshd agree to, as every OpenSSH since 7.2 does; the
// key file itself does not choose.
func NewKey(kt config.KeyType, comment string) (private, authorized []byte, err error) {
	key, err := generateKey(kt)
	if err != nil {
		return nil, nil, err
	}
	return marshalKey(key, comment)
}

func generateKey(kt config.KeyType) (crypto.Signer, error) {
	var key crypto.Signer
	var err error
	switch kt {
	case config.KeyTypeEd25519, "":
		_, key, err = ed25519.GenerateKey(rand.Reader)
	case config.KeyTypeECDSAP256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case config.KeyTypeRSA3072:
		key, err = rsa.GenerateKey(rand.Reader, rsaBits)
	default:
		return nil, fmt.Errorf("berth cannot make %q keys for build users; it makes %v", kt, config.KeyTypes)
	}
	if err != nil {
		return nil, fmt.Errorf("making a %s key: %w", kt, err)
	}
	return key, nil
}

func marshalKey(key crypto.Signer, comment string) (private, authorized []byte, err error) {
	block, err := ssh.MarshalPrivateKey(key, comment)
	if err != nil {
		return nil, nil, err
	}
	pub, err := ssh.NewPublicKey(key.Public())
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(block), ssh.MarshalAuthorizedKey(pub), nil
}

// KeyStock makes build users' keys as NewKey does, keeping a few RSA keys made ahead. An
// RSA-3072 key costs a few hundred milliseconds of CPU (a random prime search, so sometimes
// far more), and the controller makes the key inside the reconcile that reserves the task's
// slot: made there, it would hold a reconcile worker that long for every task. Ed25519 and
// ECDSA keys take microseconds and are made on demand. A stocked key is never handed out
// twice; when the stock is empty (a burst larger than it), the key is made on demand.
type KeyStock struct {
	rsa     chan crypto.Signer
	filling atomic.Bool
}

// NewKeyStock returns a stock that keeps up to size RSA keys ready once RSA keys are asked for
// (or prepared).
func NewKeyStock(size int) *KeyStock {
	return &KeyStock{rsa: make(chan crypto.Signer, max(size, 1))}
}

// Prepare fills the stock ahead for kt, if keys of that type are slow to make: call it when
// the config in force changes, so that the first tasks after a switch to rsa-3072 find keys
// ready.
func (s *KeyStock) Prepare(kt config.KeyType) {
	if kt == config.KeyTypeRSA3072 {
		s.fill()
	}
}

// NewKey is NewKey, from the stock for RSA keys when it has one.
func (s *KeyStock) NewKey(kt config.KeyType, comment string) (private, authorized []byte, err error) {
	if kt != config.KeyTypeRSA3072 {
		return NewKey(kt, comment)
	}
	defer s.fill()
	select {
	case key := <-s.rsa:
		return marshalKey(key, comment)
	default:
		return NewKey(kt, comment)
	}
}

// Stocked is how many RSA keys are ready.
func (s *KeyStock) Stocked() int { return len(s.rsa) }

// fill tops the stock up in the background; one filler at a time, and it ends when the stock
// is full.
func (s *KeyStock) fill() {
	if !s.filling.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.filling.Store(false)
		for len(s.rsa) < cap(s.rsa) {
			key, err := generateKey(config.KeyTypeRSA3072)
			if err != nil {
				return // the next take makes its key on demand, and reports the error
			}
			select {
			case s.rsa <- key:
			default:
				return
			}
		}
	}()
}
