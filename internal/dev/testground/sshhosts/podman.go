//go:build linux

package sshhosts

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// Every test host can take a remote build as the buildah-remote Tasks send it: the task
// rsyncs its sources to the host, runs `podman run <builder image> /scripts/script-build.sh`
// there as its build user, and rsyncs the results back. The Tasks `berth taskgen` makes do
// the same with `podman run <step image> /tekton/scripts/<step>.sh`.
//
//   - rsync is this machine's (hosts share /usr): `make prereqs` installs it.
//   - podman is a stand-in, PodmanPath, because the builder image is digest-pinned in a
//     registry this machine cannot reach. For buildah-remote's /scripts/script-build.sh it
//     checks that it was called as the task calls it (as a build user, not root; --user=0;
//     the task's mounts from the synced build directory; the env script-build.sh reads; no
//     other entrypoint; /scripts/script-build.sh present) and fails with exit status 125 and
//     a message saying what was wrong. Otherwise it does what the task reads back: a real
//     image, built rootless by the build user with Debian's buildah (FROM scratch, the synced
//     build context copied to /src, labels naming the user), an OCI layout of it in the
//     shared volume with its path in container_path, and the IMAGE_URL, IMAGE_DIGEST and
//     IMAGE_REF results. Any other command (the steps `berth taskgen` moves to a host) runs
//     in a rootless container whose files are the host's own (/usr read-only, a copy of
//     /etc): the build user as root, its subordinate range as the other ids, its own
//     hostname, only the given mounts and environment; options it cannot honour fail with
//     125. The build user needs a range in /etc/subuid, as rootless podman does on a real
//     host; useradd assigns one.
//
// The stand-in exists only inside each host's mount namespace: its /usr/local/bin is a
// private directory holding this machine's entries (bind-mounted one by one) plus podman, so
// this machine's /usr/local/bin and /usr/bin are never touched, and Debian's real podman, if
// installed, stays reachable at /usr/bin/podman. /usr/local/bin comes first in the PATH sshd
// gives every login, so a plain `podman` over ssh finds the stand-in.

// PodmanPath is where every test host has the podman stand-in.
const PodmanPath = "/usr/local/bin/podman"

//go:embed podman-standin.sh
var podmanStandIn []byte

// podmanStandInFile is the stand-in's name in a host's Dir.
const podmanStandInFile = "podman-standin"

// BuildPrerequisites says what this machine lacks for a remote build on the test hosts (the
// task's side and the stand-in's), and how to get it; nil when nothing. Hosts start without
// these; only a build needs them.
func BuildPrerequisites() error {
	var missing []error
	for _, tool := range []struct{ name, pkg string }{
		{"rsync", "rsync"},
		{"ssh", "openssh-client"},
		{"buildah", "buildah"},
		{"newuidmap", "uidmap"},
	} {
		if _, err := exec.LookPath(tool.name); err != nil {
			missing = append(missing, fmt.Errorf("%s is missing: `make prereqs` installs it, or apt-get install -y %s", tool.name, tool.pkg))
		}
	}
	if len(missing) == 0 && os.Geteuid() == 0 {
		// The stand-in builds rootless, which needs an unprivileged process to be allowed a
		// user namespace; some kernels and security modules forbid it.
		out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "--user", "true").CombinedOutput()
		if err != nil {
			missing = append(missing, fmt.Errorf("an unprivileged user may not create a user namespace here (%v: %s), and the podman stand-in builds rootless as the build user: allow it (sysctl kernel.unprivileged_userns_clone=1, or user.max_user_namespaces > 0)", err, bytes.TrimSpace(out)))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the test hosts cannot take a remote build: %w", errors.Join(missing...))
	}
	return nil
}

// localBinScript builds the host's private /usr/local/bin in directory localbin (relative to
// the host's Dir): this machine's entries, as bind mounts (or the same links), and the
// stand-in as podman.
const localBinScript = `[ -d /usr/local/bin ] || { echo "no /usr/local/bin to shadow with the podman stand-in" >&2; exit 1; }
mkdir -p localbin
for e in /usr/local/bin/* /usr/local/bin/.[!.]*; do
	[ -e "$e" ] || [ -L "$e" ] || continue
	n=${e##*/}
	[ "$n" = podman ] && continue
	if [ -L "$e" ]; then ln -s "$(readlink "$e")" "localbin/$n"; continue; fi
	if [ -d "$e" ]; then mkdir -p "localbin/$n"; else : > "localbin/$n"; fi
	mount --bind "$e" "localbin/$n"
done
: > localbin/podman
mount --bind ` + podmanStandInFile + ` localbin/podman
mount --rbind localbin /usr/local/bin
`
