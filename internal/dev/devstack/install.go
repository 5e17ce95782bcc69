package devstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/rbac"
)

// The ServiceAccounts of config/rbac: the controller's, and the one internal TaskRuns run as.
const (
	ControllerServiceAccount = "berth-controller"
	HostTaskServiceAccount   = "berth-host-tasks"
)

// install puts berth's shipped manifests into the control plane as `kubectl apply -k
// config/default` would: the RBAC of config/rbac and the Tasks of config/tasks.
func install(ctx context.Context, c client.Client) error {
	if err := rbac.Apply(ctx, c, Namespace); err != nil {
		return err
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "tasks", "*-*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var task pipelinev1.Task
		if err := yaml.UnmarshalStrict(data, &task); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		task.Namespace = Namespace
		if err := c.Create(ctx, &task); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating Task %s: %w", task.Name, err)
		}
	}
	return nil
}

// ApplyHostConfig creates or replaces the host-config ConfigMap, which the controller
// hot-reloads, and returns the resourceVersion it was written as.
func (s *Stack) ApplyHostConfig(ctx context.Context, data map[string]string) (string, error) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "host-config", Namespace: Namespace,
		Labels: map[string]string{contract.ConfigLabel: "hosts"}}}
	c := s.ControlPlane.Client
	err := c.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	cm.Data = data
	switch {
	case apierrors.IsNotFound(err):
		err = c.Create(ctx, cm)
	case err == nil:
		err = c.Update(ctx, cm)
	}
	return cm.ResourceVersion, err
}

// StaticHostConfig is a host config with every SSH host of the stack as a static host of
// platform, each taking concurrency tasks, plus the given local platforms.
func (s *Stack) StaticHostConfig(platform string, concurrency int, local ...string) map[string]string {
	data := map[string]string{}
	for _, h := range s.Fleet.Hosts {
		prefix := "host." + h.Name + "."
		data[prefix+"address"] = h.Address
		data[prefix+"user"] = "root"
		data[prefix+"platform"] = platform
		data[prefix+"secret"] = AdminKeySecret
		data[prefix+"concurrency"] = fmt.Sprint(concurrency)
	}
	if len(local) > 0 {
		data["local-platforms"] = strings.Join(local, ",")
	}
	return data
}

// serviceAccountKubeconfig writes a kubeconfig that acts as a ServiceAccount of Namespace by
// impersonation, so the host steps are held to the RBAC they ship with.
func (s *Stack) serviceAccountKubeconfig(path, serviceAccount string) error {
	cfg, err := clientcmd.Load(s.ControlPlane.KubeConfig)
	if err != nil {
		return err
	}
	for _, auth := range cfg.AuthInfos {
		auth.Impersonate = "system:serviceaccount:" + Namespace + ":" + serviceAccount
		auth.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + Namespace, "system:authenticated"}
	}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	return s.writeFile(path, data)
}
