package devstack

import (
	"context"
	"fmt"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ClusterRequest is what an integration pipeline asks of the ephemeral-cluster Tasks.
type ClusterRequest struct {
	// Name prefixes the TaskRuns (<name>-space, <name>-cluster, <name>-use).
	Name      string
	Namespace string
	// ServiceAccount runs the TaskRuns (see InstallClusterTasks).
	ServiceAccount string
	Template       string
	// CredentialsSecret is the tenant's own cloud credentials, for a BYOC template.
	CredentialsSecret string
	// Timeout is berth-ephemeral-cluster's timeout param (a Go duration).
	Timeout string
	// SpaceAPI is berth-provision-space's api param; empty leaves its default, auto.
	SpaceAPI string
	// SpaceTimeout is berth-provision-space's timeout param; empty leaves its default.
	SpaceTimeout string
	// Use is the command line the last TaskRun runs against the cluster in the kubectl image,
	// after `kubectl --kubeconfig <the cluster's>`; nil runs none.
	Use []string
}

// ClusterRun is how far a ClusterRequest got: the TaskRuns as they ended (nil for one never
// started because the one before failed), the space's namespace and the cluster's results.
type ClusterRun struct {
	Space, Cluster, Use       *pipelinev1.TaskRun
	SpaceNamespace            string
	ClusterName, APIServerURL string
}

// RunClusterPipeline runs berth-provision-space, berth-ephemeral-cluster and then the Use
// command in order, each with the results of the one before, as a Pipeline of them would. The
// space is owned by the first TaskRun: deleting it deletes the space and the cluster in it.
// It returns when a TaskRun fails (with that run and no error) or all have succeeded.
func (s *Stack) RunClusterPipeline(ctx context.Context, req ClusterRequest, limit time.Duration) (*ClusterRun, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	run, err := s.provisionSpace(ctx, req)
	if err != nil || !run.Space.IsSuccessful() {
		return run, err
	}
	return run, s.runClusterInSpace(ctx, run, req)
}

// ProvisionSpace runs berth-provision-space alone, the first TaskRun of RunClusterPipeline, for
// a caller that shapes the space (gives it a ClusterTemplateQuota, say) before asking for a
// cluster in it with RunClusterInSpace. It returns when the TaskRun has ended.
func (s *Stack) ProvisionSpace(ctx context.Context, req ClusterRequest, limit time.Duration) (*ClusterRun, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return s.provisionSpace(ctx, req)
}

// RunClusterInSpace runs the rest of RunClusterPipeline in the space ProvisionSpace made for run:
// berth-ephemeral-cluster, then the Use command. It returns when a TaskRun fails (with the run
// recording it and no error) or both have succeeded.
func (s *Stack) RunClusterInSpace(ctx context.Context, run *ClusterRun, req ClusterRequest, limit time.Duration) error {
	if run.Space == nil || !run.Space.IsSuccessful() {
		return fmt.Errorf("no space to make cluster %s in: its berth-provision-space TaskRun did not succeed", req.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return s.runClusterInSpace(ctx, run, req)
}

func (s *Stack) provisionSpace(ctx context.Context, req ClusterRequest) (*ClusterRun, error) {
	run := &ClusterRun{}
	space := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: req.Name + "-space", Namespace: req.Namespace},
		Spec: pipelinev1.TaskRunSpec{
			ServiceAccountName: req.ServiceAccount,
			TaskRef:            &pipelinev1.TaskRef{Name: "berth-provision-space"},
			Params: pipelinev1.Params{
				param("tierName", "appstudio-env"),
				param("ownerKind", "TaskRun"),
				param("ownerName", "$(context.taskRun.name)"),
				param("ownerUid", "$(context.taskRun.uid)"),
			},
		},
	}
	if req.SpaceAPI != "" {
		space.Spec.Params = append(space.Spec.Params, param("api", req.SpaceAPI))
	}
	if req.SpaceTimeout != "" {
		space.Spec.Params = append(space.Spec.Params, param("timeout", req.SpaceTimeout))
	}
	var err error
	if run.Space, err = s.runTask(ctx, space); err != nil {
		return run, err
	}
	run.SpaceNamespace = resultOf(run.Space, "namespace")
	return run, nil
}

func (s *Stack) runClusterInSpace(ctx context.Context, run *ClusterRun, req ClusterRequest) error {
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: req.Name + "-credentials", Namespace: req.Namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	if err := s.ControlPlane.Client.Create(ctx, claim); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	credentials := pipelinev1.WorkspaceBinding{Name: "credentials", PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name}}
	timeout := req.Timeout
	if timeout == "" {
		timeout = "5m"
	}
	cluster := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: req.Name + "-cluster", Namespace: req.Namespace},
		Spec: pipelinev1.TaskRunSpec{
			ServiceAccountName: req.ServiceAccount,
			TaskRef:            &pipelinev1.TaskRef{Name: "berth-ephemeral-cluster"},
			Params: pipelinev1.Params{
				param("eaasSpaceSecretRef", resultOf(run.Space, "secretRef")),
				param("spaceNamespace", run.SpaceNamespace),
				param("template", req.Template),
				param("timeout", timeout),
				param("credentialsSecret", req.CredentialsSecret),
			},
			Workspaces: []pipelinev1.WorkspaceBinding{credentials},
		},
	}
	var err error
	if run.Cluster, err = s.runTask(ctx, cluster); err != nil || !run.Cluster.IsSuccessful() {
		return err
	}
	run.ClusterName, run.APIServerURL = resultOf(run.Cluster, "clusterName"), resultOf(run.Cluster, "apiServerURL")
	if req.Use == nil {
		return nil
	}
	args := append([]string{"--kubeconfig", "$(workspaces.credentials.path)/" + resultOf(run.Cluster, "kubeconfig")}, req.Use...)
	use := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: req.Name + "-use", Namespace: req.Namespace},
		Spec: pipelinev1.TaskRunSpec{
			ServiceAccountName: req.ServiceAccount,
			TaskSpec: &pipelinev1.TaskSpec{
				Workspaces: []pipelinev1.WorkspaceDeclaration{{Name: "credentials", ReadOnly: true}},
				Steps:      []pipelinev1.Step{{Name: "kubectl", Image: KubectlImage + ":v1.35.8", Command: []string{"kubectl"}, Args: args}},
			},
			Workspaces: []pipelinev1.WorkspaceBinding{credentials},
		},
	}
	run.Use, err = s.runTask(ctx, use)
	return err
}

// runTask creates a TaskRun and returns it once it has ended.
func (s *Stack) runTask(ctx context.Context, tr *pipelinev1.TaskRun) (*pipelinev1.TaskRun, error) {
	c := s.ControlPlane.Client
	if err := c.Create(ctx, tr); err != nil {
		return nil, fmt.Errorf("creating TaskRun %s: %w", tr.Name, err)
	}
	for {
		var got pipelinev1.TaskRun
		if err := c.Get(ctx, client.ObjectKeyFromObject(tr), &got); err != nil {
			return nil, err
		}
		if got.IsDone() {
			return &got, nil
		}
		select {
		case <-ctx.Done():
			return &got, fmt.Errorf("TaskRun %s did not end in time: %w", tr.Name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func param(name, value string) pipelinev1.Param {
	return pipelinev1.Param{Name: name, Value: *pipelinev1.NewStructuredValues(value)}
}

func resultOf(tr *pipelinev1.TaskRun, name string) string {
	for _, r := range tr.Status.Results {
		if r.Name == name {
			return r.Value.StringVal
		}
	}
	return ""
}

// ReleaseCluster deletes the run's first TaskRun, which owns the space, as deleting a
// PipelineRun would, and waits until the space's namespace is gone and the CaaS stand-in runs
// no cluster for it any more.
func (s *Stack) ReleaseCluster(ctx context.Context, run *ClusterRun, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	c := s.ControlPlane.Client
	spaceNamespace := run.SpaceNamespace
	if err := c.Delete(ctx, run.Space, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
		return err
	}
	if spaceNamespace == "" {
		return nil // the space was never ready: no namespace or cluster to wait for
	}
	for {
		err := c.Get(ctx, client.ObjectKey{Name: spaceNamespace}, &corev1.Namespace{})
		if apierrors.IsNotFound(err) && !s.runsClusterIn(spaceNamespace) {
			return nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("space %s still there %s after its run was deleted", spaceNamespace, limit)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Stack) runsClusterIn(namespace string) bool {
	for _, c := range s.CaaS.Clusters() {
		if c.Namespace == namespace {
			return true
		}
	}
	return false
}
