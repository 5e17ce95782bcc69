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

// Images the Tekton stand-in gives programs of this machine, found on the PATH of their steps.
// Each is a bare repository name, so it matches every tag and digest a step pins.
const (
	// BerthImage carries berth.
	BerthImage = "ghcr.io/berth-ci/berth"
	// KubectlImage carries the kubectl of `make testbin`.
	KubectlImage = "registry.k8s.io/kubectl"
	// OpenShiftCLIImage is the image the real Konflux eaas steps run oc in
	// (eaas-provision-space, eaas-get-ephemeral-cluster-credentials). Its oc is the kubectl of
	// `make testbin` under the name oc, because the real oc (github.com/openshift/oc) cannot be
	// had here: the Go module proxy refuses it. That is no loss for these steps: every oc
	// command they run (create -f -o jsonpath, wait --for=condition and --for=jsonpath, get -o
	// jsonpath and -o go-template, with --kubeconfig and --insecure-skip-tls-verify) is
	// kubectl's own code, which oc embeds from k8s.io/kubectl. What is left out is oc's own
	// commands (login, adm, new-app, image, …), none of which the steps call.
	OpenShiftCLIImage = "registry.redhat.io/openshift4/ose-cli"
	// TaskRunnerImage is Konflux's task-runner, the image the real
	// eaas-create-ephemeral-cluster-hypershift-aws step runs kubectl and yq in; both are those
	// of `make testbin`.
	TaskRunnerImage = "quay.io/konflux-ci/task-runner"
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

// stepImage is what the stand-in gives the steps of one image: programs of this machine.
type stepImage struct {
	image    string
	programs []imageProgram
}

// imageProgram is a file of this machine and the name steps call it by, whatever the file is
// called here (--berth-binary may name any file, and oc is kubectl).
type imageProgram struct {
	path, name string
	// optional programs come from `make testbin`, and an older bin/k8s may lack them: the
	// image's steps then find none, and only the steps that call it fail.
	optional bool
}

// stepImageContents are the images the dev stack gives programs of: berth is the given binary
// (none if ""), kubectl and yq those in bins.
func stepImageContents(berth, bins string) []stepImage {
	kubectl := imageProgram{path: filepath.Join(bins, "kubectl"), name: "kubectl", optional: true}
	oc := imageProgram{path: kubectl.path, name: "oc", optional: true}
	yq := imageProgram{path: filepath.Join(bins, "yq"), name: "yq", optional: true}
	var images []stepImage
	if berth != "" {
		images = append(images, stepImage{BerthImage, []imageProgram{{path: berth, name: "berth"}}})
	}
	return append(images,
		stepImage{KubectlImage, []imageProgram{kubectl}},
		stepImage{OpenShiftCLIImage, []imageProgram{oc}},
		stepImage{TaskRunnerImage, []imageProgram{kubectl, yq}},
	)
}

// stepImages gives the Tekton stand-in's steps the programs of stepImageContents. Each image's
// are copied into a directory of the state dir of its own, which the stand-in mounts at
// /usr/local/bin in the step.
func (s *Stack) stepImages(stateDir, berth string) (map[string]string, error) {
	bins, err := controlplane.BinaryDir()
	if err != nil {
		return nil, err
	}
	images, dirs, err := copyStepImages(filepath.Join(stateDir, "images"), stepImageContents(berth, bins))
	s.dirs = append(s.dirs, dirs...)
	return images, err
}

// copyStepImages fills a directory below root for each image that has any of its programs,
// and returns image → directory and the directories it made. A missing program fails unless it
// is optional.
func copyStepImages(root string, images []stepImage) (map[string]string, []string, error) {
	dirs := map[string]string{}
	var made []string
	for _, img := range images {
		var present []imageProgram
		for _, p := range img.programs {
			if _, err := os.Stat(p.path); err != nil {
				if p.optional {
					continue
				}
				return dirs, made, fmt.Errorf("image %s: %w", img.image, err)
			}
			present = append(present, p)
		}
		if len(present) == 0 {
			continue
		}
		dir := filepath.Join(root, filepath.Base(img.image))
		// Emptied first, so that a program an earlier stack had and this one lacks is not
		// left behind.
		if err := os.RemoveAll(dir); err != nil {
			return dirs, made, err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return dirs, made, err
		}
		made = append(made, dir)
		for _, p := range present {
			if err := copyExecutable(p.path, filepath.Join(dir, p.name)); err != nil {
				return dirs, made, fmt.Errorf("image %s: %w", img.image, err)
			}
		}
		dirs[img.image] = dir
	}
	return dirs, made, nil
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
	objs, err := controlplane.ReadObjects(file)
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
