package realclient_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	tektonpod "github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// The platforms the real Task builds for: a static host, as production serves s390x, and a
// VM launched for the task through the EC2 API, as production serves amd64.
const (
	staticPlatform = "linux/s390x"
	vmPlatform     = "linux/amd64"
)

// realTaskRun is one TaskRun of the real Task and what the test learns of it on the way.
type realTaskRun struct {
	tr      *pipelinev1.TaskRun
	login   string // the secret's host, user@address
	vm      string // the cloud instance of a VM platform
	builtOn string // what the host is, in failure messages
}

// TestRealBuildahRemoteBuildsRemotely runs the real buildah-remote 0.10 Task, unmodified
// (../shared/real/tasks), on the test ground: the Tekton stand-in runs its steps as a pod
// would, berth's controller gives its build step a static host and a VM launched for it, and
// the step does on them what it does in production (ssh as the build user, rsync the sources
// and volumes, `podman run` of the builder image, rsync back, pull the image from the synced
// OCI layout). On the hosts, podman is the test ground's stand-in: it checks the invocation
// and builds the image with buildah instead of running the builder image's script. The image
// goes to 127.0.0.1 at a port nothing listens on, so the push step fails with the registry's
// error and no traffic leaves this machine. Then berth removes the build user and frees the
// slot, and the VM is terminated.
func TestRealBuildahRemoteBuildsRemotely(t *testing.T) {
	if err := sshhosts.BuildPrerequisites(); err != nil {
		missing.Skip(t, err)
	}
	task, err := realdata.Task("buildah-remote-0.10.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := stack.StaticHostConfig(staticPlatform, 1)
	stack.AddDynamicPlatform(data, vmPlatform, devstack.DynamicSettings{Provider: devstack.ProviderAWS, MaxInstances: 1})
	stacktest.ApplyConfig(t, stack, data)
	ns := stacktest.Namespace(t, stack)

	registry := closedLoopbackAddress(t)
	image := registry + "/team/app:v1"
	task.SetNamespace(ns)
	create(t, task)
	// The build pipeline's ServiceAccount, with push credentials for that registry as a
	// Konflux pipeline's has them: the stand-in puts them in $HOME/.docker, which the build
	// step syncs to the host.
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry-push", Namespace: ns},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"` + registry + `":{"auth":"dXNlcjpwYXNz"}}}`)}})
	create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "build-pipeline", Namespace: ns},
		Secrets: []corev1.ObjectReference{{Name: "registry-push"}}})

	cloneSources(t, ns, "build-static", "build-vm")
	before := map[string]bool{}
	for _, inst := range stack.VMCloud.Instances() {
		before[inst.ID] = true
	}
	// The VM's first: it takes a launch and a boot before its build can start.
	vm := &realTaskRun{tr: startRealBuild(t, ns, "build-vm", vmPlatform, image), builtOn: "the VM"}
	static := &realTaskRun{tr: startRealBuild(t, ns, "build-static", staticPlatform, image), builtOn: "the static host"}

	// Each build step gets its own build user: on the static host, and on a VM launched for it.
	host := stack.Fleet.Hosts[0]
	static.login = loginOf(t, static.tr)
	if !strings.HasSuffix(static.login, "@"+host.Address) {
		t.Fatalf("%s is sent to %s, want a build user of %s", static.tr.Name, static.login, host.Address)
	}
	vm.login = loginOf(t, vm.tr)
	for _, inst := range stack.VMCloud.Instances() {
		if !before[inst.ID] {
			if vm.vm != "" {
				t.Fatalf("two VMs launched for one task: %s and %s", vm.vm, inst.ID)
			}
			vm.vm = inst.ID
			if inst.State != vmcloud.Running || !strings.HasSuffix(vm.login, "@"+inst.Address) {
				t.Fatalf("%s is sent to %s; the VM launched for it, %s, is %s at %q", vm.tr.Name, vm.login, inst.ID, inst.State, inst.Address)
			}
		}
	}
	if vm.vm == "" {
		t.Fatalf("no VM was launched for %s", vm.tr.Name)
	}

	for _, run := range []*realTaskRun{static, vm} {
		ended := endOf(t, run.tr)
		key := client.ObjectKeyFromObject(run.tr)
		build, err := stack.StandIn.StepLog(key, "build")
		if err != nil {
			t.Fatal(err)
		}
		push, err := stack.StandIn.StepLog(key, "push")
		if err != nil {
			t.Fatal(err)
		}
		if c := ended.Status.GetCondition("Succeeded"); c == nil || c.IsTrue() || !strings.Contains(c.Message, `"step-push" exited with code 1`) {
			t.Fatalf("%s ended with %+v; want the push step to fail it\nbuild step:\n%s\npush step:\n%s", run.tr.Name, c, build, push)
		}
		steps := map[string]pipelinev1.StepState{}
		for _, s := range ended.Status.Steps {
			steps[s.Name] = s
		}
		if s := steps["build"]; s.Terminated == nil || s.Terminated.ExitCode != 0 {
			t.Errorf("%s's build step on %s did not succeed: %+v\n%s", run.tr.Name, run.builtOn, s.ContainerState, build)
		}
		// The step built remotely as the secret's user, and the image came back to the pod.
		for _, want := range []string{"Build on remote host " + run.login + " finished", registry + "/team/app"} {
			if !strings.Contains(string(build), want) {
				t.Errorf("the build step of %s on %s wrote no %q:\n%s", run.tr.Name, run.builtOn, want, build)
			}
		}
		if s := steps["push"]; s.Terminated == nil || s.Terminated.ExitCode == 0 {
			t.Errorf("%s's push step did not fail: %+v", run.tr.Name, s.ContainerState)
		}
		for _, want := range []string{"Failed to push image to " + registry + "/team/app:" + run.tr.Name, "dial tcp " + registry + ": connect: connection refused"} {
			if !strings.Contains(string(push), want) {
				t.Errorf("the push step of %s wrote no %q:\n%s", run.tr.Name, want, push)
			}
		}
		for _, later := range []string{"sbom-syft-generate", "prepare-sboms", "upload-sbom"} {
			if s := steps[later]; s.TerminationReason != "Skipped" {
				t.Errorf("%s's step %s after the failed push: %q, want Skipped", run.tr.Name, later, s.TerminationReason)
			}
		}
	}

	// berth cleans up: the records go, the static host has no build user left, and the VM
	// is terminated.
	for _, run := range []*realTaskRun{static, vm} {
		stacktest.Eventually(t, "berth's record of "+run.tr.Name+" is gone", func() (bool, error) {
			err := admin().Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: string(run.tr.UID)}, &berthv1.Allocation{})
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
	}
	if users, err := host.BuildUsers(ctx); err != nil || len(users) > 0 {
		t.Errorf("build users left on %s: %v %v", host.Name, users, err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, stacktest.Patience)
	defer cancel()
	if _, err := stack.VMCloud.WaitFor(waitCtx, vm.vm, vmcloud.Gone); err != nil {
		t.Errorf("the VM of %s was not terminated after it: %v", vm.tr.Name, err)
	}
}

// cloneSources fills a workspace claim for each build with sources, as the pipeline's clone
// task would: the claim <build>-source.
func cloneSources(t *testing.T, ns string, builds ...string) {
	t.Helper()
	var clones []*pipelinev1.TaskRun
	for _, build := range builds {
		create(t, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: build + "-source", Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			}})
		clone := &pipelinev1.TaskRun{
			ObjectMeta: metav1.ObjectMeta{Name: build + "-clone", Namespace: ns, Labels: map[string]string{stacktest.RunScriptKey: "true"}},
			Spec: pipelinev1.TaskRunSpec{
				TaskSpec: &pipelinev1.TaskSpec{
					Workspaces: []pipelinev1.WorkspaceDeclaration{{Name: "output"}},
					Steps: []pipelinev1.Step{{Name: "clone", Image: "quay.io/konflux-ci/git-clone", Script: `#!/bin/bash
set -euo pipefail
mkdir -p $(workspaces.output.path)/source/app
printf 'FROM scratch\nCOPY app /app\n' > $(workspaces.output.path)/source/Dockerfile
printf 'package main\n\nfunc main() {}\n' > $(workspaces.output.path)/source/app/main.go
`}},
				},
				Workspaces: []pipelinev1.WorkspaceBinding{{Name: "output",
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: build + "-source"}}},
			},
		}
		create(t, clone)
		clones = append(clones, clone)
	}
	for _, clone := range clones {
		if c := endOf(t, clone).Status.GetCondition("Succeeded"); !c.IsTrue() {
			t.Fatalf("%s failed: %s", clone.Name, c.Message)
		}
	}
}

// startRealBuild creates a TaskRun of the real Task on the sources cloneSources left for it,
// for platform, pushing to image.
func startRealBuild(t *testing.T, ns, name, platform, image string) *pipelinev1.TaskRun {
	t.Helper()
	workspace := &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name + "-source"}
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{stacktest.RunScriptKey: "true"}},
		Spec: pipelinev1.TaskRunSpec{
			TaskRef:            &pipelinev1.TaskRef{Name: "buildah-remote"},
			ServiceAccountName: "build-pipeline",
			Params: pipelinev1.Params{
				{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)},
				{Name: "IMAGE", Value: *pipelinev1.NewStructuredValues(image)},
			},
			Workspaces: []pipelinev1.WorkspaceBinding{{Name: "source", PersistentVolumeClaim: workspace}},
			// One try of the task images' retry around each push instead of three: buildah's
			// own --retry 3 still runs, and the push fails the same way in a third of the time.
			PodTemplate: &tektonpod.PodTemplate{Env: []corev1.EnvVar{{Name: "RETRY_MAX_TRIES", Value: "1"}}},
		},
	}
	create(t, tr)
	return tr
}

// loginOf waits for the task's secret and returns its host (user@address), failing the test
// on an error secret.
func loginOf(t *testing.T, tr *pipelinev1.TaskRun) string {
	t.Helper()
	secret := stacktest.SecretOf(t, admin(), tr)
	if msg := secret.Data["error"]; len(msg) > 0 {
		t.Fatalf("%s got an error secret: %s", tr.Name, msg)
	}
	login := string(secret.Data["host"])
	if user, _, _ := strings.Cut(login, "@"); !strings.HasPrefix(user, "u-") {
		t.Fatalf("%s's secret sends it to %q, want a build user of berth's", tr.Name, login)
	}
	return login
}

// endOf waits for the TaskRun to end and returns it. A real build takes tens of seconds on
// two cores, the push step's retries included.
func endOf(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	var now *pipelinev1.TaskRun
	stacktest.EventuallyWithin(t, 3*time.Minute, 200*time.Millisecond, tr.Name+" ends", func() (bool, error) {
		now = stacktest.Get(t, admin(), tr)
		return now.IsDone(), nil
	})
	return now
}

// closedLoopbackAddress is 127.0.0.1 at a port nothing listens on: where the test's registry
// is, so that every push fails at once and nothing leaves the machine.
func closedLoopbackAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := admin().Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %s %s: %v", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
}
