package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/caasstandin"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// Konflux's own eaas-provision-space Task and its eaas StepActions, read unchanged from
// ../shared/real/tasks, get a tenant a cluster from the stand-ins as they get one from the
// real services: the Task's Namespace claim is served, create-ephemeral-cluster's
// ClusterTemplateInstance (built by yq, created and awaited by kubectl) gets Ready, and
// get-ephemeral-cluster-credentials finds every field it reads (the instance's kubeconfig,
// admin password and API URL, the cluster's console Route). A last step of the test's own
// uses what they handed over. Deleting the run that owns the claim takes space and cluster.
//
// The steps find the programs of their images on their PATH: kubectl and yq v4 built from the
// module proxy by `make testbin`. The real `oc` cannot be had here (the module proxy refuses
// github.com/openshift/oc), so the ose-cli image's `oc` is that kubectl under oc's name: the
// subcommands these steps call (create, get, wait) are kubectl's own, which oc embeds.
func TestTheRealEaasTaskAndStepActionsServeACluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := tenant(t, "e2e-eaas-real")
	for _, file := range []string{"eaas-provision-space.yaml", "eaas-create-ephemeral-cluster-hypershift-aws.yaml", "eaas-get-ephemeral-cluster-credentials.yaml"} {
		obj, err := realdata.Task(file)
		if err != nil {
			t.Fatal(err)
		}
		obj.SetNamespace(ns)
		if err := admin().Create(ctx, obj); err != nil {
			t.Fatalf("applying %s: %v", file, err)
		}
	}

	space := runTask(t, &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "eaas-space", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			ServiceAccountName: account,
			TaskRef:            &pipelinev1.TaskRef{Name: "eaas-provision-space"},
			Params: pipelinev1.Params{param("ownerKind", "TaskRun"), param("ownerName", "$(context.taskRun.name)"),
				param("ownerUid", "$(context.taskRun.uid)")},
		},
	})
	var spaceNS string // known once the space is ready
	t.Cleanup(func() {
		if err := stack.ReleaseCluster(context.Background(), &devstack.ClusterRun{Space: space, SpaceNamespace: spaceNS}, time.Minute); err != nil {
			t.Errorf("deleting %s and waiting for its space to go: %v", space.Name, err)
		}
		if left := clustersIn(spaceNS); spaceNS != "" && len(left) > 0 {
			t.Errorf("clusters still running in %s after its space went: %+v", spaceNS, left)
		}
	})
	mustSucceed(t, space, "eaas-provision-space")
	spaceNS = spaceNamespaceOf(t, ns, space.Name+"-secret")
	secretRef := resultOf(space, "secretRef")
	if secretRef != space.Name+"-secret" {
		t.Fatalf("the secretRef result is %q, want %s-secret", secretRef, space.Name)
	}
	mustSay(t, "request-space's output", steps.of(space, "request-space"), "SecretRef: "+secretRef)
	claim := object(claimGVK, ns, space.Name)
	if err := admin().Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
		t.Fatalf("the claim the Task made: %v", err)
	}
	if refs := claim.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != space.UID || refs[0].Kind != "TaskRun" {
		t.Errorf("the claim is owned by %+v, want TaskRun %s (%s)", refs, space.Name, space.UID)
	}

	const version, instanceType = "4.17.9", "m5.large"
	fromStep := func(step, result string) *pipelinev1.ResultValue {
		return pipelinev1.NewStructuredValues("$(steps." + step + ".results." + result + ")")
	}
	cluster := runTask(t, &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "eaas-cluster", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			ServiceAccountName: account,
			TaskSpec: &pipelinev1.TaskSpec{
				Volumes: []corev1.Volume{{Name: "credentials", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				Results: []pipelinev1.TaskResult{
					{Name: "clusterName", Value: fromStep("create-cluster", "clusterName")},
					{Name: "apiServerURL", Value: fromStep("get-credentials", "apiServerURL")},
					{Name: "consoleURL", Value: fromStep("get-credentials", "consoleURL")},
					{Name: "username", Value: fromStep("get-credentials", "username")},
				},
				Steps: []pipelinev1.Step{
					{Name: "create-cluster", Ref: &pipelinev1.Ref{Name: "eaas-create-ephemeral-cluster-hypershift-aws"},
						Params: pipelinev1.Params{param("eaasSpaceSecretRef", secretRef), param("version", version),
							param("instanceType", instanceType), param("timeout", "2m")}},
					{Name: "get-credentials", Ref: &pipelinev1.Ref{Name: "eaas-get-ephemeral-cluster-credentials"},
						Params: pipelinev1.Params{param("eaasSpaceSecretRef", secretRef),
							param("clusterName", "$(steps.create-cluster.results.clusterName)"), param("credentials", "credentials")}},
					{Name: "use-cluster", Image: devstack.KubectlImage + ":v1.35.8",
						VolumeMounts: []corev1.VolumeMount{{Name: "credentials", MountPath: "/credentials"}},
						Env: []corev1.EnvVar{{Name: "KUBECONFIG_FILE", Value: "$(steps.get-credentials.results.kubeconfig)"},
							{Name: "PASSWORD_FILE", Value: "$(steps.get-credentials.results.passwordPath)"}},
						Script: "#!/bin/bash\nset -eo pipefail\n" +
							"test -s \"/credentials/$PASSWORD_FILE\"\n" +
							"kubectl --kubeconfig \"/credentials/$KUBECONFIG_FILE\" get namespace openshift-console -o name\n"},
				},
			},
		},
	})
	mustSucceed(t, cluster, "the TaskRun of the eaas StepActions")

	name := resultOf(cluster, "clusterName")
	if !strings.HasPrefix(name, "cluster-") {
		t.Fatalf("clusterName %q: want the generated name of a ClusterTemplateInstance, cluster-…", name)
	}
	inst := instance(t, spaceNS, name)
	if inst == nil {
		t.Fatalf("no ClusterTemplateInstance %s/%s", spaceNS, name)
	}
	if got := inst.GetLabels()["eaas.konflux-ci.dev/tenant"]; got != ns {
		t.Errorf("the instance's tenant label is %q, want %s", got, ns)
	}
	if ref := field(inst, "spec", "clusterTemplateRef"); ref != devstack.SharedTemplate {
		t.Errorf("the instance asks for template %q, want %s", ref, devstack.SharedTemplate)
	}
	for p, want := range map[string]string{"instanceType": instanceType, "version": version, "timeout": "2m", "imageContentSources": "", "fips": "false"} {
		if got, ok := parameter(t, inst, p); !ok || got != want {
			t.Errorf("template parameter %s: got %q (given: %v), want %q", p, got, ok, want)
		}
	}
	for result, want := range map[string]string{
		"apiServerURL": field(inst, "status", "apiServerURL"),
		"consoleURL":   "https://" + caasstandin.ConsoleHost(name),
		"username":     "kubeadmin",
	} {
		if got := resultOf(cluster, result); got != want || want == "" {
			t.Errorf("result %s: got %q, want %q", result, got, want)
		}
	}
	mustSay(t, "create-cluster's output", steps.of(cluster, "create-cluster"), "Created ClusterTemplateInstance "+name, "Successfully provisioned "+name)
	mustSay(t, "use-cluster's output", steps.of(cluster, "use-cluster"), "namespace/openshift-console")
}

// spaceNamespaceOf is the space namespace a claim's connection Secret names; it fails the test
// if there is no such Secret.
func spaceNamespaceOf(t *testing.T, namespace, secret string) string {
	t.Helper()
	var s corev1.Secret
	if err := admin().Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: secret}, &s); err != nil {
		t.Fatalf("the claim's connection Secret: %v", err)
	}
	return string(s.Data["namespace"])
}

func param(name, value string) pipelinev1.Param {
	return pipelinev1.Param{Name: name, Value: *pipelinev1.NewStructuredValues(value)}
}
