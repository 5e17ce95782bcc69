package deploy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/missing"
)

// What the Containerfile puts in the image.
const (
	binaryPath = "usr/local/bin/berth"
	caPath     = "etc/ssl/certs/ca-certificates.crt"
)

// The image `make image` builds holds only berth's static binary and the CA bundle, runs as a
// numeric non-root user, and runs every command the shipped manifests give it, under their
// security contexts, as a container.
func TestImageRunsTheShippedCommands(t *testing.T) {
	needImageTools(t)
	root := repoRoot(t)
	name := fmt.Sprintf("localhost/berth-image-test:%d-%d", os.Getpid(), time.Now().UnixNano())
	build := exec.Command(filepath.Join(root, "hack", "image.sh"))
	build.Env = append(os.Environ(), "IMG="+name)
	var stderr bytes.Buffer
	build.Stderr = &stderr
	out, err := build.Output()
	if err != nil {
		t.Fatalf("hack/image.sh (make image): %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		if out, err := exec.Command("podman", "rmi", name).CombinedOutput(); err != nil {
			t.Logf("removing %s: %v: %s", name, err, out)
		}
	})
	// The ID, not the name, from here on: nothing else can have retagged it meanwhile.
	id := strings.TrimSpace(string(out))
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(id) {
		t.Fatalf("hack/image.sh printed %q, not an image ID", id)
	}

	img := saveImage(t, id)
	t.Run("config", func(t *testing.T) {
		if img.config.OS != "linux" || img.config.Architecture != runtime.GOARCH {
			t.Errorf("image for %s/%s, want linux/%s", img.config.OS, img.config.Architecture, runtime.GOARCH)
		}
		if want := []string{"/" + binaryPath}; !slices.Equal(img.config.Config.Entrypoint, want) {
			t.Errorf("entrypoint %q, want %q", img.config.Config.Entrypoint, want)
		}
		if uid, err := img.uid(); err != nil || uid == 0 {
			t.Errorf("user %q: want a numeric user other than root (%v)", img.config.Config.User, err)
		}
	})
	t.Run("files", func(t *testing.T) {
		var names []string
		for n := range img.files {
			names = append(names, n)
		}
		slices.Sort(names)
		if want := []string{caPath, binaryPath}; !slices.Equal(names, want) {
			t.Errorf("files %q, want only %q", names, want)
		}
		hostCA, err := os.ReadFile("/" + caPath)
		if err != nil {
			t.Fatal(err)
		}
		if ca, ok := img.files[caPath]; !ok || !bytes.Equal(ca.data, hostCA) {
			t.Errorf("/%s is not Debian's CA bundle of this machine", caPath)
		}
		bin, ok := img.files[binaryPath]
		if !ok {
			t.Fatalf("no /%s", binaryPath)
		}
		if bin.mode&0o001 == 0 {
			t.Errorf("/%s has mode %v: the image's user (not its owner) cannot run it", binaryPath, bin.mode)
		}
		f, err := elf.NewFile(bytes.NewReader(bin.data))
		if err != nil {
			t.Fatalf("/%s is not an ELF program: %v", binaryPath, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("/%s is dynamically linked: FROM scratch has no loader or libc (build with CGO_ENABLED=0)", binaryPath)
			}
		}
	})

	// The image's own entrypoint first: if it cannot even print its help, nothing else runs.
	help, err := runImage(t, id, berthContainer{}, []string{"--help"})
	if err != nil {
		t.Fatalf("%v\n%s", err, help)
	}
	containers := berthContainers(t, append(append(render(t, defaultDir), render(t, clusterTasks)...), konfluxOnly(t)...))
	for _, c := range containers {
		sub, _ := c.commandLine()
		if len(sub) > 0 && !regexp.MustCompile(`(?m)^\s+`+regexp.QuoteMeta(sub[0])+`\s`).MatchString(help) {
			t.Errorf("berth --help lists no command %s, which %s runs:\n%s", sub[0], c.where, help)
		}
	}
	for _, c := range containers {
		t.Run(c.where, func(t *testing.T) {
			if c.step && (c.script != "" || len(c.command) == 0) {
				t.Fatal("the step runs a script, or no command: the image has no shell, so a step must name berth as its command")
			}
			if c.runAsNonRoot && c.runAsUser == nil {
				if uid, err := img.uid(); err != nil || uid == 0 {
					t.Errorf("the kubelet would refuse to start it: runAsNonRoot, and the image's user %q is not a numeric non-root user", img.config.Config.User)
				}
			}
			sub, flags := c.commandLine()
			var out string
			var err error
			if !c.step {
				// As the kubelet starts it, with --help at the end: every flag must parse.
				out, err = runImage(t, id, c, append(slices.Clone(c.args), "--help"))
			} else {
				// A step's values are Tekton's substitutions; its command and flag names are
				// what must exist.
				c.args = nil
				c.command = append(c.command[:1:1], append(sub, "--help")...)
				out, err = runImage(t, id, c, nil)
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, f := range flags {
				if !regexp.MustCompile(`(?m)--` + regexp.QuoteMeta(f) + `(\s|$)`).MatchString(out) {
					t.Errorf("berth %s has no flag --%s:\n%s", strings.Join(sub, " "), f, out)
				}
			}
		})
	}
}

// needImageTools skips the test without what building and running the image takes, or fails
// it in CI (CI=true), which must never pass by skipping.
func needImageTools(t *testing.T) {
	t.Helper()
	var lacks []string
	if os.Geteuid() != 0 {
		lacks = append(lacks, "root (podman builds and runs the image rootful; run the tests as root, as CI does)")
	}
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			lacks = append(lacks, tool+" (make prereqs installs it as root, or apt-get install "+tool+")")
		}
	}
	if _, err := os.Stat("/" + caPath); err != nil {
		lacks = append(lacks, "/"+caPath+" (apt-get install ca-certificates)")
	}
	if len(lacks) == 0 {
		return
	}
	msg := "building and running berth's image needs " + strings.Join(lacks, ", ")
	missing.Skip(t, msg)
}

// runImage runs the image as the kubelet would run container c: its command (if any) in place
// of the entrypoint, then args, with its security context.
func runImage(t *testing.T, id string, c berthContainer, args []string) (string, error) {
	t.Helper()
	run := []string{"run", "--rm", "--pull=never", "--network=none",
		// Debian's podman defaults to crun, which cannot run a container where cgroups v1 and
		// v2 are mounted side by side; runc runs on every host.
		"--runtime=runc",
		// Rootful podman asks for a million open files and processes, which a machine (or
		// container) without CAP_SYS_RESOURCE cannot grant.
		"--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"}
	if c.readOnly {
		// As on a cluster: no tmpfs on /tmp unless the Pod mounts a volume there.
		run = append(run, "--read-only", "--read-only-tmpfs=false")
	}
	if c.noEscalation {
		run = append(run, "--security-opt=no-new-privileges")
	}
	if c.dropAll {
		run = append(run, "--cap-drop=all")
	}
	if c.runAsUser != nil {
		run = append(run, "--user="+strconv.FormatInt(*c.runAsUser, 10))
	}
	if len(c.command) > 0 {
		entrypoint, err := json.Marshal(c.command)
		if err != nil {
			t.Fatal(err)
		}
		run = append(run, "--entrypoint="+string(entrypoint))
	}
	run = append(append(run, id), args...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "podman", run...).CombinedOutput()
	if err != nil {
		err = fmt.Errorf("podman %s: %w", strings.Join(run, " "), err)
		if bytes.Contains(out, []byte("controller-runtime/pkg/internal/testing/addr")) {
			err = fmt.Errorf("%w\n(./cmd/berth links controller-runtime's envtest, whose init needs a writable /tmp, which neither the image nor a read-only root has: the test ground must stay out of the production binary)", err)
		}
	}
	return string(out), err
}

// savedImage is an image as `podman save` writes it: its config and the files of its layers.
type savedImage struct {
	config struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
		Config       struct {
			User       string   `json:"User"`
			Entrypoint []string `json:"Entrypoint"`
		} `json:"config"`
	}
	files map[string]imageFile // regular files by path, without the leading slash
}

type imageFile struct {
	mode os.FileMode
	data []byte
}

// uid is the numeric user the image runs as, as the kubelet reads it to check runAsNonRoot.
func (img *savedImage) uid() (int64, error) {
	user, _, _ := strings.Cut(img.config.Config.User, ":")
	if user == "" {
		return 0, nil // no USER: root
	}
	return strconv.ParseInt(user, 10, 64)
}

// saveImage writes the image as an OCI layout and reads it back: the standard form, so what
// is checked is what any registry or runtime gets.
func saveImage(t *testing.T, id string) *savedImage {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "oci")
	if out, err := exec.Command("podman", "save", "--quiet", "--format=oci-dir", "--output="+dir, id).CombinedOutput(); err != nil {
		t.Fatalf("podman save: %v: %s", err, out)
	}
	type descriptor struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
	}
	blob := func(d descriptor, into any) []byte {
		algorithm, hex, _ := strings.Cut(d.Digest, ":")
		data, err := os.ReadFile(filepath.Join(dir, "blobs", algorithm, hex))
		if err != nil {
			t.Fatal(err)
		}
		if into != nil {
			if err := json.Unmarshal(data, into); err != nil {
				t.Fatalf("%s: %v", d.Digest, err)
			}
		}
		return data
	}
	var index struct{ Manifests []descriptor }
	data, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json with one manifest expected: %v: %s", err, data)
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	blob(index.Manifests[0], &manifest)
	img := &savedImage{files: map[string]imageFile{}}
	blob(manifest.Config, &img.config)
	for _, l := range manifest.Layers {
		var r io.Reader = bytes.NewReader(blob(l, nil))
		if strings.HasSuffix(l.MediaType, "+gzip") {
			if r, err = gzip.NewReader(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := readLayer(r, img.files); err != nil {
			t.Fatalf("layer %s: %v", l.Digest, err)
		}
	}
	return img
}

// readLayer adds a layer's regular files to files (directories are not listed; the image's
// layers have no whiteouts, being FROM scratch).
func readLayer(r io.Reader, files map[string]imageFile) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		switch h.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			files[name] = imageFile{mode: h.FileInfo().Mode(), data: data}
		default:
			files[name] = imageFile{mode: h.FileInfo().Mode()} // listed, so that it shows as unexpected
		}
	}
}
