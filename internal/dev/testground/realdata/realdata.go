// Package realdata finds the deployment data real clusters run with (../shared/real beside the
// repository: host-config ConfigMaps, Helm values, CRDs, the client Tasks) for tests that must
// prove berth serves what it describes. It never edits them; tests derive their variants in
// memory.
package realdata

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/repo"
)

// Dir is ../shared/real beside the repository, or an error saying where it was looked for.
func Dir() (string, error) {
	dir, err := sharedReal()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "host-config")); err != nil {
		return "", fmt.Errorf("the real deployment data is missing: want %s (../shared/real beside the repository): %w", dir, err)
	}
	return dir, nil
}

// CRDDir is ../shared/real/crds: the CustomResourceDefinitions of the services berth's
// ephemeral clusters come from (cluster templates, space requests), as they publish them. Its
// error names where it looked.
func CRDDir() (string, error) {
	dir, err := sharedReal()
	if err != nil {
		return "", err
	}
	dir = filepath.Join(dir, "crds")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("the real CRDs are missing: want %s (../shared/real/crds beside the repository): %w", dir, err)
	}
	return dir, nil
}

// Task reads one of the real client Tasks or StepActions under tasks/ (file is its name
// there, like buildah-remote-0.10.yaml) as the object `kubectl apply -f` would create from
// it: unchanged, with no namespace of its own. Its error names where it looked.
func Task(file string) (*unstructured.Unstructured, error) {
	dir, err := sharedReal()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "tasks", file)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the real client Task is missing: want %s (../shared/real/tasks beside the repository): %w", path, err)
	}
	doc, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if kind := obj.GetKind(); kind != "Task" && kind != "StepAction" {
		return nil, fmt.Errorf("%s: kind %q, want Task or StepAction", path, kind)
	}
	return obj, nil
}

// File reads a file of ../shared/real by its path there (like o11y/prometheus.multi_platform_alerts.yaml
// or README.md). Its error names where it looked.
func File(rel string) ([]byte, error) {
	dir, err := sharedReal()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, filepath.FromSlash(rel))
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the real file is missing: want %s (../shared/real beside the repository): %w", path, err)
	}
	return raw, nil
}

func sharedReal() (string, error) {
	root, err := repo.Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(root), "shared", "real"), nil
}

// HostConfig is one real host-config ConfigMap.
type HostConfig struct {
	// Name is the file's path under host-config/, like production/staging.host-config.yaml.
	Name string
	Path string
	Data map[string]string
}

// HostConfigs reads every ConfigMap under host-config/, sorted by name.
func HostConfigs() ([]HostConfig, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "host-config")
	var out []HostConfig
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var cm struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal(raw, &cm); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if cm.Kind != "ConfigMap" {
			return fmt.Errorf("%s: kind %q, want ConfigMap", path, cm.Kind)
		}
		rel, _ := filepath.Rel(root, path)
		out = append(out, HostConfig{Name: rel, Path: path, Data: cm.Data})
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("no ConfigMap under %s", root)
	}
	return out, err
}

// BareListed are the platforms a dynamic list of the config names with no
// dynamic.<platform>.* key at all, sorted: the only ones ../shared/real/README.md lets be
// unusable. They are read from the file, so a newly rendered cluster (the chart lists
// linux-g4xlarge/amd64 without a block for it) needs no entry in any test.
func (h HostConfig) BareListed() []string {
	var bare []string
	for _, list := range []string{"dynamic-platforms", "dynamic-pool-platforms"} {
		for _, name := range strings.Split(h.Data[list], ",") {
			p := strings.TrimSpace(name)
			if p == "" || slices.Contains(bare, p) {
				continue
			}
			// A platform's keys write its "/" as "-" (CONTRACT.md).
			prefix := "dynamic." + strings.ReplaceAll(p, "/", "-") + "."
			if !slices.ContainsFunc(slices.Collect(maps.Keys(h.Data)), func(k string) bool { return strings.HasPrefix(k, prefix) }) {
				bare = append(bare, p)
			}
		}
	}
	slices.Sort(bare)
	return bare
}
