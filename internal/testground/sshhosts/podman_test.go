//go:build linux

package sshhosts

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		skipOrFail(t, err)
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
		skipOrFail(t, err)
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
		{"no --user=0", podmanRun(dir, without("--user=0")), false, "--user=<none>"},
		{"an entrypoint", podmanRun(dir, replacing("--entrypoint=", "--entrypoint=/bin/sh")), false, "--entrypoint=/bin/sh"},
		{"another command", podmanRun(dir, replacing("/scripts/script-build.sh", "/bin/true")), false, "command /bin/true"},
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
