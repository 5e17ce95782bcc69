package sshhosts

import (
	"context"
	"strings"
)

// Fingerprint describes what root on the host could be tricked into changing through a link
// a build user planted: every path under /etc and /root with its type, mode, owner and link
// target, and every file's content hash. The backups useradd and userdel keep of the files
// they edit (names ending in '-') are left out. Two equal fingerprints mean nothing there
// changed.
func (h *Host) Fingerprint(ctx context.Context) (string, error) {
	return h.Run(ctx, `find /etc /root -xdev ! -name '*-' -printf '%p %y %m %u %l\n' 2>/dev/null | sort; `+
		`find /etc /root -xdev -type f ! -name '*-' -exec sha256sum {} + 2>/dev/null | sort`)
}

// BuildUsers lists berth's build users on the host (names starting u-).
func (h *Host) BuildUsers(ctx context.Context) ([]string, error) {
	out, err := h.Run(ctx, "getent passwd | cut -d: -f1 | grep '^u-' || true")
	return strings.Fields(out), err
}
