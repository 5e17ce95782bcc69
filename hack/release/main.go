// Command release writes berth's install files: the kustomization config/release rendered into
// one file (and config/konflux, the Konflux layout, into a second), in the order kubectl applies it, with berth's image pinned by its version and by the
// manifest digest of the image archive `make release` saved beside it. `make release` runs it
// (go run ./hack/release); docs/install.md#release says what it makes.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/hack/release/ociarchive"
)

// configImage is the name config/ gives berth's image (the Deployment and the Tasks' steps),
// untagged: what installs is always pinned by a release or an overlay.
const configImage = "ghcr.io/berth-ci/berth"

func main() {
	image := flag.String("image", "", "the image the archive holds, <repository>:<version> (make release's IMG)")
	archive := flag.String("archive", "", "the image as an OCI archive (podman save --format oci-archive)")
	output := flag.String("output", "", "the install file to write")
	clusterTasks := flag.String("cluster-tasks-output", "", "where to write the tenants' ephemeral-cluster Tasks (config/tasks/cluster), their image param pinned")
	konflux := flag.String("konflux-output", "", "where to write the Konflux layout's install file (config/konflux)")
	config := flag.String("config", "config/release", "the kustomization to render")
	flag.Parse()
	if *image == "" || *archive == "" || *output == "" || *clusterTasks == "" || *konflux == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: release --image <repository>:<version> --archive <file>.oci.tar --output <file>.yaml --cluster-tasks-output <file>.yaml --konflux-output <file>.yaml [--config <dir>]")
		os.Exit(2)
	}
	if err := run(*image, *archive, *output, *clusterTasks, *konflux, *config); err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

func run(image, archive, output, clusterTasks, konflux, config string) error {
	repository, version, err := splitImage(image)
	if err != nil {
		return err
	}
	digest, err := ociarchive.ManifestDigest(archive, image)
	if err != nil {
		return err
	}
	pinned := kustypes.Image{Name: configImage, NewName: repository, NewTag: version, Digest: digest}
	rendered, err := render(config, pinned)
	if err != nil {
		return err
	}
	header := fmt.Sprintf("# berth %s, everything of it in one file (config/release).\n"+
		"# Needs Tekton Pipelines, cert-manager and the Prometheus Operator's CRDs; then:\n"+
		"#   kubectl apply --server-side -f %s\n"+
		"# Image: %s:%s@%s\n", version, filepath.Base(output), repository, version, digest)
	if err := writeFile(output, append([]byte(header), rendered...)); err != nil {
		return err
	}
	tasks, err := pinTaskImages(clusterTasksDir, fmt.Sprintf("%s:%s@%s", repository, version, digest))
	if err != nil {
		return err
	}
	tasksHeader := fmt.Sprintf("# berth %s: the Tasks integration pipelines use for ephemeral clusters (config/tasks/cluster).\n"+
		"# They run in a tenant's namespace:\n#   kubectl apply -n <namespace> -f %s\n", version, filepath.Base(clusterTasks))
	if err := writeFile(clusterTasks, append([]byte(tasksHeader), tasks...)); err != nil {
		return err
	}
	layout, err := render(konfluxDir, pinned)
	if err != nil {
		return err
	}
	konfluxHeader := fmt.Sprintf("# berth %s installed as Konflux installs the multi-platform controller (config/konflux):\n"+
		"# namespace multi-platform-controller, OpenShift's service CA. Needs Tekton Pipelines; then:\n"+
		"#   kubectl apply --server-side -f %s\n"+
		"# Image: %s:%s@%s\n", version, filepath.Base(konflux), repository, version, digest)
	if err := writeFile(konflux, append([]byte(konfluxHeader), layout...)); err != nil {
		return err
	}
	fmt.Printf("image archive  %s\ninstall file   %s\ncluster tasks  %s\nkonflux file   %s\nimage          %s:%s@%s\n", archive, output, clusterTasks, konflux, repository, version, digest)
	return nil
}

// konfluxDir is the Konflux layout, the release's second install file (docs/migrate-from-mpc.md).
const konfluxDir = "config/konflux"

// clusterTasksDir holds the Tasks tenants install in their own namespaces. Their steps run the
// image their param image names, so kustomize's images entry, which rewrites image fields, does
// not reach it: pinTaskImages sets the param's default.
const clusterTasksDir = "config/tasks/cluster"

// pinTaskImages renders dir and sets the default of every Task's param image to pinned.
func pinTaskImages(dir, pinned string) ([]byte, error) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []byte
	for _, r := range resources.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, err
		}
		if r.GetKind() == "Task" {
			params, _ := m["spec"].(map[string]any)["params"].([]any)
			found := false
			for _, p := range params {
				if p, ok := p.(map[string]any); ok && p["name"] == "image" {
					p["default"], found = pinned, true
				}
			}
			if !found {
				return nil, fmt.Errorf("%s: Task %s has no param image to pin", dir, r.GetName())
			}
		}
		data, err := yaml.Marshal(m)
		if err != nil {
			return nil, err
		}
		out = append(append(out, "---\n"...), data...)
	}
	return out, nil
}

// splitImage splits <repository>:<tag>; a registry's port is part of the repository.
func splitImage(image string) (repository, tag string, err error) {
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") || strings.Contains(image, "@") || i == len(image)-1 {
		return "", "", fmt.Errorf("image %q is not <repository>:<tag>", image)
	}
	return image[:i], image[i+1:], nil
}

// render builds config with an images entry that pins berth's image: an overlay of config in
// a temporary directory, as a user's overlay would be. Objects come in kustomize's legacy order,
// the one kubectl needs: the Namespace and CRDs first, the webhook registrations last.
func render(config string, pinned kustypes.Image) ([]byte, error) {
	abs, err := filepath.Abs(config)
	if err != nil {
		return nil, err
	}
	overlay, err := os.MkdirTemp("", "berth-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(overlay)
	base, err := filepath.Rel(overlay, abs)
	if err != nil {
		return nil, err
	}
	k := kustypes.Kustomization{
		TypeMeta:  kustypes.TypeMeta{APIVersion: kustypes.KustomizationVersion, Kind: kustypes.KustomizationKind},
		Resources: []string{base},
		Images:    []kustypes.Image{pinned},
	}
	data, err := yaml.Marshal(k)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), data, 0o644); err != nil {
		return nil, err
	}
	opts := krusty.MakeDefaultOptions()
	opts.Reorder = krusty.ReorderOptionLegacy
	resources, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", config, err)
	}
	return resources.AsYaml()
}

// writeFile replaces path whole, never leaving half a file behind.
func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
