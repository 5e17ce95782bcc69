// Package deploy installs berth as users do: the image `make image` builds, config/default
// rendered by kustomize and applied to a real apiserver, the one file `make release` writes
// applied likewise, and the alerts of config/prometheus checked against the metrics berth really
// exports.
package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/repo"
)

// The kustomizations users apply.
const (
	defaultDir    = "config/default"
	clusterTasks  = "config/tasks/cluster"
	prometheusDir = "config/prometheus"
)

// repoRoot is the checkout's root.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// render builds a kustomization of the checkout as `kubectl apply -k` would.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	return renderDir(t, filepath.Join(repoRoot(t), dir))
}

// renderDir builds the kustomization in dir.
func renderDir(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range resources.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// renderOverlay renders an operator's overlay of the checkout's kustomizations: resources and
// components are directories of the checkout; images, the overlay's images entries.
func renderOverlay(t *testing.T, resources, components []string, images ...kustypes.Image) []*unstructured.Unstructured {
	t.Helper()
	overlay := t.TempDir()
	rel := func(dirs []string) []string {
		var out []string
		for _, dir := range dirs {
			p, err := filepath.Rel(overlay, filepath.Join(repoRoot(t), dir))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
		}
		return out
	}
	data, err := yaml.Marshal(kustypes.Kustomization{Resources: rel(resources), Components: rel(components), Images: images})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return renderDir(t, overlay)
}

// ofKind decodes every object of a kind into T (through JSON, so that the types' own decoding
// applies, as Tekton's params need).
func ofKind[T any](t *testing.T, objs []*unstructured.Unstructured, kind string) []T {
	t.Helper()
	var out []T
	for _, o := range objs {
		if o.GetKind() != kind {
			continue
		}
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		var v T
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatalf("%s %s: %v", kind, o.GetName(), err)
		}
		out = append(out, v)
	}
	return out
}

// makeImageRepository is the repository of the image `make image` builds when not told
// otherwise: the Makefile's IMG, which must tag it with the version (<repository>:$(VERSION)).
// The manifests in config/ name that repository untagged; a release or an overlay pins it.
func makeImageRepository(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^IMG \?= (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("the Makefile sets no IMG ?= <image>")
	}
	repository, ok := strings.CutSuffix(string(m[1]), ":$(VERSION)")
	if !ok || strings.ContainsAny(repository, "@$") {
		t.Fatalf("the Makefile's IMG is %s, want <repository>:$(VERSION): an image's tag says which version it is", m[1])
	}
	return repository
}

// berthContainer is a container of the shipped manifests that runs berth's image: the
// controller's, or a step of one of berth's Tasks with its stepTemplate applied.
type berthContainer struct {
	where string
	// step tells a Tekton step (whose values are Tekton's substitutions) from a Pod's container.
	step    bool
	image   string
	command []string
	args    []string
	script  string // a step's, which would need a shell
	// runAsNonRoot, readOnly, noEscalation and dropAll are what its security context asks.
	runAsNonRoot, readOnly, noEscalation, dropAll bool
	runAsUser                                     *int64
}

// berthContainers lists the containers of the Deployments and Tasks in objs.
func berthContainers(t *testing.T, objs []*unstructured.Unstructured) []berthContainer {
	t.Helper()
	var out []berthContainer
	for _, d := range ofKind[appsv1.Deployment](t, objs, "Deployment") {
		pod := d.Spec.Template.Spec
		for _, c := range pod.Containers {
			bc := berthContainer{where: fmt.Sprintf("Deployment %s, container %s", d.Name, c.Name), image: c.Image, command: c.Command, args: c.Args}
			if s := pod.SecurityContext; s != nil {
				bc.runAsNonRoot = s.RunAsNonRoot != nil && *s.RunAsNonRoot
				bc.runAsUser = s.RunAsUser
			}
			if s := c.SecurityContext; s != nil {
				if s.RunAsNonRoot != nil {
					bc.runAsNonRoot = *s.RunAsNonRoot
				}
				if s.RunAsUser != nil {
					bc.runAsUser = s.RunAsUser
				}
				bc.readOnly = s.ReadOnlyRootFilesystem != nil && *s.ReadOnlyRootFilesystem
				bc.noEscalation = s.AllowPrivilegeEscalation != nil && !*s.AllowPrivilegeEscalation
				bc.dropAll = s.Capabilities != nil && len(s.Capabilities.Drop) == 1 && s.Capabilities.Drop[0] == "ALL"
			}
			out = append(out, bc)
		}
	}
	for _, task := range ofKind[pipelinev1.Task](t, objs, "Task") {
		defaults := map[string]string{}
		for _, p := range task.Spec.Params {
			if p.Default != nil && p.Default.Type == pipelinev1.ParamTypeString {
				defaults["$(params."+p.Name+")"] = p.Default.StringVal
			}
		}
		for _, s := range task.Spec.Steps {
			bc := berthContainer{where: fmt.Sprintf("Task %s, step %s", task.Name, s.Name), step: true, image: s.Image, command: s.Command, args: s.Args, script: s.Script}
			sc := s.SecurityContext
			if tmpl := task.Spec.StepTemplate; tmpl != nil {
				if bc.image == "" {
					bc.image = tmpl.Image
				}
				if sc == nil {
					sc = tmpl.SecurityContext
				}
			}
			// A Task names berth's image outright, or as its param image, whose default the
			// shipped Pipelines keep.
			if v, ok := defaults[bc.image]; ok {
				bc.image = v
			}
			if sc != nil {
				bc.runAsNonRoot = sc.RunAsNonRoot != nil && *sc.RunAsNonRoot
				bc.runAsUser = sc.RunAsUser
				bc.readOnly = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
				bc.noEscalation = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
				bc.dropAll = sc.Capabilities != nil && len(sc.Capabilities.Drop) == 1 && sc.Capabilities.Drop[0] == "ALL"
			}
			out = append(out, bc)
		}
	}
	return out
}

// commandLine is what the container runs after the program's name: the subcommands (berth
// controller, berth host clean) and the names of the flags it passes.
func (c berthContainer) commandLine() (subcommands, flags []string) {
	argv := append(append([]string{}, c.command...), c.args...)
	if len(argv) > 0 {
		argv = argv[1:]
	}
	for _, a := range argv {
		switch {
		case a == "--":
			return subcommands, flags
		case strings.HasPrefix(a, "--"):
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			flags = append(flags, name)
		case len(flags) == 0 && !strings.HasPrefix(a, "-"):
			subcommands = append(subcommands, a)
		}
	}
	return subcommands, flags
}

// Every image the manifests run is the repository `make image` tags, untagged, so that the
// release's images entry (or an overlay's) pins every one of them and what users install is what
// the image test proves runs.
func TestManifestsRunTheImageMakeImageBuilds(t *testing.T) {
	want := makeImageRepository(t)
	var containers []berthContainer
	for _, dir := range []string{defaultDir, clusterTasks, konfluxDir} {
		containers = append(containers, berthContainers(t, render(t, dir))...)
	}
	if len(containers) == 0 {
		t.Fatal("no container in the manifests")
	}
	for _, c := range containers {
		if c.image != want {
			t.Errorf("%s runs %q, not %q (make image's repository, untagged)", c.where, c.image, want)
		}
	}
}

// An overlay's images entry, the usual way to install a build of one's own, renames berth's
// image in the Tasks' steps as well as in the Deployment.
func TestOverlayRenamesTheImageEverywhere(t *testing.T) {
	renamed := kustypes.Image{Name: makeImageRepository(t), NewName: "registry.example.com/berth", NewTag: "v1"}
	for _, c := range berthContainers(t, renderOverlay(t, []string{defaultDir}, nil, renamed)) {
		if c.image != "registry.example.com/berth:v1" {
			t.Errorf("%s still runs %s", c.where, c.image)
		}
	}
}
