//go:build linux

package sshhosts

import (
	"context"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/remote"
)

// AddAdmin makes user an administrator of the host as a cloud image's first boot does for
// its default user (ec2-user on EC2): an account that logs in with the host's admin key and
// may run anything through passwordless sudo. berth then reaches root only through sudo.
func (h *Host) AddAdmin(ctx context.Context, user string) error {
	const script = `set -e
id -u "$1" >/dev/null 2>&1 || useradd -m -s /bin/sh "$1"
printf '%s\n' "$2" > /etc/ssh/authorized_keys/"$1"
chmod 644 /etc/ssh/authorized_keys/"$1"
printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$1" > /etc/sudoers.d/90-default-user-"$1"
chmod 440 /etc/sudoers.d/90-default-user-"$1"`
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(h.admin.PublicKey())))
	line, err := remote.Script(script, user, key)
	if err != nil {
		return err
	}
	if _, err := h.Run(ctx, line); err != nil {
		return fmt.Errorf("sshhosts: making %s an admin of %s: %w", user, h.Name, err)
	}
	return nil
}
