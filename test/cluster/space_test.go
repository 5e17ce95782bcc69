package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/spacestandin"
)

// The space service answers through either API with a kubeconfig that works in the space: the
// eaas Namespace claim (made as Konflux's eaas-provision-space makes it, its Secret
// <TaskRun>-secret) and the SpaceRequest. With api auto, on a cluster that serves both, the
// step takes the claim and says so.
func TestProvisionSpaceThroughEitherAPIServesAWorkingKubeconfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		api  string
		says []string
		// made is the kind the tenant's namespace holds afterwards; not the other.
		made, notMade string
	}{
		{api: "", says: []string{"asking with Namespace claims", "auto prefers the claim"}, made: "claim", notMade: "SpaceRequest"},
		{api: "namespace-claim", says: []string{"asking with Namespace claims", "asked for by name"}, made: "claim", notMade: "SpaceRequest"},
		{api: "spacerequest", says: []string{"asking with SpaceRequests", "asked for by name"}, made: "SpaceRequest", notMade: "claim"},
	} {
		name := tc.api
		if name == "" {
			name = "auto"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := tenant(t, "e2e-space-"+name)
			req := request(ns, "space", readyTemplate)
			req.SpaceAPI = tc.api
			run := provisionSpace(t, req)
			mustSay(t, "the provision-space step's output", steps.of(run.Space, "provision-space"), tc.says...)

			gvks := map[string]client.Object{"claim": object(claimGVK, ns, run.Space.Name), "SpaceRequest": object(spaceRequestGVK, ns, run.Space.Name)}
			made := gvks[tc.made]
			if err := admin().Get(context.Background(), client.ObjectKeyFromObject(made), made); err != nil {
				t.Fatalf("the %s the step made: %v", tc.made, err)
			}
			if refs := made.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != run.Space.UID {
				t.Errorf("the %s is owned by %+v, want the TaskRun %s", tc.made, refs, run.Space.Name)
			}
			if other := gvks[tc.notMade]; admin().Get(context.Background(), client.ObjectKeyFromObject(other), other) == nil {
				t.Errorf("the step made a %s too", tc.notMade)
			}
			secretRef := resultOf(run.Space, "secretRef")
			if tc.made == "claim" && secretRef != run.Space.Name+"-secret" {
				t.Errorf("the secretRef result is %q, want the claim's Secret %s-secret", secretRef, run.Space.Name)
			}
			listInSpace(t, ns, secretRef, run.SpaceNamespace)
		})
	}
}

// listInSpace lists ConfigMaps in the space namespace with the kubeconfig of the space's
// Secret, as a later step would act there.
func listInSpace(t *testing.T, tenantNS, secretName, spaceNS string) {
	t.Helper()
	var secret corev1.Secret
	if err := admin().Get(context.Background(), client.ObjectKey{Namespace: tenantNS, Name: secretName}, &secret); err != nil {
		t.Fatalf("the space's Secret: %v", err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["kubeconfig"])
	if err != nil {
		t.Fatalf("the space's kubeconfig: %v", err)
	}
	if spaceNS == "" {
		t.Fatal("no space namespace in the results")
	}
	if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps(spaceNS).List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("listing ConfigMaps in the space %s with its kubeconfig: %v", spaceNS, err)
	}
}

// A claim that never gets ready ends the step at its timeout, naming the claim and both of
// Crossplane's conditions, the composition's error among them. The timeout leaves the space
// stand-in time to report the stall first: under CI's load it once took more than 4 s.
func TestProvisionSpaceOfAClaimThatNeverGetsReadyTimesOut(t *testing.T) {
	t.Parallel()
	ns := tenant(t, "e2e-space-stalled")
	const cause = "cannot compose resources: function-go-templating: ns.yaml: template error"
	stack.Spaces.StallClaims(ns, cause)
	req := request(ns, "stalled", readyTemplate)
	req.SpaceTimeout = stalledTimeout
	run, err := stack.ProvisionSpace(context.Background(), req, pipelineLimit)
	if run != nil && run.Space != nil {
		release(t, run)
	}
	if err != nil {
		t.Fatal(err)
	}
	mustFail(t, run.Space, "berth-provision-space")
	said := steps.of(run.Space, "provision-space")
	mustSay(t, "the provision-space step's output", said,
		"waiting for Namespace claim "+ns+"/"+run.Space.Name+" to be Ready",
		"Namespace claim "+ns+"/"+run.Space.Name+" is not ready after "+stalledTimeout,
		"Ready=False (Waiting)", "Synced=False (ReconcileError): "+cause)
	mustSay(t, "the TaskRun's message", message(run.Space), "is not ready after "+stalledTimeout)
}

// stalledTimeout is the stalled space's timeout param.
const stalledTimeout = "30s"

// Deleting the run that owns a claimed space takes the claim, its Secret and the namespace with
// it: the garbage collector follows the claim's owner reference, the service the claim's
// deletion.
func TestDeletingTheRunDeletesItsClaimedSpace(t *testing.T) {
	t.Parallel()
	ns := tenant(t, "e2e-space-owned")
	run := provisionSpace(t, request(ns, "owned", readyTemplate))
	secret := resultOf(run.Space, "secretRef")
	if err := stack.ReleaseCluster(context.Background(), run, time.Minute); err != nil {
		t.Fatal(err)
	}
	gone(t, "Namespace claim "+ns+"/"+run.Space.Name, object(claimGVK, ns, run.Space.Name))
	gone(t, "Secret "+ns+"/"+secret, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secret}})
	gone(t, "space namespace "+run.SpaceNamespace, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: run.SpaceNamespace}})
}

// On a cluster that serves no claims (an older Konflux), auto takes the SpaceRequest and says
// why. The cluster is one of the test's own, with the space stand-in serving SpaceRequests
// only; the step runs as berth in a Task would, with the tenant's ClusterRole.
func TestProvisionSpaceAutoTakesTheSpaceRequestWhereNoClaimIsServed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	crds, err := realdata.CRDDir()
	if err != nil {
		t.Fatal(err)
	}
	older, err := controlplane.Start(controlplane.WithCRDs(crds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := older.Stop(); err != nil {
			t.Errorf("stopping the older cluster: %v", err)
		}
	})
	spaces, err := spacestandin.New(older.Config, spacestandin.Options{Serve: spacestandin.SpaceRequests})
	if err != nil {
		t.Fatal(err)
	}
	if err := spaces.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := spaces.Stop(); err != nil {
			t.Errorf("stopping its space stand-in: %v", err)
		}
	})

	const ns, user = "older-tenant", "older-tenant-runner"
	kubeconfig := tenantOn(t, older, ns, user)
	run := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "integration"},
		Spec: pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "berth-provision-space"}}}
	if err := older.Client.Create(ctx, run); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out, err := exec.Command(berthBinary, "cluster", "provision-space", "--kubeconfig", kubeconfig, "--namespace", ns,
		"--space-request", run.Name, "--tier", "appstudio-env", "--owner-kind", "TaskRun", "--owner-name", run.Name, "--owner-uid", string(run.UID),
		"--timeout", "1m", "--poll-interval", "200ms",
		"--result-secret-ref-file", filepath.Join(dir, "secretRef"), "--result-namespace-file", filepath.Join(dir, "namespace")).CombinedOutput()
	if err != nil {
		t.Fatalf("berth cluster provision-space: %v\n%s", err, out)
	}
	mustSay(t, "berth's output", string(out), "asking with SpaceRequests", "the cluster serves no Namespace claims", "created SpaceRequest "+ns+"/"+run.Name)
	secretRef, spaceNS := readFile(t, filepath.Join(dir, "secretRef")), readFile(t, filepath.Join(dir, "namespace"))
	var secret corev1.Secret
	if err := older.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: secretRef}, &secret); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["kubeconfig"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps(spaceNS).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing ConfigMaps in the space %s with its kubeconfig: %v", spaceNS, err)
	}
}

// tenantOn makes namespace on cp for a user bound to config/tasks/cluster's ClusterRole there,
// and returns the path of a kubeconfig acting as that user.
func tenantOn(t *testing.T, cp *controlplane.ControlPlane, namespace, user string) string {
	t.Helper()
	ctx := context.Background()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "tasks", "cluster", "tenant-role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(raw, &role); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if err := cp.EnsureNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{&role, binding} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig, err := cp.KubeConfigAs(user)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(raw))
}
