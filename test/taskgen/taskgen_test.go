// Package taskgen_test runs what `berth taskgen` makes. The remote twin of a buildah-shaped
// Task (internal/taskgen/testdata/buildah.yaml) is applied to a real apiserver; a TaskRun of
// it asks for a platform; berth's controller gives it a host (a real sshd host of the test
// ground) and writes its secret; and the Tekton stand-in runs the Task's steps, the rewritten
// build step among them, as a pod would. The build then runs on the host as berth's build
// user, in a rootless container of the host's podman stand-in, on the sources a clone TaskRun
// left in the workspace, and what it writes comes back for the steps that stay in the pod.
package taskgen_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/cli"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/hostops"
)

var stack *devstack.Stack

const (
	remotePlatform = "linux/arm64"
	localPlatform  = "linux/x86_64" // as production configs list it in local-platforms
	image          = "registry.test/team/app:v1"
	containerfile  = "FROM scratch\nCOPY app /app\n"
)

// Values that a careless quoting would change on the way to the host.
var (
	sourceURL = `https://git.test/team/app it's "quoted" $HOME`
	buildArgs = []string{`GREETING=it's "quoted" $HOME`, "EMPTY=", "MULTI=line one\nline two"}
)

func TestMain(m *testing.M) { os.Exit(stacktest.Main(m, &stack, 1, stacktest.Options())) }

func TestBuildStepRunsOnTheHostAsTheBuildUser(t *testing.T) {
	if err := sshhosts.BuildPrerequisites(); err != nil {
		missing.Skip(t, err)
	}
	ns := setUp(t)
	tr := run(t, ns, remotePlatform)
	host := stack.Fleet.Hosts[0]

	results := resultsOf(t, tr)
	inspection := sections(results["INSPECTION"])
	user, address, _ := strings.Cut(inspection["secret host"], "@")
	if address != host.Address || !strings.HasPrefix(user, "u-") {
		t.Fatalf("the step ran against host %q, want berth's build user at %s", inspection["secret host"], host.Address)
	}

	// On the host, as berth's build user: its name and uid, the host's own name; the file the
	// build wrote into the synced workspace is the user's; the podman stand-in ran the step's
	// image and script with the step's args, unchanged.
	onHost := strings.Split(inspection["on host"], "\n")
	if len(onHost) < 5 || onHost[0] != user || onHost[2] != host.Name || onHost[3] != user {
		t.Fatalf("on the host: %q; want %s's name, uid, hostname %s, and %s owning build-info", onHost, user, host.Name, user)
	}
	uid := onHost[1]
	if inspection["image"] != "layer.sha256\nlayer.tar" {
		t.Errorf("/shared/image holds %q; want the layer and the sum the host epilogue wrote", inspection["image"])
	}
	wantRun := "ran quay.io/konflux-ci/buildah-task:latest@sha256:4c470b5a153c4acd14bf4f8731b5e36c61d7faafe09c2bf376bb81ce84aa5709 /bin/sh -c \"$0\" \"$@\" && exec /tekton/scripts/build-epilogue.sh /tekton/scripts/build.sh --build-args " +
		strings.Join(buildArgs, " ") + " as " + user + " (uid " + uid + ")"
	if !strings.Contains(inspection["on host"], wantRun) {
		t.Errorf("the stand-in's log on the host has no %q:\n%s", wantRun, inspection["on host"])
	}

	// In the container: root mapped to the build user, as rootless podman maps it, the
	// Containerfile read from the synced sources, and every value exactly as the pod had it.
	info := buildInfo(t, inspection["build-info"])
	if !strings.HasPrefix(info["user-namespace"], "0 "+uid+" 1,1 ") {
		t.Errorf("the build's user namespace %q: want root as uid %s (%s), the other ids from its subordinate range", info["user-namespace"], uid, user)
	}
	sourcesAndValuesArrived(t, info)
	resultsCameBack(t, results)
}

func TestLocalPlatformRunsTheStepInThePod(t *testing.T) {
	ns := setUp(t)
	tr := run(t, ns, localPlatform)
	results := resultsOf(t, tr)
	inspection := sections(results["INSPECTION"])
	if inspection["secret host"] != contract.Localhost || inspection["on host"] != "" {
		t.Fatalf("a local platform's TaskRun: %q", results["INSPECTION"])
	}
	if inspection["image"] != "layer.tar" {
		t.Errorf("/shared/image holds %q; want the layer alone: the epilogues are for a build host", inspection["image"])
	}
	info := buildInfo(t, inspection["build-info"])
	if !strings.HasPrefix(info["user-namespace"], "0 0 ") {
		t.Errorf("the build's user namespace %q: want the pod's own, not a build host's", info["user-namespace"])
	}
	sourcesAndValuesArrived(t, info)
	resultsCameBack(t, results)
}

// berth found no host: the step prints berth's message and fails, before it touches anything.
func TestErrorSecretFailsTheStep(t *testing.T) {
	ns := setUp(t)
	msg := failed(t, start(t, ns, "build", "linux/riscv64"))
	if !strings.Contains(msg, `"step-build" exited with code 1`) || !strings.Contains(msg, `platform "linux/riscv64" is not configured`) {
		t.Fatalf("the TaskRun failed with %q; want the build step to print berth's error and fail", msg)
	}
	if strings.Contains(msg, "runs on") {
		t.Fatalf("the step went on after the error: %q", msg)
	}
}

// With berth's one-time keys (the controller restarted with its key server on) the secret
// berth writes holds a token, not the key: the build step redeems it at berth's key server
// with curl, the server's certificate checked against otp-ca, and builds on the host as the
// TaskRun's build user. The twin then runs its build step a second time in the same pod, with
// the same secret, as a retried TaskRun would: the token is spent, and the step fails saying
// so before it touches the host.
func TestOTPBuildStepRedeemsTheKeyOnce(t *testing.T) {
	if err := sshhosts.BuildPrerequisites(); err != nil {
		missing.Skip(t, err)
	}
	stacktest.OTPController(t, stack, stacktest.Options())
	ns := setUp(t, addRetry)
	tr := run(t, ns, remotePlatform)

	results := resultsOf(t, tr)
	inspection := sections(results["INSPECTION"])
	if got, want := inspection["secret"], "host\notp\notp-ca\notp-server\nuser-dir"; got != want {
		t.Fatalf("the step saw a secret of %q; want %q: berth's token and key server, no key", got, want)
	}
	user := hostops.UserName(string(tr.UID), 1)
	if want := user + "@" + stack.Fleet.Hosts[0].Address; inspection["secret host"] != want {
		t.Fatalf("the step ran against host %q, want %s", inspection["secret host"], want)
	}
	// Root in the build's container is a user of the host, not the pod's root: the key the
	// step redeemed logged it in as the build user.
	info := buildInfo(t, inspection["build-info"])
	if mapping := info["user-namespace"]; !strings.HasPrefix(mapping, "0 ") || strings.HasPrefix(mapping, "0 0 ") {
		t.Errorf("the build's user namespace %q: want root mapped to %s, as rootless podman on the host maps it", mapping, user)
	}
	sourcesAndValuesArrived(t, info)
	resultsCameBack(t, results)

	retry := results["RETRY"]
	if !strings.Contains(retry, "did not hand out this TaskRun's key") || !strings.Contains(retry, "returned error: 404") {
		t.Errorf("the build step run again with the spent token said %q; want the key server's refusal and the step's reason", retry)
	}
	if strings.Contains(retry, "runs on") {
		t.Errorf("the build step run again went on after the refusal: %q", retry)
	}
}

// addRetry adds to the twin a second run of its build step, last, with the same script and
// secret, its output in the result RETRY. It is let fail (onError: continue), so
// the TaskRun's results stay to be checked.
func addRetry(task *pipelinev1.Task) {
	for _, step := range task.Spec.Steps {
		if step.Name != "build" {
			continue
		}
		retry := *step.DeepCopy()
		retry.Name = "retry"
		retry.OnError = pipelinev1.Continue
		shebang, rest, _ := strings.Cut(retry.Script, "\n")
		retry.Script = shebang + "\nexec >$(results.RETRY.path) 2>&1\n" + rest
		task.Spec.Steps = append(task.Spec.Steps, retry)
		task.Spec.Results = append(task.Spec.Results, pipelinev1.TaskResult{Name: "RETRY"})
		return
	}
	panic("the twin has no build step")
}

// setUp makes a namespace with the twin of testdata's buildah Task, made by `berth taskgen`
// with an inspect step added, the entitlement secret its build mounts, and a workspace claim
// holding the sources a clone TaskRun wrote; and puts in force a config with one static host
// for remotePlatform and localPlatform as local. With edit, the twin is edited first.
func setUp(t *testing.T, edit ...func(*pipelinev1.Task)) string {
	t.Helper()
	stacktest.ApplyConfig(t, stack, stack.StaticHostConfig(remotePlatform, 2, localPlatform))
	ns := stacktest.Namespace(t, stack)
	ctx := context.Background()

	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := cli.NewRootCommand()
	var twin, stderr bytes.Buffer
	cmd.SetOut(&twin)
	cmd.SetErr(&stderr)
	// The epilogues check the image's layer on its way back: summed on the host after the
	// build, checked in the pod once it is back.
	cmd.SetArgs([]string{"taskgen", filepath.Join(root, "internal", "taskgen", "testdata", "buildah.yaml"),
		"--host-epilogue", "cd /shared/image && sha256sum layer.tar > layer.sha256",
		"--pod-epilogue", "cd /shared/image && sha256sum -c layer.sha256"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("berth taskgen: %v: %s", err, stderr.String())
	}
	var task pipelinev1.Task
	if err := yaml.UnmarshalStrict(twin.Bytes(), &task); err != nil {
		t.Fatal(err)
	}
	task.Namespace = ns
	addInspection(&task)
	for _, e := range edit {
		e(&task)
	}
	create(t, &task)

	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "etc-pki-entitlement", Namespace: ns},
		Data: map[string][]byte{"cert.pem": []byte("not a real certificate\n")}})
	create(t, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "source", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		}})
	clone := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "clone", Namespace: ns, Labels: map[string]string{stacktest.RunScriptKey: "true"}},
		Spec: pipelinev1.TaskRunSpec{
			TaskSpec: &pipelinev1.TaskSpec{
				Workspaces: []pipelinev1.WorkspaceDeclaration{{Name: "output"}},
				Params:     []pipelinev1.ParamSpec{{Name: "CONTAINERFILE", Type: pipelinev1.ParamTypeString}},
				Steps: []pipelinev1.Step{{Name: "clone", Image: "quay.io/konflux-ci/git-clone", Env: []corev1.EnvVar{{Name: "CONTAINERFILE", Value: "$(params.CONTAINERFILE)"}},
					Script: `#!/bin/bash
set -euo pipefail
src=$(workspaces.output.path)/source
mkdir -p "$src/app" "$src/docs"
printf '%s' "$CONTAINERFILE" > "$src/Dockerfile"
printf 'package main\n\nfunc main() {}\n' > "$src/app/main.go"
printf 'text\n' > "$src/docs/a file with spaces & 'quotes'.txt"
`}},
			},
			Params:     pipelinev1.Params{{Name: "CONTAINERFILE", Value: *pipelinev1.NewStructuredValues(containerfile)}},
			Workspaces: []pipelinev1.WorkspaceBinding{{Name: "output", PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "source"}}},
		},
	}
	create(t, clone)
	done(t, clone)
	return ns
}

// addInspection adds the test's instrument to the twin: a last step, in the pod, that reports
// in the result INSPECTION what the build left in the workspace, the keys of berth's secret
// and, for a remote platform whose secret holds the key, what the host says about the build
// user while the TaskRun still holds it (berth removes the user once the TaskRun ends).
func addInspection(task *pipelinev1.Task) {
	task.Spec.Results = append(task.Spec.Results, pipelinev1.TaskResult{Name: "INSPECTION"})
	task.Spec.Steps = append(task.Spec.Steps, pipelinev1.Step{
		Name:         "inspect",
		Image:        "quay.io/konflux-ci/task-runner:1.6.0",
		VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}},
		Script: `#!/bin/bash
set -euo pipefail
{
  echo "== build-info"
  cat "$(workspaces.source.path)/build-info"
  echo "== image"
  ls /shared/image
  echo "== secret"
  ls /ssh
  echo "== secret host"
  cat /ssh/host
  echo
  echo "== on host"
  if [ "$(cat /ssh/host)" != localhost ] && [ -e /ssh/id_rsa ]; then
    install -m 600 /ssh/id_rsa /tmp/key
    ssh -i /tmp/key -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "$(cat /ssh/host)" \
      "id -un; id -u; uname -n; stat -c %U $(cat /ssh/user-dir)/workspaces/source/build-info; cat ~/podman-standin.log"
  fi
} > "$(results.INSPECTION.path)"
`,
	})
}

// run runs the twin for platform on the workspace of setUp and returns the TaskRun, done.
func run(t *testing.T, ns, platform string) *pipelinev1.TaskRun {
	t.Helper()
	return done(t, start(t, ns, "build", platform))
}

// start creates a TaskRun of the twin for platform on the workspace of setUp.
func start(t *testing.T, ns, name, platform string) *pipelinev1.TaskRun {
	t.Helper()
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{stacktest.RunScriptKey: "true"}},
		Spec: pipelinev1.TaskRunSpec{
			TaskRef: &pipelinev1.TaskRef{Name: "buildah-remote"},
			Params: pipelinev1.Params{
				{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)},
				{Name: "IMAGE", Value: *pipelinev1.NewStructuredValues(image)},
				{Name: "COMMIT_SHA", Value: *pipelinev1.NewStructuredValues("0123abcd")},
				{Name: "SOURCE_URL", Value: *pipelinev1.NewStructuredValues(sourceURL)},
				{Name: "BUILD_ARGS", Value: *pipelinev1.NewStructuredValues(buildArgs[0], buildArgs[1:]...)},
			},
			Workspaces: []pipelinev1.WorkspaceBinding{{Name: "source", PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "source"}}},
		},
	}
	create(t, tr)
	return tr
}

// done waits for the TaskRun to end and fails the test unless it succeeded.
func done(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	now := ended(t, tr)
	if !now.IsSuccessful() {
		c := now.Status.GetCondition("Succeeded")
		t.Fatalf("%s failed: %s: %s", tr.Name, c.Reason, c.Message)
	}
	return now
}

// failed waits for the TaskRun to end, fails the test if it succeeded, and returns the
// message it failed with.
func failed(t *testing.T, tr *pipelinev1.TaskRun) string {
	t.Helper()
	now := ended(t, tr)
	if now.IsSuccessful() {
		t.Fatalf("%s succeeded", tr.Name)
	}
	return now.Status.GetCondition("Succeeded").Message
}

func ended(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	var now *pipelinev1.TaskRun
	stacktest.Eventually(t, tr.Name+" ends", func() (bool, error) {
		now = stacktest.Get(t, stack.ControlPlane.Client, tr)
		return now.IsDone(), nil
	})
	return now
}

func resultsOf(t *testing.T, tr *pipelinev1.TaskRun) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range tr.Status.Results {
		out[r.Name] = r.Value.StringVal
	}
	return out
}

// sections splits the inspection into its "== name" parts.
func sections(s string) map[string]string {
	out := map[string]string{}
	for _, part := range strings.Split(s, "== ")[1:] {
		name, body, _ := strings.Cut(part, "\n")
		out[name] = strings.TrimSuffix(body, "\n")
	}
	return out
}

// buildInfo reads the build's key=value lines; build-arg lines collect under "build-arg",
// one per line (a value's own newlines are in the file as they came).
func buildInfo(t *testing.T, s string) map[string]string {
	t.Helper()
	out := map[string]string{}
	key := ""
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || !regexp.MustCompile(`^[a-z-]+$`).MatchString(k) {
			out[key] += "\n" + line // the rest of a value with newlines
			continue
		}
		key = k
		if k == "build-arg" && out[k] != "" {
			out[k] += "\x00" + v
			continue
		}
		out[k] = v
	}
	if len(out) < 5 {
		t.Fatalf("build-info %q", s)
	}
	return out
}

func sourcesAndValuesArrived(t *testing.T, info map[string]string) {
	t.Helper()
	sum := sha256.Sum256([]byte(containerfile))
	if got := info["containerfile"]; got != hex.EncodeToString(sum[:]) {
		t.Errorf("the build read a Containerfile of digest %s, want that of the sources the clone wrote", got)
	}
	if got := info["source"]; got != sourceURL {
		t.Errorf("SOURCE_URL reached the build as %q, want %q", got, sourceURL)
	}
	if got := strings.Split(info["build-arg"], "\x00"); strings.Join(got, "|") != strings.Join(buildArgs, "|") {
		t.Errorf("the build's args %q, want %q", got, buildArgs)
	}
	if info["commit"] != "0123abcd" || info["entitlements"] != "cert.pem" {
		t.Errorf("commit %q, entitlements %q: want the param's value and the secret's key", info["commit"], info["entitlements"])
	}
}

// resultsCameBack checks the results: the build's digest came back (from the host, for a
// remote platform), and the steps that stayed in the pod used it and what the build left in
// /shared and the workspace.
func resultsCameBack(t *testing.T, results map[string]string) {
	t.Helper()
	digest := results["IMAGE_DIGEST"]
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(digest) {
		t.Fatalf("IMAGE_DIGEST %q", digest)
	}
	if results["IMAGE_URL"] != image || results["IMAGE_REF"] != image+"@"+digest {
		t.Errorf("IMAGE_URL %q, IMAGE_REF %q: want %s and %s@%s", results["IMAGE_URL"], results["IMAGE_REF"], image, image, digest)
	}
	if !strings.HasPrefix(results["SBOM_BLOB_URL"], "registry.test/team/app@sha256:") {
		t.Errorf("SBOM_BLOB_URL %q", results["SBOM_BLOB_URL"])
	}
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := stack.ControlPlane.Client.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}
