package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"
)

// HostKeys decides whether a key a host presents is that host's.
type HostKeys interface {
	Check(ctx context.Context, host string, key ssh.PublicKey) error
}

// HostKeyChangedError: the host presented a key other than the pinned or recorded one. It may
// have been rebuilt, or someone is in the middle; berth does not connect either way.
type HostKeyChangedError struct {
	Host      string
	Expected  string // SHA256 fingerprint
	Presented string
	Pinned    bool
}

func (e *HostKeyChangedError) Error() string {
	if e.Pinned {
		return fmt.Sprintf("host %s presented SSH host key %s, not the pinned %s; berth refuses to connect. If the host was rebuilt, pin its new key in host-config (host.<name>.host-key)",
			e.Host, e.Presented, e.Expected)
	}
	return fmt.Sprintf("host %s presented SSH host key %s, not %s recorded when berth first connected; berth refuses to connect. If the host was rebuilt, remove its entry from the known-hosts ConfigMap or pin the new key in host-config (host.<name>.host-key)",
		e.Host, e.Presented, e.Expected)
}

// Pinned accepts exactly one key.
type Pinned struct{ Key ssh.PublicKey }

// ParsePinned reads a key in authorized_keys form ("ssh-ed25519 AAAA... comment").
func ParsePinned(line string) (Pinned, error) {
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return Pinned{}, fmt.Errorf("pinned host key %q: %w", strings.TrimSpace(line), err)
	}
	return Pinned{Key: key}, nil
}

func (p Pinned) Check(_ context.Context, host string, key ssh.PublicKey) error {
	if keysEqual(p.Key, key) {
		return nil
	}
	return &HostKeyChangedError{Host: host, Expected: ssh.FingerprintSHA256(p.Key), Presented: ssh.FingerprintSHA256(key), Pinned: true}
}

// KnownHosts stores the first key seen for each host.
type KnownHosts interface {
	// Lookup returns the recorded key (authorized_keys form), if any.
	Lookup(ctx context.Context, host string) (key string, found bool, err error)
	// Record stores key for host unless one is recorded already, and returns the key on record
	// afterwards: a concurrent first contact may have won.
	Record(ctx context.Context, host, key string) (onRecord string, err error)
}

// TrustOnFirstUse accepts the first key a host presents, records it, and from then on accepts
// only that key.
type TrustOnFirstUse struct{ Store KnownHosts }

func (t TrustOnFirstUse) Check(ctx context.Context, host string, key ssh.PublicKey) error {
	presented := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
	recorded, found, err := t.Store.Lookup(ctx, host)
	if err != nil {
		return fmt.Errorf("looking up the recorded host key of %s: %w", host, err)
	}
	if !found {
		if recorded, err = t.Store.Record(ctx, host, presented); err != nil {
			return fmt.Errorf("recording the host key of %s: %w", host, err)
		}
	}
	want, _, _, _, err := ssh.ParseAuthorizedKey([]byte(recorded))
	if err != nil {
		return fmt.Errorf("the recorded host key of %s is unreadable: %w", host, err)
	}
	if !keysEqual(want, key) {
		return &HostKeyChangedError{Host: host, Expected: ssh.FingerprintSHA256(want), Presented: ssh.FingerprintSHA256(key)}
	}
	return nil
}

func keysEqual(a, b ssh.PublicKey) bool {
	return a.Type() == b.Type() && string(a.Marshal()) == string(b.Marshal())
}

// IsHostKeyChanged tells whether err is a refused host key.
func IsHostKeyChanged(err error) bool {
	var e *HostKeyChangedError
	return errors.As(err, &e)
}
