package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/berth-ci/berth/internal/dev/testground/caasstandin"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/dev/testground/spacestandin"
)

// Images the Tekton stand-in gives programs of this machine: steps of berth's image find the
// berth binary on their PATH, steps of the kubectl image the kubectl of `make testbin`.
const (
	BerthImage   = "ghcr.io/berth-ci/berth"
	KubectlImage = "registry.k8s.io/kubectl"
)

// Templates the dev stack offers for ephemeral clusters (ClusterTemplates of the CaaS
// stand-in): one on the platform's shared cloud account, one that brings the tenant's own.
const (
	SharedTemplate = "hypershift-aws-cluster"
	BYOCTemplate   = "hypershift-aws-byoc"
	// ClusterTenantRole is config/tasks/cluster's ClusterRole for the account a tenant runs the
	// ephemeral-cluster Tasks as.
	ClusterTenantRole = "berth-ephemeral-cluster-user"
)

// clusterCRDs is where the real services' CRDs are (../shared/real/crds).
func clusterCRDs() (string, error) { return realdata.CRDDir() }

// startClusterServices starts the stand-ins of the space and cluster services on the control
// plane (which serves their CRDs) and offers the dev stack's templates.
func (s *Stack) startClusterServices(ctx context.Context) error {
	// The stand-ins run as long as the stack does, whatever ctx bounds the start: Down stops
	// them.
	lifetime := context.WithoutCancel(ctx)
	var err error
	if s.Spaces, err = spacestandin.New(s.ControlPlane.Config, spacestandin.Options{}); err != nil {
		return err
	}
	if err := s.Spaces.Start(lifetime); err != nil {
		return &ComponentError{Component: SpaceStandInComponent, Err: err}
	}
	s.Supervisor.Watch(Component{Name: SpaceStandInComponent, Done: s.Spaces.Done(), Exit: s.Spaces.Err})
	if s.CaaS, err = caasstandin.New(s.ControlPlane.Config); err != nil {
		return err
	}
	if err := s.CaaS.Start(lifetime); err != nil {
		return &ComponentError{Component: CaaSStandInComponent, Err: err}
	}
	s.Supervisor.Watch(Component{Name: CaaSStandInComponent, Done: s.CaaS.Done(), Exit: s.CaaS.Err})
	for name, definition := range map[string]string{SharedTemplate: caasstandin.DefinitionReady, BYOCTemplate: caasstandin.DefinitionCredentials} {
		if err := s.AddClusterTemplate(ctx, name, definition, 0); err != nil {
			return err
		}
	}
	return nil
}

// stopClusterServices stops every cluster the CaaS stand-in booted, then both stand-ins.
func (s *Stack) stopClusterServices() error {
	var errs []error
	if s.CaaS != nil {
		errs = append(errs, s.CaaS.Stop())
	}
	if s.Spaces != nil {
		errs = append(errs, s.Spaces.Stop())
	}
	return errors.Join(errs...)
}

// AddClusterTemplate offers a ClusterTemplate whose clusterDefinition tells the CaaS stand-in
// how its clusters fare (caasstandin.Definition*), at cost (0: free).
func (s *Stack) AddClusterTemplate(ctx context.Context, name, definition string, cost int64) error {
	tmpl := &unstructured.Unstructured{}
	tmpl.SetAPIVersion("clustertemplate.openshift.io/v1alpha1")
	tmpl.SetKind("ClusterTemplate")
	tmpl.SetName(name)
	spec := map[string]any{"clusterDefinition": definition}
	if cost > 0 {
		spec["cost"] = cost
	}
	tmpl.Object["spec"] = spec
	if err := createOrUpdate(ctx, s.ControlPlane.Client, tmpl); err != nil {
		return fmt.Errorf("ClusterTemplate %s: %w", name, err)
	}
	return nil
}

// InstallClusterTasks puts the Tasks of config/tasks/cluster into a tenant's namespace and
// lets its ServiceAccount run them (config/tasks/cluster's ClusterRole, bound in namespace),
// as a tenant would.
func (s *Stack) InstallClusterTasks(ctx context.Context, namespace, serviceAccount string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "config", "tasks", "cluster")
	if err := s.ControlPlane.EnsureNamespace(ctx, namespace); err != nil {
		return err
	}
	for _, f := range []string{"tenant-role.yaml", "provision-space.yaml", "ephemeral-cluster.yaml"} {
		if _, err := s.applyFileTo(ctx, filepath.Join(dir, f), namespace); err != nil {
			return err
		}
	}
	c := s.ControlPlane.Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount, Namespace: namespace}}
	if err := c.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ClusterTenantRole, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ClusterTenantRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccount, Namespace: namespace}},
	}
	if err := c.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// stepImages gives the Tekton stand-in's steps the programs of berth's and kubectl's images:
// berth is the given binary, kubectl the one `make testbin` built (when it is there). Each is
// copied into a directory of the state dir of its own, which the stand-in mounts at
// /usr/local/bin in the step.
func (s *Stack) stepImages(stateDir, berth string) (map[string]string, error) {
	images := map[string]string{}
	bins, err := controlplane.BinaryDir()
	if err != nil {
		return nil, err
	}
	// Each program goes in under the name steps call it by, whatever its file is called here
	// (--berth-binary may name any file).
	for _, p := range []struct{ image, program, name string }{
		{BerthImage, berth, "berth"},
		{KubectlImage, filepath.Join(bins, "kubectl"), "kubectl"},
	} {
		if p.program == "" {
			continue
		}
		if _, err := os.Stat(p.program); err != nil {
			if p.image == KubectlImage {
				continue // an older bin/k8s: steps of the kubectl image then find none
			}
			return nil, err
		}
		dir := filepath.Join(stateDir, "images", filepath.Base(p.image))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := copyExecutable(p.program, filepath.Join(dir, p.name)); err != nil {
			return nil, err
		}
		images[p.image] = dir
		s.dirs = append(s.dirs, dir)
	}
	return images, nil
}

func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to+".tmp", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(to+".tmp", to)
}

// applyFileTo is ApplyFiles for one file whose namespaced objects go to namespace.
func (s *Stack) applyFileTo(ctx context.Context, file, namespace string) ([]string, error) {
	objs, err := decodeObjects(file)
	if err != nil {
		return nil, err
	}
	var applied []string
	for _, obj := range objs {
		namespaced, err := s.ControlPlane.Client.IsObjectNamespaced(obj)
		if err != nil {
			return applied, fmt.Errorf("%s: %s %s: %w", file, obj.GetKind(), obj.GetName(), err)
		}
		if namespaced {
			obj.SetNamespace(namespace)
		}
		if err := createOrUpdate(ctx, s.ControlPlane.Client, obj); err != nil {
			return applied, fmt.Errorf("%s: %s %s: %w", file, obj.GetKind(), obj.GetName(), err)
		}
		applied = append(applied, obj.GetKind()+"/"+obj.GetName())
	}
	return applied, nil
}
