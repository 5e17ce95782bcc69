package cluster

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/caasstandin"
)

// An integration pipeline gets a space, a cluster in it, and runs kubectl against the cluster;
// no step shows a credential; deleting the run takes space, instance and the cluster's control
// plane with it.
func TestEphemeralClusterPipelineServesKubectlAndGoesWithItsRun(t *testing.T) {
	t.Parallel()
	ns := tenant(t, "e2e-pipeline")
	req := request(ns, "integration", readyTemplate)
	req.Use = []string{"get", "namespaces", "-o", "name"}
	run := runPipeline(t, req)

	// Before anything shows step output: no credential may be in it. The cluster's Secrets are
	// those its instance names, once it is ready.
	leakable := secrets{}
	leakable.add(t, ns, resultOf(run.Space, "secretRef"))
	inst := instance(t, run.SpaceNamespace, run.Cluster.Name)
	var clusterSecrets []string
	if inst != nil {
		for _, name := range []string{field(inst, "status", "kubeconfig", "name"), field(inst, "status", "adminPassword", "name")} {
			if name != "" {
				clusterSecrets = append(clusterSecrets, name)
			}
		}
	}
	leakable.add(t, run.SpaceNamespace, clusterSecrets...)
	var messages strings.Builder
	for _, tr := range []*pipelinev1.TaskRun{run.Space, run.Cluster, run.Use} {
		if tr != nil {
			messages.WriteString(message(tr) + "\n")
		}
	}
	leakable.notIn(t, "the steps' output", steps.ofNamespace(ns))
	leakable.notIn(t, "the TaskRuns' messages", messages.String())

	mustSucceed(t, run.Cluster, "berth-ephemeral-cluster")
	mustSucceed(t, run.Use, "kubectl against the cluster")
	if len(clusterSecrets) != 2 {
		t.Fatalf("the ready instance %s/%s names Secrets %v, want its kubeconfig and admin password", run.SpaceNamespace, run.Cluster.Name, clusterSecrets)
	}
	mustSay(t, "the kubectl step's output", steps.of(run.Use, "kubectl"), "namespace/kube-system")
	if run.ClusterName != run.Cluster.Name {
		t.Errorf("the clusterName result is %q, want the instance named after the TaskRun, %q", run.ClusterName, run.Cluster.Name)
	}
	url := field(inst, "status", "apiServerURL")
	if !strings.HasPrefix(run.APIServerURL, "https://") || run.APIServerURL != url {
		t.Errorf("the apiServerURL result is %q, want the https URL of the instance's status, %q", run.APIServerURL, url)
	}
	cluster := clusterConfig(t, run.SpaceNamespace, run.ClusterName)
	if err := answers(cluster); err != nil {
		t.Fatalf("the cluster's apiserver does not answer while the run exists: %v", err)
	}

	if err := stack.ReleaseCluster(context.Background(), run, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := admin().Get(context.Background(), client.ObjectKey{Name: run.SpaceNamespace}, &corev1.Namespace{}); err == nil || client.IgnoreNotFound(err) != nil {
		t.Errorf("space namespace %s is still there after its run was deleted (%v)", run.SpaceNamespace, err)
	}
	if instance(t, run.SpaceNamespace, run.ClusterName) != nil {
		t.Errorf("ClusterTemplateInstance %s/%s is still there after its run was deleted", run.SpaceNamespace, run.ClusterName)
	}
	if left := clustersIn(run.SpaceNamespace); len(left) > 0 {
		t.Errorf("the CaaS stand-in still runs %d control plane(s) for space %s", len(left), run.SpaceNamespace)
	}
	if err := answers(cluster); err == nil {
		t.Errorf("the cluster's apiserver at %s still answers after its run was deleted", run.APIServerURL)
	}
}

// A bring-your-own-cloud template gets the tenant's own credentials, copied into the space and
// named by the instance's parameter, and the cluster comes up on them; the values show nowhere.
func TestEphemeralClusterOnTheTenantsOwnCloudCredentials(t *testing.T) {
	t.Parallel()
	ns := tenant(t, "e2e-byoc")
	creds := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "aws-credentials", Namespace: ns},
		Data: map[string][]byte{
			caasstandin.AccessKeyIDKey:     []byte("AKIAE2ETENANTKEY0001"),
			caasstandin.SecretAccessKeyKey: []byte("e2e/tenant+secret/access/key/000000000001"),
		},
	}
	if err := admin().Create(context.Background(), creds); err != nil {
		t.Fatal(err)
	}
	req := request(ns, "byoc", byocTemplate)
	req.CredentialsSecret = creds.Name
	run := runPipeline(t, req)

	leakable := secrets{}
	leakable.add(t, ns, creds.Name)
	leakable.notIn(t, "the steps' output", steps.ofNamespace(ns))
	mustSucceed(t, run.Cluster, "berth-ephemeral-cluster")

	inst := instance(t, run.SpaceNamespace, run.ClusterName)
	if inst == nil {
		t.Fatalf("no ClusterTemplateInstance %s/%s", run.SpaceNamespace, run.ClusterName)
	}
	if got, ok := parameter(t, inst, caasstandin.CredentialsParameter); !ok || got != creds.Name {
		t.Errorf("the instance's parameter %s is %q (given: %v), want %q", caasstandin.CredentialsParameter, got, ok, creds.Name)
	}
	var copied corev1.Secret
	if err := admin().Get(context.Background(), client.ObjectKey{Namespace: run.SpaceNamespace, Name: creds.Name}, &copied); err != nil {
		t.Fatalf("the credentials in the space: %v", err)
	}
	if !maps.EqualFunc(copied.Data, creds.Data, slices.Equal) {
		t.Errorf("Secret %s/%s holds keys %v, not the tenant's data (keys %v)", run.SpaceNamespace, creds.Name,
			slices.Sorted(maps.Keys(copied.Data)), slices.Sorted(maps.Keys(creds.Data)))
	}
	if left := clustersIn(run.SpaceNamespace); len(left) != 1 || left[0].APIServerURL != run.APIServerURL {
		t.Errorf("the CaaS stand-in runs %v for space %s, want the one cluster at %s", left, run.SpaceNamespace, run.APIServerURL)
	}
}

// Credentials a bring-your-own-cloud template cannot use fail the Task at once (long before
// its timeout), naming the Secret and what is wrong with it.
func TestEphemeralClusterWithUnusableCloudCredentialsFailsFast(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, ns string
		data     map[string][]byte // nil: no Secret at all
		// wants are what the Task's output and message must name; instance whether an instance
		// is made before the failure shows.
		wants    []string
		instance bool
	}{
		{
			name: "the Secret lacks a key", ns: "e2e-byoc-lacks-key",
			data:     map[string][]byte{caasstandin.AccessKeyIDKey: []byte("AKIAE2ETENANTKEY0002")},
			wants:    []string{"aws-credentials", caasstandin.SecretAccessKeyKey, "CredentialsFailed"},
			instance: true,
		},
		{
			name: "there is no such Secret", ns: "e2e-byoc-no-secret",
			wants: []string{"aws-credentials", "not found"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := tenant(t, tc.ns)
			if tc.data != nil {
				creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "aws-credentials", Namespace: ns}, Data: tc.data}
				if err := admin().Create(context.Background(), creds); err != nil {
					t.Fatal(err)
				}
			}
			req := request(ns, "byoc", byocTemplate)
			req.CredentialsSecret, req.Timeout = "aws-credentials", failureTimeout
			run := runPipeline(t, req)
			mustFail(t, run.Cluster, "berth-ephemeral-cluster")

			said := steps.of(run.Cluster, "") + message(run.Cluster)
			mustSay(t, "the cluster TaskRun's output and message", said, tc.wants...)
			if strings.Contains(said, "is not ready after") {
				t.Errorf("the cluster TaskRun waited for its timeout instead of failing at once:\n%s", said)
			}
			made := instance(t, run.SpaceNamespace, run.Cluster.Name) != nil
			if made != tc.instance {
				t.Errorf("an instance was made: %v, want %v", made, tc.instance)
			}
			if tc.instance {
				mustSay(t, "the diagnose step's output", steps.of(run.Cluster, "diagnose"), tc.wants...)
			}
		})
	}
}

// Each fault of the cluster service ends the Task within its timeout, with output that names the
// cause: the install's log and Event for a failed install, the phase it was stuck in for a
// cluster that never gets ready, the template for one that does not exist.
func TestEphemeralClusterFailuresEndWithTheirCause(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, template, timeout string
		// check looks at what the run left and printed.
		check func(t *testing.T, run *devstack.ClusterRun, wait, diagnose string)
	}{
		{
			name: "install fails", template: installFailsTemplate, timeout: failureTimeout,
			check: func(t *testing.T, run *devstack.ClusterRun, wait, diagnose string) {
				mustSay(t, "the TaskRun's message", message(run.Cluster), "ClusterInstallFailed")
				mustSay(t, "the wait step's output", wait, "ClusterInstallFailed")
				pod := installPod(t, run.SpaceNamespace, run.Cluster.Name)
				var terminated *corev1.ContainerStateTerminated
				for _, cs := range pod.Status.ContainerStatuses {
					if cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0 {
						terminated = cs.State.Terminated
					}
				}
				if terminated == nil || strings.TrimSpace(terminated.Message) == "" {
					t.Fatalf("install Pod %s has no failed container with a termination message: %+v", pod.Name, pod.Status.ContainerStatuses)
				}
				for line := range strings.Lines(strings.TrimSpace(terminated.Message)) {
					mustSay(t, "the diagnose step's output", diagnose, "| "+strings.TrimRight(line, "\n"))
				}
				warnings := warningsOn(t, run.SpaceNamespace, run.Cluster.Name)
				if len(warnings) == 0 {
					t.Fatalf("no Warning Event on ClusterTemplateInstance %s/%s", run.SpaceNamespace, run.Cluster.Name)
				}
				for _, e := range warnings {
					mustSay(t, "the diagnose step's output", diagnose, "Warning "+e.Reason, strings.TrimSpace(e.Message))
				}
			},
		},
		{
			name: "never ready", template: neverReadyTemplate, timeout: "20s",
			check: func(t *testing.T, run *devstack.ClusterRun, wait, diagnose string) {
				mustSay(t, "the wait step's output", wait, "is not ready after 20s: still in phase ClusterInstalling")
				if strings.Contains(wait, "retrying") {
					t.Errorf("the wait step's output tells of retries where the cluster only never got ready:\n%s", wait)
				}
				mustSay(t, "the TaskRun's message", message(run.Cluster), "ClusterInstalling")
				mustSay(t, "the diagnose step's output", diagnose, "phase:      ClusterInstalling", "Job "+run.Cluster.Name+"-install: 1 active")
			},
		},
		{
			name: "no such template", template: "e2e-no-such-template", timeout: failureTimeout,
			check: func(t *testing.T, run *devstack.ClusterRun, wait, diagnose string) {
				mustSay(t, "the TaskRun's message", message(run.Cluster), "e2e-no-such-template", "phase Failed")
				mustSay(t, "the diagnose step's output", diagnose, "e2e-no-such-template")
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := tenant(t, "e2e-"+strings.ReplaceAll(tc.name, " ", "-"))
			req := request(ns, "faulty", tc.template)
			req.Timeout = tc.timeout
			run := runPipeline(t, req)
			mustFail(t, run.Cluster, "berth-ephemeral-cluster")
			wait := steps.of(run.Cluster, "wait")
			if tc.timeout == failureTimeout && strings.Contains(wait, "is not ready after") {
				t.Errorf("the wait step waited for its timeout instead of failing at once:\n%s", wait)
			}
			tc.check(t, run, wait, steps.of(run.Cluster, "diagnose"))
			if left := clustersIn(run.SpaceNamespace); len(left) > 0 {
				t.Errorf("the failed cluster left %d control plane(s) running", len(left))
			}
		})
	}
}

// installPod is the Pod of an instance's install Job.
func installPod(t *testing.T, namespace, instance string) *corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := admin().List(context.Background(), &pods, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if strings.HasPrefix(pods.Items[i].Name, instance+"-install-") {
			return &pods.Items[i]
		}
	}
	t.Fatalf("no install Pod of %s/%s", namespace, instance)
	return nil
}

// warningsOn are the Warning Events on a ClusterTemplateInstance.
func warningsOn(t *testing.T, namespace, instance string) []corev1.Event {
	t.Helper()
	var events corev1.EventList
	if err := admin().List(context.Background(), &events, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeWarning && e.InvolvedObject.Kind == instanceGVK.Kind && e.InvolvedObject.Name == instance {
			out = append(out, e)
		}
	}
	return out
}

// A space's ClusterTemplateQuota that does not allow the template, or has no room left for it,
// fails the Task at once, before any instance is made, naming the template and the quota.
func TestEphemeralClusterBeyondTheSpacesQuotaIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, template string
		budget         int64
		allowed        map[string]int64
		// earlier is an instance of the template already in the space, if not "".
		earlier string
		wants   []string
	}{
		{
			name: "not allowed", template: readyTemplate,
			allowed: map[string]int64{installFailsTemplate: 0},
			wants:   []string{readyTemplate, "e2e-quota", "not allowed"},
		},
		{
			name: "count used up", template: neverReadyTemplate,
			allowed: map[string]int64{neverReadyTemplate: 1},
			earlier: "earlier",
			wants:   []string{neverReadyTemplate, "e2e-quota", "earlier"},
		},
		{
			name: "over budget", template: costlyTemplate,
			budget:  costlyCost - 1,
			allowed: map[string]int64{costlyTemplate: 0},
			wants:   []string{costlyTemplate, "e2e-quota", "budget"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := tenant(t, "e2e-quota-"+strings.ReplaceAll(tc.name, " ", "-"))
			req := request(ns, "quota", tc.template)
			req.Timeout = failureTimeout
			run := provisionSpace(t, req)
			makeQuota(t, run.SpaceNamespace, "e2e-quota", tc.budget, tc.allowed)
			var before []string
			if tc.earlier != "" {
				earlier := object(instanceGVK, run.SpaceNamespace, tc.earlier)
				earlier.Object["spec"] = map[string]any{"clusterTemplateRef": tc.template}
				if err := admin().Create(context.Background(), earlier); err != nil {
					t.Fatal(err)
				}
				before = []string{tc.earlier}
			}
			if err := stack.RunClusterInSpace(context.Background(), run, req, pipelineLimit); err != nil {
				t.Fatal(err)
			}
			mustFail(t, run.Cluster, "berth-ephemeral-cluster")
			mustSay(t, "the TaskRun's message", message(run.Cluster), tc.wants...)
			mustSay(t, "the provision step's output", steps.of(run.Cluster, "provision"), tc.wants...)
			if after := instanceNames(t, run.SpaceNamespace); !slices.Equal(after, before) {
				t.Errorf("the space holds instances %v after the refusal, want %v", after, before)
			}
			if wait := steps.of(run.Cluster, "wait"); wait != "" {
				t.Errorf("the Task went on to wait after the refusal:\n%s", wait)
			}
		})
	}
}

// `berth cluster deprovision`, run as a step the way a pipeline's finally task would, gives the
// cluster back (its instance and control plane go, the space stays), then the space (its claim).
func TestEphemeralClusterDeprovisionRemovesItsControlPlane(t *testing.T) {
	t.Parallel()
	ns := tenant(t, "e2e-deprovision")
	run := runPipeline(t, request(ns, "finally", readyTemplate))
	mustSucceed(t, run.Cluster, "berth-ephemeral-cluster")
	cluster := clusterConfig(t, run.SpaceNamespace, run.ClusterName)
	if err := answers(cluster); err != nil {
		t.Fatalf("the cluster's apiserver does not answer before its deprovision: %v", err)
	}

	tr := runTask(t, deprovision(ns, "finally-cluster-back", resultOf(run.Space, "secretRef"),
		"--space-kubeconfig=/var/run/berth/space/kubeconfig", "--space-namespace="+run.SpaceNamespace, "--cluster-name="+run.ClusterName))
	mustSucceed(t, tr, "berth cluster deprovision")
	mustSay(t, "the deprovision step's output", steps.of(tr, "deprovision"), "ClusterTemplateInstance "+run.SpaceNamespace+"/"+run.ClusterName+" is gone")
	if instance(t, run.SpaceNamespace, run.ClusterName) != nil {
		t.Errorf("ClusterTemplateInstance %s/%s is still there after its deprovision", run.SpaceNamespace, run.ClusterName)
	}
	if left := clustersIn(run.SpaceNamespace); len(left) > 0 {
		t.Errorf("the CaaS stand-in still runs %d control plane(s) for space %s", len(left), run.SpaceNamespace)
	}
	if err := answers(cluster); err == nil {
		t.Errorf("the cluster's apiserver at %s still answers after its deprovision", run.APIServerURL)
	}
	if err := admin().Get(context.Background(), client.ObjectKey{Name: run.SpaceNamespace}, &corev1.Namespace{}); err != nil {
		t.Errorf("the space namespace went with the cluster: %v", err)
	}

	tr = runTask(t, deprovision(ns, "finally-space-back", "", "--namespace=$(context.taskRun.namespace)", "--space-claim="+run.Space.Name))
	mustSucceed(t, tr, "berth cluster deprovision --space-claim")
	gone(t, "Namespace claim "+ns+"/"+run.Space.Name, object(claimGVK, ns, run.Space.Name))
	gone(t, "space namespace "+run.SpaceNamespace, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: run.SpaceNamespace}})
}

// deprovision is a TaskRun of one step of berth's image running `berth cluster deprovision`
// with args as the tenant's account, with the space's Secret (if given) mounted where the
// cluster Tasks mount it.
func deprovision(namespace, name, spaceSecret string, args ...string) *pipelinev1.TaskRun {
	step := pipelinev1.Step{
		Name: "deprovision", Image: devstack.BerthImage + ":latest",
		Command: []string{"berth"}, Args: append([]string{"cluster", "deprovision"}, args...),
	}
	spec := &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{step}}
	if spaceSecret != "" {
		spec.Volumes = []corev1.Volume{{Name: "space", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: spaceSecret}}}}
		spec.Steps[0].VolumeMounts = []corev1.VolumeMount{{Name: "space", MountPath: "/var/run/berth/space", ReadOnly: true}}
	}
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       pipelinev1.TaskRunSpec{ServiceAccountName: account, TaskSpec: spec},
	}
}
