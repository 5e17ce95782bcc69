// Package rbac applies the RBAC berth ships (config/rbac) to a test control plane, so tests
// can run a component as its ServiceAccount and hold it to exactly those permissions: a rule
// the code needs but the manifests lack fails a test instead of a production cluster.
package rbac

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// ShippedNamespace is the namespace the manifests name; Apply moves everything there to the
// namespace it is given.
const ShippedNamespace = "berth-system"

// Dir is config/rbac relative to the repository root.
const Dir = "config/rbac"

// kinds are the kinds Apply keeps, in the order it creates them (identities and roles before
// the bindings that refer to them), each with whether its objects live in a namespace.
var kinds = []struct {
	name       string
	namespaced bool
}{
	{"ServiceAccount", true},
	{"ClusterRole", false},
	{"Role", true},
	{"ClusterRoleBinding", false},
	{"RoleBinding", true},
}

// Manifest is one RBAC object as written in config/rbac.
type Manifest struct {
	// File is the path it was read from, for messages.
	File   string
	Object *unstructured.Unstructured
}

func (m Manifest) String() string {
	return fmt.Sprintf("%s %s from %s", m.Object.GetKind(), client.ObjectKeyFromObject(m.Object), m.File)
}

// Apply creates (or updates) the ServiceAccounts, Roles, ClusterRoles, RoleBindings and
// ClusterRoleBindings in config/rbac, with berth-system replaced by namespace in namespaced
// objects and in binding subjects. It creates namespace if missing. c needs cluster-admin
// rights: granting a role takes holding its permissions.
//
// ClusterRoles and ClusterRoleBindings are cluster-wide and keep their shipped names, so
// applying into a second namespace of the same control plane moves the cluster-wide grants to
// that namespace's ServiceAccounts: use one namespace per control plane.
func Apply(ctx context.Context, c client.Client, namespace string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	manifests, err := Load(filepath.Join(root, Dir))
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{}
	ns.Name = namespace
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	for _, m := range manifests {
		if err := retarget(m.Object, namespace); err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		if err := createOrUpdate(ctx, c, m.Object); err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
	}
	return nil
}

// Load reads every YAML document of the .yaml/.yml files in dir and returns the RBAC objects
// among them (see kinds) in the order they should be created, as written. Other documents
// (the kustomization) are skipped.
func Load(dir string) ([]Manifest, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the RBAC manifests: %w", err)
	}
	rank := map[string]int{}
	for i, k := range kinds {
		rank[k.name] = i
	}
	var manifests []Manifest
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		path := filepath.Join(dir, name)
		objs, err := decodeFile(path)
		if err != nil {
			return nil, err
		}
		for _, obj := range objs {
			if _, ok := rank[obj.GetKind()]; ok {
				manifests = append(manifests, Manifest{File: path, Object: obj})
			}
		}
	}
	// Stable, so objects of one kind keep the order of the files.
	sort.SliceStable(manifests, func(i, j int) bool {
		return rank[manifests[i].Object.GetKind()] < rank[manifests[j].Object.GetKind()]
	})
	return manifests, nil
}

// decodeFile returns every non-empty YAML document of a file.
func decodeFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for i := 1; ; i++ {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decoding document %d of %s: %w", i, path, err)
		}
		// A document holding only comments, or a stray `---`, decodes to nothing.
		if len(obj.Object) == 0 {
			continue
		}
		if obj.GetKind() == "" || obj.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document %d of %s has no kind or apiVersion", i, path)
		}
		objs = append(objs, obj)
	}
}

// retarget moves a namespaced object and the ServiceAccount subjects of a binding from the
// shipped namespace to namespace. A namespaced object without a namespace counts as in the
// shipped one, where config/default's `namespace:` would put it.
func retarget(obj *unstructured.Unstructured, namespace string) error {
	for _, k := range kinds {
		if k.name == obj.GetKind() && k.namespaced {
			if ns := obj.GetNamespace(); ns == "" || ns == ShippedNamespace {
				obj.SetNamespace(namespace)
			}
		}
	}
	subjects, found, err := unstructured.NestedSlice(obj.Object, "subjects")
	if err != nil {
		return fmt.Errorf("reading subjects: %w", err)
	}
	if !found {
		return nil
	}
	for i, s := range subjects {
		subject, ok := s.(map[string]any)
		if !ok {
			return fmt.Errorf("subject %d is not an object", i)
		}
		if subject["kind"] == "ServiceAccount" && subject["namespace"] == ShippedNamespace {
			subject["namespace"] = namespace
		}
	}
	return unstructured.SetNestedSlice(obj.Object, subjects, "subjects")
}

// createOrUpdate creates obj, or replaces the stored object's content with it if one exists,
// so that a second Apply, or one after the manifests changed, takes effect.
func createOrUpdate(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	err := c.Create(ctx, obj.DeepCopy())
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating: %w", err)
	}
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(obj.GroupVersionKind())
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
		return fmt.Errorf("reading the existing object: %w", err)
	}
	update := obj.DeepCopy()
	update.SetResourceVersion(existing.GetResourceVersion())
	// A binding's roleRef cannot change; the API server refuses that, naming the field.
	if err := c.Update(ctx, update); err != nil {
		return fmt.Errorf("updating: %w", err)
	}
	return nil
}
