package devstack

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// ApplyFiles creates, or updates, every object of the YAML files in order, as `kubectl apply
// -f` with the stack's kubeconfig would; a namespaced object that names no namespace goes to
// SampleNamespace. It is how a person runs a Task of their own on the stack (the catalog's
// buildah-remote, say) without a kubectl. It returns "kind/name" of each object.
func (s *Stack) ApplyFiles(ctx context.Context, files ...string) ([]string, error) {
	c := s.ControlPlane.Client
	var applied []string
	for _, f := range files {
		objs, err := controlplane.ReadObjects(f)
		if err != nil {
			return applied, err
		}
		for _, obj := range objs {
			namespaced, err := c.IsObjectNamespaced(obj)
			if err != nil {
				return applied, fmt.Errorf("%s: %s %s: %w", f, obj.GetKind(), obj.GetName(), err)
			}
			if namespaced && obj.GetNamespace() == "" {
				obj.SetNamespace(SampleNamespace)
			}
			if namespaced {
				if err := s.ControlPlane.EnsureNamespace(ctx, obj.GetNamespace()); err != nil {
					return applied, err
				}
			}
			if err := createOrUpdate(ctx, c, obj); err != nil {
				return applied, fmt.Errorf("%s: %s %s: %w", f, obj.GetKind(), obj.GetName(), err)
			}
			applied = append(applied, obj.GetKind()+"/"+obj.GetName())
		}
	}
	return applied, nil
}

func createOrUpdate(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	err := c.Create(ctx, obj.DeepCopy())
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	current := &unstructured.Unstructured{}
	current.SetGroupVersionKind(obj.GroupVersionKind())
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), current); err != nil {
		return err
	}
	obj.SetResourceVersion(current.GetResourceVersion())
	return c.Update(ctx, obj)
}
