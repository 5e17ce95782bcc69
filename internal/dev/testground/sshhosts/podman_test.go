//go:build linux

package sshhosts

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/remote"
	"golang.org/x/crypto/ssh"
)

// standInUser makes a user on h whose home holds a build directory laid out as buildah-remote
// leaves it before `podman run` (sources, scripts, volumes, results), and who logs in with
// the fleet's admin key. It returns the user's name and build directory.
func standInUser(t *testing.T, f *Fleet, h *Host, name string) string {
	t.Helper()
	ctx := testContext(t)
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(f.AdminSigner.PublicKey())))
	script := `set -e
useradd -m -s /bin/bash "$1"
home=$(getent passwd "$1" | cut -d: -f6)
install -d -m 700 -o "$1" -g "$1" "$home/.ssh"
printf '%s\n' "$2" > "$home/.ssh/authorized_keys"
chown "$1": "$home/.ssh/authorized_keys"`
	line, err := remote.Script(script, name, pub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Run(ctx, line); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := h.Run(context.Background(), "pkill -KILL -u "+name+"; userdel -r "+name); err != nil {
			t.Errorf("leaving %s as found: %v", h.Name, err)
		}
	})
	layout := `set -e
b=~/build
mkdir -p $b/workspaces/source/source/sub $b/scripts $b/volumes/shared $b/results $b/.docker
printf 'FROM scratch\nCOPY . /\n' > $b/workspaces/source/source/Dockerfile
printf 'hello\n' > $b/workspaces/source/source/sub/greeting
printf '#!/bin/bash\necho the real script never runs here\n' > $b/scripts/script-build.sh
chmod +x $b/scripts/script-build.sh
echo $b`
	out, err := h.RunAs(ctx, name, f.AdminSigner, layout)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// podmanRun is the invocation buildah-remote makes, for build directory dir, with edit
// applied to its arguments.
func podmanRun(dir string, edit func([]string) []string) string {
	args := []string{"podman", "run", "--tmpfs", "/run/secrets",
		"-e", "IMAGE=registry.test/berth/app:v1", "-e", "SOURCE_CODE_DIR=source", "-e", "CONTEXT=.",
		"-e", "DOCKERFILE=./Dockerfile", "-e", "HOME=/root",
		"-v", dir + "/workspaces/source:/workspace/source:Z",
		"-v", dir + "/volumes/shared:/shared:Z",
		"-v", dir + "/.docker/:/root/.docker:Z",
		"-v", dir + "/results/:/tekton/results:Z",
		"-v", dir + "/scripts:/scripts:Z",
		"-v", "/var/lib/containers",
		"--user=0", "--rm", "--entrypoint=", "quay.test/builder@sha256:" + strings.Repeat("ab", 32),
		"/scripts/script-build.sh", "--build-args", "--envs"}
	if edit != nil {
		args = edit(args)
	}
	line, err := remote.Command(args...)
	if err != nil {
		panic(err)
	}
	return line
}

func without(drop ...string) func([]string) []string {
	return func(args []string) []string {
		var out []string
		for i := 0; i < len(args); i++ {
			switch {
			case args[i] == drop[0] && len(drop) == 1:
			case len(drop) == 2 && args[i] == drop[0] && i+1 < len(args) && args[i+1] == drop[1]:
				i++
			default:
				out = append(out, args[i])
			}
		}
		return out
	}
}

func replacing(old, new string) func([]string) []string {
	return func(args []string) []string {
		out := append([]string{}, args...)
		for i := range out {
			if out[i] == old {
				out[i] = new
			}
		}
		return out
	}
}

func TestPodmanStandInIsOnlyOnHosts(t *testing.T) {
	f := sharedFleet(t)
	ctx := testContext(t)
	if data, err := os.ReadFile(PodmanPath); err == nil && bytes.Equal(data, podmanStandIn) {
		t.Fatalf("this machine's %s is the stand-in", PodmanPath)
	}
	for _, h := range f.Hosts {
		out, err := h.Run(ctx, "command -v podman && command -v rsync && cat "+PodmanPath)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out, PodmanPath+"\n") || !strings.HasSuffix(out, string(podmanStandIn)) {
			t.Fatalf("%s: podman is not the stand-in, or rsync is missing: %.200q", h.Name, out)
		}
	}
	// The rest of this machine's /usr/local/bin stays visible on the hosts.
	entries, err := os.ReadDir("/usr/local/bin")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "podman" {
			continue
		}
		if _, err := f.Hosts[0].Run(ctx, "test -e /usr/local/bin/"+e.Name()+" || test -L /usr/local/bin/"+e.Name()); err != nil {
			t.Errorf("%s: /usr/local/bin/%s is hidden: %v", f.Hosts[0].Name, e.Name(), err)
		}
		break
	}
}

func TestPodmanStandInBuildsAsTheUser(t *testing.T) {
	if err := BuildPrerequisites(); err != nil {
		missing.Skip(t, err)
	}
	f := sharedFleet(t)
	h := f.Hosts[0]
	ctx := testContext(t)
	dir := standInUser(t, f, h, "standin")

	if _, err := h.RunAs(ctx, "standin", f.AdminSigner, podmanRun(dir, nil)); err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(h.HomeDir, strings.TrimPrefix(dir, "/home/"))
	read := func(rel string) string {
		data, err := os.ReadFile(filepath.Join(local, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	if got := read("volumes/shared/container_path"); got != "/shared/app-v1.oci\n" {
		t.Fatalf("container_path %q", got)
	}
	img, err := ReadImageLayout(filepath.Join(local, "volumes/shared/app-v1.oci"), "registry.test/berth/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if got := read("results/IMAGE_DIGEST"); got != img.Digest {
		t.Errorf("IMAGE_DIGEST %q, the layout's image is %s", got, img.Digest)
	}
	if got, want := read("results/IMAGE_REF"), "registry.test/berth/app:v1@"+img.Digest; got != want {
		t.Errorf("IMAGE_REF %q, want %q", got, want)
	}
	if got := read("results/IMAGE_URL"); got != "registry.test/berth/app:v1" {
		t.Errorf("IMAGE_URL %q", got)
	}
	if got := string(img.Files["src/sub/greeting"].Content); got != "hello\n" {
		t.Errorf("the image's /src/sub/greeting is %q; files: %v", got, img.Files)
	}
	if img.Labels["io.berth.podman-standin.user"] != "standin" || img.Labels["io.berth.podman-standin.containerfile"] != "source/Dockerfile" {
		t.Errorf("labels %v", img.Labels)
	}
	if log := read("podman-standin.log"); !strings.Contains(log, "as standin (uid ") {
		t.Errorf("the stand-in's log: %q", log)
	}

	// The layout is one buildah takes, as the 0.10 Task's `buildah pull oci:...` does.
	pull, err := remote.Script(`set -e
s=$(mktemp -d)
trap 'buildah unshare rm -rf "$s"' EXIT
buildah --storage-driver vfs --root "$s/root" --runroot "$s/run" pull --quiet "oci:$1/volumes/shared/app-v1.oci:$2"`, dir, "registry.test/berth/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h.RunAs(ctx, "standin", f.AdminSigner, pull); err != nil || len(strings.TrimSpace(out)) != 64 {
		t.Fatalf("buildah pull of the layout: %q, %v", out, err)
	}
}

func TestPodmanStandInRefusesWrongInvocations(t *testing.T) {
	if err := BuildPrerequisites(); err != nil {
		missing.Skip(t, err)
	}
	f := sharedFleet(t)
	h := f.Hosts[1]
	ctx := testContext(t)
	dir := standInUser(t, f, h, "standin2")

	for _, tc := range []struct {
		name  string
		line  string
		root  bool
		wants string
	}{
		{"as root", podmanRun(dir, nil), true, "called as root"},
		{"not run", "podman build .", false, "'podman build' is not supported"},
		{"no command", "podman run --rm quay.test/app:v1", false, "cannot know an image's own command"},
		{"no --user=0", podmanRun(dir, without("--user=0")), false, "--user=<none>"},
		{"an entrypoint", podmanRun(dir, replacing("--entrypoint=", "--entrypoint=/bin/sh")), false, "--entrypoint=/bin/sh"},
		{"no results mount", podmanRun(dir, without("-v", dir+"/results/:/tekton/results:Z")), false, "no -v ...:/tekton/results mount"},
		{"no workspace mount", podmanRun(dir, without("-v", dir+"/workspaces/source:/workspace/source:Z")), false, "workspaces/source:<workspace path>"},
		{"no image store", podmanRun(dir, without("-v", "/var/lib/containers")), false, "/var/lib/containers"},
		{"unsynced source", podmanRun(dir, replacing(dir+"/.docker/:/root/.docker:Z", dir+"/nothing:/x:Z")), false, "statfs " + dir + "/nothing: no such file"},
		{"outside the build dir", podmanRun(dir, replacing(dir+"/.docker/:/root/.docker:Z", "/etc:/x")), false, "outside the build directory"},
		{"unknown option", podmanRun(dir, replacing("--rm", "--net=host")), false, "unknown option --net=host"},
		{"env without value", podmanRun(dir, replacing("HOME=/root", "HOME")), false, "NAME=VALUE"},
		{"no IMAGE", podmanRun(dir, without("-e", "IMAGE=registry.test/berth/app:v1")), false, "no -e IMAGE="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.root {
				_, err = h.Run(ctx, tc.line)
			} else {
				_, err = h.RunAs(ctx, "standin2", f.AdminSigner, tc.line)
			}
			var exit *ssh.ExitError
			if !errors.As(err, &exit) || exit.ExitStatus() != 125 {
				t.Fatalf("%v; want exit status 125", err)
			}
			if !strings.Contains(err.Error(), "podman stand-in of berth test host") || !strings.Contains(err.Error(), tc.wants) {
				t.Fatalf("%v; want a message saying %q", err, tc.wants)
			}
		})
	}
	// The script is missing: the task never synced scripts/.
	if _, err := h.RunAs(ctx, "standin2", f.AdminSigner, "rm "+dir+"/scripts/script-build.sh"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.RunAs(ctx, "standin2", f.AdminSigner, podmanRun(dir, nil)); err == nil || !strings.Contains(err.Error(), "script-build.sh is missing") {
		t.Fatalf("without script-build.sh: %v", err)
	}
}

// Any command but buildah-remote's script-build.sh runs in a container, as rootless podman
// runs it: the build user is root there and its subordinate range the other ids, the
// container has its own hostname, sees only what podman gives it, and its exit status is
// podman's.
func TestPodmanStandInRunsContainers(t *testing.T) {
	if err := BuildPrerequisites(); err != nil {
		missing.Skip(t, err)
	}
	f := sharedFleet(t)
	h := f.Hosts[0]
	ctx := testContext(t)
	dir := standInUser(t, f, h, "standin3")
	local := filepath.Join(h.HomeDir, strings.TrimPrefix(dir, "/home/"))
	uid, err := h.Run(ctx, "id -u standin3")
	if err != nil {
		t.Fatal(err)
	}
	uid = strings.TrimSpace(uid)

	value := "it's \"quoted\" $HOME\nand a second line"
	inside := `set -e
id -u
tr -s ' ' < /proc/self/uid_map | sed 's/^ //' | paste -sd, -
uname -n
pwd
printf '%s|' "$(printf %s "$A" | base64 -w0)" "$HOME" "$container" "$1" "$2"; echo
if touch /shared/x 2>/dev/null; then echo shared writable; else echo shared read-only; fi
touch /var/lib/containers/x /run/secrets/x /tekton/results/out
grep -c . /etc/passwd >/dev/null
ls /home
exit 7`
	line, err := remote.Command("podman", "run", "--rm", "--tmpfs", "/run/secrets", "-e", "A="+value,
		"-v", dir+"/workspaces/source:/workspace/source:Z",
		"-v", dir+"/volumes/shared:/shared:ro,Z",
		"-v", dir+"/results:/tekton/results:Z",
		"-v", "/var/lib/containers",
		"--workdir", "/workspace/source/new dir",
		"quay.test/app@sha256:"+strings.Repeat("cd", 32), "/bin/sh", "-c", inside, "sh", "one arg", "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.RunAs(ctx, "standin3", f.AdminSigner, line)
	var exit *ssh.ExitError
	if !errors.As(err, &exit) || exit.ExitStatus() != 7 {
		t.Fatalf("%v; want the container's exit status 7\n%s", err, out)
	}
	lines := strings.Split(out, "\n")
	if len(lines) < 6 {
		t.Fatalf("output %q", out)
	}
	if lines[0] != "0" {
		t.Errorf("id -u in the container: %s, want 0", lines[0])
	}
	if !strings.HasPrefix(lines[1], "0 "+uid+" 1,1 ") {
		t.Errorf("uid map %q: want root as %s (standin3) and its subordinate range after", lines[1], uid)
	}
	if lines[2] == h.Name || len(lines[2]) != 12 {
		t.Errorf("hostname %q: want a container id of its own", lines[2])
	}
	if lines[3] != "/workspace/source/new dir" {
		t.Errorf("working directory %q", lines[3])
	}
	if want := base64.StdEncoding.EncodeToString([]byte(value)) + "|/root|podman|one arg||"; lines[4] != want {
		t.Errorf("env and args %q, want %q", lines[4], want)
	}
	if lines[5] != "shared read-only" {
		t.Errorf("the :ro mount: %s", lines[5])
	}
	if got := lines[6]; got != "" {
		t.Errorf("/home of the container holds %q; want it empty", got)
	}
	info, err := os.Stat(filepath.Join(local, "results", "out"))
	if err != nil {
		t.Fatal(err)
	}
	if owner := fmt.Sprint(info.Sys().(*syscall.Stat_t).Uid); owner != uid {
		t.Errorf("a file the container's root wrote belongs to uid %s, want %s (standin3)", owner, uid)
	}
	log, err := os.ReadFile(filepath.Join(h.HomeDir, "standin3", "podman-standin.log"))
	if err != nil || !strings.Contains(string(log), "ran quay.test/app@sha256:"+strings.Repeat("cd", 32)+" /bin/sh -c") || !strings.Contains(string(log), "as standin3 (uid "+uid+")") {
		t.Errorf("the stand-in's log: %q, %v", log, err)
	}

	for _, tc := range []struct{ name, option, wants string }{
		{"privileged", "--privileged", "--privileged: not supported"},
		{"a user name", "--user=builder", "numeric uid"},
		{"a volume option", "--volume=" + dir + "/results:/r:U", "option U is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.RunAs(ctx, "standin3", f.AdminSigner, "podman run "+tc.option+" quay.test/app:v1 /bin/true")
			if !errors.As(err, &exit) || exit.ExitStatus() != 125 || !strings.Contains(err.Error(), tc.wants) {
				t.Fatalf("%v; want exit status 125 and a message saying %q", err, tc.wants)
			}
		})
	}
	// A container may run as another id of the mapping.
	if out, err := h.RunAs(ctx, "standin3", f.AdminSigner, "podman run --user 1000:1000 quay.test/app:v1 id -u"); err != nil || out != "1000\n" {
		t.Errorf("--user 1000:1000: %q, %v", out, err)
	}
}
