// Package realdata finds the deployment data real clusters run with (../shared/real beside the
// repository: host-config ConfigMaps, Helm values, CRDs) for tests that must prove berth serves
// what it describes. It never edits them; tests derive their variants in memory.
package realdata

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/testground/repo"
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
