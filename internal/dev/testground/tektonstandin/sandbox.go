package tektonstandin

import (
	"context"
	_ "embed"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// retryTool stands in for the /usr/bin/retry of Konflux's task images; see tools/retry.
//
//go:embed tools/retry
var retryTool []byte

// buildahFront stands in front of Debian's buildah so that it names images as the task images'
// newer buildah does; see tools/buildah.
//
//go:embed tools/buildah
var buildahFront []byte

// realBuildah is where a step finds Debian's own buildah behind the front.
const realBuildah = "/usr/libexec/tekton-standin/buildah"

// sandbox is one step's view of the machine, built as a container runtime builds a
// container's: the step runs in its own mount and PID namespaces, chrooted into an overlay of
// the machine's root filesystem whose writes land in the sandbox's own directory. So a script
// that writes /etc/passwd, /root/.ssh or /usr/bin changes a private copy and nothing on the
// machine; /root, /home, /tmp, /var/tmp, /run and /dev/shm start empty, as in an image; the
// pod's volumes, workspaces and /tekton are bind-mounted in; and every process the step left
// behind dies with it. The step shares the machine's network, which is how it reaches the
// test ground's SSH hosts.
type sandbox struct {
	dir        string         // scratch space: the overlay's layers and the private directories
	mounts     []sandboxMount // the pod's mounts; parents are mounted before their children
	workingDir string         // "" for /
	env        []string
}

type sandboxMount struct {
	source, target string
	readOnly       bool
}

// privateDirs start empty in every step, as they would in a container image.
var privateDirs = []struct {
	path string
	mode os.FileMode
}{
	{"/root", 0o700}, {"/home", 0o755}, {"/tmp", 0o1777}, {"/var/tmp", 0o1777}, {"/run", 0o755},
}

// sandboxScript builds the sandbox inside the new namespaces and execs the step. Paths travel
// as arguments, never inside the shell text. Mount points are created and resolved inside the
// chroot, so a symlink in the image (/var/run → /run) can never lead a mount out to the
// machine. Before the step starts, the credentials under /tekton/creds are copied to $HOME,
// as Tekton's entrypoint does.
const sandboxScript = `set -eu
root=$1 upper=$2 work=$3
shift 3
mount -t overlay standin-step -o "lowerdir=/,upperdir=$upper,workdir=$work" "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
mount --rbind /sys "$root/sys"
while [ "$1" != -- ]; do
	src=$1 dst=$2 mode=$3
	shift 3
	if [ -d "$src" ]; then
		chroot "$root" mkdir -p -- "$dst"
	else
		chroot "$root" /bin/sh -c 'mkdir -p -- "$(dirname -- "$1")" && { [ -e "$1" ] || : >"$1"; }' mkfile "$dst"
	fi
	at=$root$(chroot "$root" readlink -f -- "$dst")
	mount --bind "$src" "$at"
	if [ "$mode" = ro ]; then mount -o remount,bind,ro "$at"; fi
done
shift
exec chroot "$root" /bin/sh -c '
	dir=$1
	shift
	if [ -n "${HOME:-}" ] && [ -n "$(ls -A /tekton/creds 2>/dev/null)" ]; then
		mkdir -p -- "$HOME" && cp -a /tekton/creds/. "$HOME"/
	fi
	mkdir -p -- "$dir" && cd -- "$dir" && exec "$@"' step "$@"
`

// run runs argv in the sandbox and returns its exit code.
func (sb *sandbox) run(ctx context.Context, argv []string, out io.Writer) (int, error) {
	if err := os.MkdirAll(sb.dir, 0o700); err != nil {
		return -1, err
	}
	defer os.RemoveAll(sb.dir)
	root, upper, work := filepath.Join(sb.dir, "root"), filepath.Join(sb.dir, "upper"), filepath.Join(sb.dir, "work")
	for _, d := range []string{root, upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return -1, err
		}
	}
	args := []string{"-c", sandboxScript, "tekton-standin-step", root, upper, work}
	for _, p := range privateDirs {
		dir := filepath.Join(sb.dir, "private", strings.ReplaceAll(strings.TrimPrefix(p.path, "/"), "/", "-"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return -1, err
		}
		if err := os.Chmod(dir, p.mode); err != nil {
			return -1, err
		}
		args = append(args, dir, p.path, "rw")
	}
	mounts := append([]sandboxMount(nil), sb.mounts...)
	sort.SliceStable(mounts, func(i, j int) bool { return depth(mounts[i].target) < depth(mounts[j].target) })
	tool := filepath.Join(sb.dir, "retry")
	if err := writeFile(tool, retryTool, 0o755); err != nil {
		return -1, err
	}
	mounts = append(mounts, sandboxMount{source: tool, target: "/usr/bin/retry", readOnly: true})
	if real, err := exec.LookPath("buildah"); err == nil {
		front := filepath.Join(sb.dir, "buildah")
		if err := writeFile(front, buildahFront, 0o755); err != nil {
			return -1, err
		}
		mounts = append(mounts, sandboxMount{source: real, target: realBuildah, readOnly: true},
			sandboxMount{source: front, target: "/usr/bin/buildah", readOnly: true})
	}
	for _, m := range mounts {
		if !filepath.IsAbs(m.target) || filepath.Clean(m.target) == "/" {
			return -1, invalid("mount path %q must be an absolute path below /", m.target)
		}
		mode := "rw"
		if m.readOnly {
			mode = "ro"
		}
		args = append(args, m.source, filepath.Clean(m.target), mode)
	}
	dir := sb.workingDir
	if dir == "" {
		dir = "/"
	}
	args = append(append(args, "--", dir), argv...)

	cmd := exec.CommandContext(ctx, "/bin/sh", args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = sb.env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:   syscall.CLONE_NEWPID, // the step is PID 1: its leftovers die with it
		Unshareflags: syscall.CLONE_NEWNS,  // Go makes / private in it, so no mount leaks out
		Setpgid:      true,
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if status, ok := exit.Sys().(syscall.WaitStatus); ok && status.Signaled() {
			return 128 + int(status.Signal()), err
		}
		return exit.ExitCode(), err
	}
	if err != nil {
		return -1, err
	}
	return 0, nil
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }
