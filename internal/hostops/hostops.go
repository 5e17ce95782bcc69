// Package hostops is what berth does on a build host over SSH: give a task its own throwaway
// user with the task's public key (CreateUser), remove it again (Clean), and check the host's health and
// sweep users whose tasks are gone (Update).
package hostops

import (
	"context"
	"crypto/md5" // #nosec G501 -- only to name the users the upstream controller made, not for security
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"

	"github.com/berth-ci/berth/internal/remote"
)

// LegacyUserName is the build user earlier berth releases made for a TaskRun: "u-" and 12 hex
// digits of a hash of namespace and name. Kept to clean up after them.
func LegacyUserName(namespace, taskRun string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + taskRun))
	return "u-" + hex.EncodeToString(sum[:6])
}

// UpstreamUserName is the build user the Konflux multi-platform controller, which berth
// replaces, made for a TaskRun on a Linux host: "u-" and the first 28 hex digits of the MD5 of
// the TaskRun's name, its namespace and a newline (its provision task names the user
// u-$(echo "$TASKRUN_NAME$NAMESPACE" | md5sum | cut -b-28)). Kept to clean up after it.
func UpstreamUserName(namespace, taskRun string) string {
	sum := md5.Sum([]byte(taskRun + namespace + "\n")) // #nosec G401 -- a name, not a secret
	return "u-" + hex.EncodeToString(sum[:])[:28]
}

// userNameRE matches every build user berth may remove: today's, LegacyUserName's and
// UpstreamUserName's. newUserNameRE matches the users it creates.
var (
	userNameRE    = regexp.MustCompile(`^u-([0-9a-f]{12}|[0-9a-f]{28}|[0-9a-f]{24}-[0-9]{1,4})$`)
	newUserNameRE = regexp.MustCompile(`^u-[0-9a-f]{24}-[0-9]{1,4}$`)
)

// Clean removes a build user with its processes (those of its subordinate IDs too), home,
// files elsewhere, IPC objects, jobs, sudo rule and limits, and frees its UID slice. A user
// that is already gone is success, so a repeated clean is harmless. What would not go is a
// *LeftoverError.
func Clean(ctx context.Context, target remote.Target, user string) error {
	if !userNameRE.MatchString(user) {
		return fmt.Errorf("%q is not a berth build user name; refusing to remove it", truncate(user))
	}
	client, err := remote.Dial(ctx, target)
	if err != nil {
		return err
	}
	defer client.Close()
	return clean(ctx, client, target, user)
}

func clean(ctx context.Context, client *remote.Client, target remote.Target, user string) error {
	line, err := asRoot(target, cleanScript, user)
	if err != nil {
		return err
	}
	_, err = client.Run(ctx, "removing user "+user, line, nil)
	return leftover(target, user, err)
}

// asRoot builds the command line running script as root: directly for root, through
// passwordless sudo for another admin user.
func asRoot(target remote.Target, script string, args ...string) (string, error) {
	if target.User == "root" {
		return remote.Script(script, args...)
	}
	return remote.ScriptVia([]string{"sudo", "-n"}, script, args...)
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}
