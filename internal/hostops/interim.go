package hostops

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/berth-ci/berth/internal/remote"
)

// UserName is the build user of one attempt at a TaskRun: "u-", 24 hex digits of the TaskRun's
// UID, "-" and the attempt. No two TaskRuns (a re-created one included) and no two attempts
// share a user.
func UserName(uid string, attempt int) string {
	hexUID := strings.ToLower(strings.ReplaceAll(uid, "-", ""))
	if len(hexUID) < 24 || strings.Trim(hexUID, "0123456789abcdef") != "" {
		sum := sha256.Sum256([]byte(uid))
		hexUID = hex.EncodeToString(sum[:])
	}
	return fmt.Sprintf("u-%s-%d", hexUID[:24], attempt)
}

// ErrUserExists says the user to be created exists already: berth never repairs a user.
var ErrUserExists = errors.New("the build user exists already")

// CreateUser creates user on the host with authorizedKey as its only key.
func CreateUser(ctx context.Context, t remote.Target, platform, user string, authorizedKey []byte, owner string) (string, error) {
	if !userNameRE.MatchString(user) {
		return "", fmt.Errorf("%q is not a berth build user name", truncate(user))
	}
	client, err := remote.Dial(ctx, t)
	if err != nil {
		return "", err
	}
	defer client.Close()
	line, err := asRoot(t, provisionScript, user, fmt.Sprint(DefaultLimits.Processes), fmt.Sprint(DefaultLimits.CPUMinutes), "", owner)
	if err != nil {
		return "", err
	}
	out, err := client.Run(ctx, "provisioning user "+user, line, authorizedKey)
	if err != nil {
		return "", err
	}
	home := strings.TrimSpace(string(out))
	if !strings.HasPrefix(home, "/") {
		return "", fmt.Errorf("on host %s, provisioning user %s printed no home directory: %q", t.Address, user, home)
	}
	return home + "/build", nil
}

// Unsupported says why berth cannot yet make per-task users on platform's OS ("" if it can).
func Unsupported(platform string) string {
	if usesPremadeUser(platform) {
		return fmt.Sprintf("berth cannot yet create per-task users on %s hosts, and it never hands out a host's own key; ask the platform team to serve %s another way.", platform, platform)
	}
	return ""
}

// NewKey makes a build user's key pair: the OpenSSH private key and the authorized_keys line.
func NewKey(comment string) (private, authorized []byte, err error) { return newKey(comment) }
