package hosts

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/remote"
)

// SSHProber logs in to a new VM as its admin. A VM's host key is new to everyone, so the
// first key it presents is taken (unless the platform's config pins one) and recorded: from
// then on berth accepts only that key from the VM.
type SSHProber struct {
	// AdminKey is the private key of an admin-key Secret (key id_rsa).
	AdminKey func(ctx context.Context, secret string) (ssh.Signer, error)
	// Timeout bounds one attempt (connect and handshake).
	Timeout time.Duration
}

func (p SSHProber) FirstContact(ctx context.Context, login berthv1.HostLogin) (string, error) {
	signer, err := p.AdminKey(ctx, login.AdminSecret)
	if err != nil {
		return "", fmt.Errorf("the VM admin key: %w", err)
	}
	seen := &firstKey{}
	var policy remote.HostKeys = seen
	if login.HostKey != "" {
		pinned, err := remote.ParsePinned(login.HostKey)
		if err != nil {
			return "", err
		}
		policy = pinned
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	c, err := remote.Dial(ctx, remote.Target{Address: login.Address, User: login.AdminUser, Signer: signer, HostKeys: policy, DialTimeout: timeout})
	if err != nil {
		return "", err
	}
	_ = c.Close()
	if login.HostKey != "" {
		return strings.TrimSpace(login.HostKey), nil
	}
	return seen.get(), nil
}

// firstKey accepts whatever key is presented and keeps it.
type firstKey struct {
	mu  sync.Mutex
	key string
}

func (k *firstKey) Check(_ context.Context, _ string, key ssh.PublicKey) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.key = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
	return nil
}

func (k *firstKey) get() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.key
}
