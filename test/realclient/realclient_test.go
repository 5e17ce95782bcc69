// Package realclient_test holds berth to the contract as its real clients use it: the build
// step of the buildah-remote Tasks (testdata/build-step.sh does what that step does) reads
// the secret berth's controller made, and with OpenSSH's ssh and rsync builds on a real sshd
// host as the build user: sources synced to the user-dir, podman run there (the test hosts'
// podman stand-in, which checks the invocation and builds a real image), results synced back.
// The real buildah-remote 0.10 Task itself, unmodified, runs too (realtask_test.go), through
// the Tekton stand-in on a static host and on a VM.
package realclient_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/remote"
)

var stack *devstack.Stack

const (
	remotePlatform = "linux/arm64"
	localPlatform  = "linux/x86_64" // as production configs list it in local-platforms
	image          = "registry.test/team/app:v1"
	builderImage   = "quay.test/konflux-ci/buildah-task@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// TestMain starts the local VM cloud too: the real Task also builds on a VM launched for it.
func TestMain(m *testing.M) {
	os.Exit(stacktest.MainWith(m, &stack, 1, stacktest.Options(), func(d *devstack.Options) { d.VMCloud = true }))
}

func TestErrorIsPrintedAndTheStepFails(t *testing.T) {
	tr := newTaskRun(t, "linux/riscv64")
	secret := stacktest.SecretOf(t, admin(), tr)
	if len(secret.Data["error"]) == 0 {
		t.Fatalf("the secret of an unconfigured platform has no error: %v", keys(secret))
	}
	p := newPod(t, secret)
	out, err := p.buildStep(t, "newest")
	if err == nil {
		t.Fatalf("the build step succeeded on an error secret:\n%s", out)
	}
	if !strings.Contains(out, string(secret.Data["error"])) || !strings.Contains(out, `platform "linux/riscv64" is not configured`) {
		t.Fatalf("the step did not print berth's error %q:\n%s", secret.Data["error"], out)
	}
	if strings.Contains(out, "rsync data") {
		t.Fatalf("the step went on after the error:\n%s", out)
	}
	finish(t, tr)
}

func TestLocalPlatformBuildsInThePod(t *testing.T) {
	tr := newTaskRun(t, localPlatform)
	secret := stacktest.SecretOf(t, admin(), tr)
	if string(secret.Data["host"]) != contract.Localhost || len(secret.Data) != 1 {
		t.Fatalf("the secret of a local platform: %v", keys(secret))
	}
	p := newPod(t, secret)
	out, err := p.buildStep(t, "newest")
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if !strings.Contains(out, "localhost: building in the pod") || strings.Contains(out, "rsync data") {
		t.Fatalf("the step did not take the local path:\n%s", out)
	}
	if got := p.read(t, p.results, "IMAGE_URL"); got != "built in the pod" {
		t.Fatalf("the local build's result: %q", got)
	}
	finish(t, tr)
}

// TestRemoteBuildRoundTrips runs the build step of both Task versions against a build user
// berth made: everything the step sends reaches the host, the build runs there as that user,
// and what it leaves comes back.
func TestRemoteBuildRoundTrips(t *testing.T) {
	if err := sshhosts.BuildPrerequisites(); err != nil {
		missing.Skip(t, err)
	}
	for _, variant := range []string{"0.10", "newest"} {
		t.Run(variant, func(t *testing.T) {
			tr := newTaskRun(t, remotePlatform)
			secret := stacktest.SecretOf(t, admin(), tr)
			if msg := secret.Data["error"]; len(msg) > 0 {
				t.Fatalf("error secret: %s", msg)
			}
			user, address, ok := strings.Cut(string(secret.Data["host"]), "@")
			h := stack.Fleet.Hosts[0]
			if !ok || address != h.Address || !strings.HasPrefix(user, "u-") {
				t.Fatalf("secret host %q, want u-...@%s", secret.Data["host"], h.Address)
			}
			buildDir := string(secret.Data["user-dir"])
			p := newPod(t, secret)

			out, err := p.buildStep(t, variant)
			if err != nil {
				t.Fatalf("the build step: %v:\n%s", err, out)
			}
			if !strings.Contains(out, "Build on remote host "+user+"@"+address+" finished") {
				t.Fatalf("the step did not finish the remote path:\n%s", out)
			}

			// Results and image came back, and the image holds exactly the sources sent.
			digest := p.read(t, p.results, "IMAGE_DIGEST")
			if got := p.read(t, p.results, "IMAGE_URL"); got != image {
				t.Errorf("IMAGE_URL %q, want %q", got, image)
			}
			if got := p.read(t, p.results, "IMAGE_REF"); got != image+"@"+digest {
				t.Errorf("IMAGE_REF %q, want %s@%s", got, image, digest)
			}
			containerPath := strings.TrimSpace(p.read(t, p.shared, "container_path"))
			layout, ok := strings.CutPrefix(containerPath, "/shared/")
			if !ok {
				t.Fatalf("container_path %q is not in /shared", containerPath)
			}
			img, err := sshhosts.ReadImageLayout(filepath.Join(p.shared, layout), image)
			if err != nil {
				t.Fatal(err)
			}
			if img.Digest != digest {
				t.Errorf("IMAGE_DIGEST %s, but the synced layout's image is %s", digest, img.Digest)
			}
			p.sourcesAreIn(t, img)
			if img.Labels["io.berth.podman-standin.user"] != user || img.Labels["io.berth.podman-standin.uid"] == "0" ||
				img.Labels["io.berth.podman-standin.builder-image"] != builderImage {
				t.Errorf("the image was not built by %s from the task's builder image: labels %v", user, img.Labels)
			}

			// On the host: the build ran as the build user, in its user-dir, with the step's
			// arguments intact.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			check, err := remote.Script(`cd "$1" && stat -c %U results/IMAGE_DIGEST volumes/shared/container_path && cat podman-standin.log && if [ -e usr/bin/retry ]; then cat usr/bin/retry; fi`, buildDir)
			if err != nil {
				t.Fatal(err)
			}
			onHost, err := h.Run(ctx, check)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{user + "\n" + user + "\n", "as " + user + " (uid ",
				"in place of " + builderImage + " /scripts/script-build.sh --build-args GREETING=hello world --envs --labels --annotations"}
			if variant == "0.10" {
				want = append(want, "the step image's retry")
			}
			for _, w := range want {
				if !strings.Contains(onHost, w) {
					t.Errorf("on the host, %s holds no %q:\n%s", buildDir, w, onHost)
				}
			}

			// The task ends: berth removes the user with everything it had on the host, and
			// then its record.
			finish(t, tr)
			stacktest.Eventually(t, "berth's record of "+tr.Name+" is gone", func() (bool, error) {
				err := admin().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(tr.UID)}, &berthv1.Allocation{})
				return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
			})
			if users, err := h.BuildUsers(context.Background()); err != nil || len(users) > 0 {
				t.Errorf("build users left on %s: %v %v", h.Name, users, err)
			}
			for _, f := range []string{"subuid", "subgid"} {
				data, err := os.ReadFile(filepath.Join(h.EtcDir, f))
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Contains(data, []byte(user+":")) {
					t.Errorf("/etc/%s of %s still gives %s a range", f, h.Name, user)
				}
			}
		})
	}
}

// pod is what the build step's pod has: the secret volume, the source workspace, /shared,
// /tekton/results, root's home, and a tool of the step image.
type pod struct {
	root, secret, workspace, shared, results, empty, tool string
}

func newPod(t *testing.T, secret *corev1.Secret) *pod {
	t.Helper()
	base := t.TempDir()
	p := &pod{}
	for _, d := range []struct {
		field *string
		name  string
	}{{&p.root, "root"}, {&p.secret, "ssh"}, {&p.workspace, "workspace"}, {&p.shared, "shared"}, {&p.results, "results"}, {&p.empty, "empty"}} {
		*d.field = filepath.Join(base, d.name)
		if err := os.Mkdir(*d.field, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range secret.Data {
		write(t, filepath.Join(p.secret, k), string(v), 0o400)
	}
	write(t, filepath.Join(p.root, ".docker", "config.json"), `{"auths":{}}`, 0o600)
	p.tool = filepath.Join(base, "retry")
	write(t, p.tool, "#!/bin/sh\n# the step image's retry\nexec \"$@\"\n", 0o755)

	src := filepath.Join(p.workspace, "source")
	write(t, filepath.Join(src, "Dockerfile"), "FROM scratch\nCOPY . /\n", 0o644)
	write(t, filepath.Join(src, "app", "main.go"), "package main\n\nfunc main() {}\n", 0o644)
	write(t, filepath.Join(src, "bin", "run.sh"), "#!/bin/sh\necho run\n", 0o755)
	write(t, filepath.Join(src, "docs", "a file with spaces & 'quotes'.txt"), "text\n", 0o600)
	write(t, filepath.Join(src, ".hidden"), "dot\n", 0o644)
	if err := os.Symlink("app/main.go", filepath.Join(src, "main-link")); err != nil {
		t.Fatal(err)
	}
	return p
}

func write(t *testing.T, path, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func (p *pod) read(t *testing.T, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// buildStep runs testdata/build-step.sh as the Task's variant would, as root in a mount
// namespace whose /root is the pod's, and returns its output.
func (p *pod) buildStep(t *testing.T, variant string) (string, error) {
	t.Helper()
	script, err := filepath.Abs("testdata/build-step.sh")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "--",
		"bash", "-c", `mount --bind "$1" /root && cd "$2" && shift 2 && exec bash "$@"`, "pod", p.root, p.workspace,
		script, "--build-args", "GREETING=hello world", "--envs", "--labels", "--annotations")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=/root", "LANG=C.UTF-8",
		"SECRET=" + p.secret, "WORKSPACE=" + p.workspace, "SHARED=" + p.shared, "RESULTS=" + p.results,
		"EMPTY=" + p.empty, "TOOL=" + p.tool, "VARIANT=" + variant,
		"IMAGE=" + image, "BUILDER_IMAGE=" + builderImage, "SOURCE_URL=https://git.test/team/app it's",
		"SOURCE_CODE_DIR=source", "CONTEXT=.", "DOCKERFILE=./Dockerfile", "STORAGE_DRIVER=vfs",
		"HERMETIC=false", "TLSVERIFY=true", "BUILDAH_HTTP_PROXY=",
	}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return string(out), err
}

// sourcesAreIn checks that every file and link of the source tree is in img under /src with
// its content and mode: what rsync -a sent is what the build saw.
func (p *pod) sourcesAreIn(t *testing.T, img *sshhosts.Image) {
	t.Helper()
	src := filepath.Join(p.workspace, "source")
	n := 0
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		inImage := "src/" + rel
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		n++
		if info.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			if img.Links[inImage] != target {
				t.Errorf("link %s: %q in the image, want %q", rel, img.Links[inImage], target)
			}
			return nil
		}
		want, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		got, ok := img.Files[inImage]
		switch {
		case !ok:
			t.Errorf("%s is not in the image", rel)
		case !bytes.Equal(got.Content, want):
			t.Errorf("%s: %q in the image, want %q", rel, got.Content, want)
		case got.Mode.Perm() != info.Mode().Perm():
			t.Errorf("%s: mode %v in the image, want %v", rel, got.Mode.Perm(), info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 6 {
		t.Fatalf("only %d files in the source tree: the comparison proves little", n)
	}
}

// newTaskRun creates a TaskRun as buildah-remote makes them (PLATFORM, the secret volume) in
// a namespace of the test's own, with the host config in force.
func newTaskRun(t *testing.T, platform string) *pipelinev1.TaskRun {
	t.Helper()
	applyConfig(t)
	ctx := context.Background()
	ns := strings.ToLower(strings.NewReplacer("Test", "", "/", "-", ".", "").Replace(t.Name()))
	if len(ns) > 50 {
		ns = ns[:50]
	}
	if err := stack.ControlPlane.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stacktest.FinishAllOnFailure(t, stack, ns) })
	optional := false
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "build", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Steps: []pipelinev1.Step{{Name: "build", Image: builderImage,
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + "build", Optional: &optional}}}},
			},
		},
	}
	if err := admin().Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

// applyConfig puts in force one static host for remotePlatform and localPlatform as local.
func applyConfig(t *testing.T) {
	t.Helper()
	stacktest.ApplyConfig(t, stack, stack.StaticHostConfig(remotePlatform, 2, localPlatform))
}

func finish(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(tr), nil); err != nil {
		t.Fatal(err)
	}
}

func admin() client.Client { return stack.ControlPlane.Client }

func keys(s *corev1.Secret) []string {
	var k []string
	for name := range s.Data {
		k = append(k, name)
	}
	return k
}
