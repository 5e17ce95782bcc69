package tektonstandin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/missing"
)

// needRoot skips a test that runs steps in sandboxes, except in CI, where it must run.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	missing.Skip(t, "this test needs root (mount and PID namespaces)")
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := cp.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

func strParam(name, value string) pipelinev1.Param {
	return pipelinev1.Param{Name: name, Value: *pipelinev1.NewStructuredValues(value)}
}

func arrayParam(name string, values ...string) pipelinev1.Param {
	return pipelinev1.Param{Name: name, Value: pipelinev1.ParamValue{Type: pipelinev1.ParamTypeArray, ArrayVal: values}}
}

func result(tr *pipelinev1.TaskRun, name string) string {
	for _, r := range tr.Status.Results {
		if r.Name == name {
			return r.Value.StringVal
		}
	}
	return ""
}

func condition(tr *pipelinev1.TaskRun) apis.Condition {
	if c := tr.Status.GetCondition(apis.ConditionSucceeded); c != nil {
		return *c
	}
	return apis.Condition{}
}

func claim(ns, name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}

// The Tekton features of the catalog's buildah-remote, in a Task of the same shape
// (testdata/remote-build-task.yaml): a clone TaskRun fills a claim, the build TaskRun waits
// for the secret berth would create and then sees every value and file where Tekton puts it.
func TestRemoteBuildShapedTask(t *testing.T) {
	needRoot(t)
	ns := namespace(t)
	data, err := os.ReadFile(filepath.Join("testdata", "remote-build-task.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	task := &pipelinev1.Task{}
	if err := yaml.UnmarshalStrict(data, task); err != nil {
		t.Fatal(err)
	}
	task.Namespace = ns
	account := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "build-pipeline", Namespace: ns},
		Secrets: []corev1.ObjectReference{{Name: "registry-push"}, {Name: "not-there"}}}
	pushSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry-push", Namespace: ns},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry.invalid":{"auth":"dTpw"}}}`)}}
	ca := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "trusted-ca", Namespace: ns},
		Data: map[string]string{"bundle.pem": "CA-FROM-PARAM-KEY", "ca-bundle.crt": "default key, not asked for"}}
	create(t, task, account, pushSecret, ca, claim(ns, "source"))

	source := []pipelinev1.WorkspaceBinding{{Name: "source", PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "source"}}}
	clone := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "clone", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{Workspaces: source, TaskSpec: &pipelinev1.TaskSpec{
			Workspaces: []pipelinev1.WorkspaceDeclaration{{Name: "output"}},
			Steps:      []pipelinev1.Step{{Name: "clone", Image: "x", Script: "echo 'FROM scratch' > $(workspaces.output.path)/Containerfile"}},
		}},
	}
	clone.Spec.Workspaces = []pipelinev1.WorkspaceBinding{{Name: "output", PersistentVolumeClaim: source[0].PersistentVolumeClaim}}
	create(t, clone)
	if got := waitFor(t, client.ObjectKeyFromObject(clone), "finished", done); !got.IsSuccessful() {
		t.Fatalf("clone failed: %+v", condition(got))
	}

	build := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "build", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			TaskRef:            &pipelinev1.TaskRef{Name: "remote-build-shape"},
			ServiceAccountName: "build-pipeline",
			Workspaces:         source,
			Params: pipelinev1.Params{
				strParam("PLATFORM", "linux/s390x"),
				strParam("IMAGE", "registry.invalid/team/app:abc"),
				arrayParam("BUILD_ARGS", "A=1", "B=two words"),
				strParam("CA_CONFIG_MAP_KEY", "bundle.pem"),
			},
		},
	}
	create(t, build)
	key := client.ObjectKeyFromObject(build)
	pending := waitFor(t, key, "waiting for its secret", func(tr *pipelinev1.TaskRun) bool { return condition(tr).Reason == reasonPending })
	if c := condition(pending); c.Status != corev1.ConditionUnknown || !strings.Contains(c.Message, "secret multi-platform-ssh-build (volume ssh)") {
		t.Fatalf("a run waiting for berth's secret must say so and only that: %+v", c)
	}
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "multi-platform-ssh-build", Namespace: ns}, Data: map[string][]byte{
		"id_rsa": []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"),
		"host":   []byte("u-abc@198.18.1.2"), "user-dir": []byte("/home/u-abc/build"),
	}})
	got := waitFor(t, key, "finished", done)
	if !got.IsSuccessful() {
		t.Fatalf("build failed: %s", condition(got).Message)
	}
	seen := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(result(got, "SEEN")), "\n") {
		k, v, _ := strings.Cut(line, "=")
		seen[k] = v
	}
	for k, want := range map[string]string{
		"args":           "[--build-args][A=1][B=two words][--labels]", // an empty array leaves nothing
		"env":            "linux/s390x|registry.invalid/team/app:abc|build",
		"cwd":            "/workspace/source",
		"host":           "u-abc@198.18.1.2",
		"activation-key": "0", // optional secret that does not exist: an empty directory
		"trusted-ca":     "CA-FROM-PARAM-KEY",
		"proxy-ca":       "0",
		"docker":         "registry.invalid",
		"ssh-key":        "-----BEGIN OPENSSH PRIVATE KEY-----",
		"rsync":          "/shared/docker-copy: config.json  /shared/source-copy: Containerfile build.log ",
		"tools":          "/usr/bin/retry retry-ok OpenSSH buildah",
		"url":            "registry.invalid/team/app:abc",
		"token-parts":    "3",
		"subpath":        "CA-FROM-PARAM-KEY",
		"build-log":      "built from FROM scratch",
	} {
		if seen[k] != want {
			t.Errorf("%s: the step saw %q, want %q", k, seen[k], want)
		}
	}
	if url := result(got, "IMAGE_URL"); url != "registry.invalid/team/app:abc" {
		t.Errorf("IMAGE_URL written to /tekton/results: got %q", url)
	}
	if d := result(got, "IMAGE_DIGEST"); !strings.HasPrefix(d, "sha256:") || len(d) != len("sha256:")+64 {
		t.Errorf("IMAGE_DIGEST written to $(results.IMAGE_DIGEST.path): got %q", d)
	}
	if t.Failed() {
		t.Logf("report:\n%s", result(got, "SEEN"))
	}
}

// A TaskRun the stand-in cannot run fails at once, with a reason and a message that name
// what is missing; none is left Running.
func TestUnsupportedOrInvalidFailsWithReason(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	ns := namespace(t)
	script := func(s string) pipelinev1.Step { return pipelinev1.Step{Name: "s", Image: "x", Script: s} }
	for _, tc := range []struct {
		name, reason, message string
		spec                  pipelinev1.TaskSpec
		run                   func(*pipelinev1.TaskRunSpec)
	}{
		{name: "sidecar", reason: ReasonUnsupported, message: "sidecars",
			spec: pipelinev1.TaskSpec{Steps: []pipelinev1.Step{script("true")}, Sidecars: []pipelinev1.Sidecar{{Name: "db", Image: "x"}}}},
		{name: "hostpath", reason: ReasonUnsupported, message: `volume "host"`,
			spec: pipelinev1.TaskSpec{Steps: []pipelinev1.Step{script("true")},
				Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}}},
		{name: "non-root", reason: ReasonUnsupported, message: "other than root",
			spec: pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "s", Image: "x", Script: "true",
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr(int64(1000))}}}}},
		{name: "resolver", reason: ReasonUnsupported, message: `resolver "bundles"`,
			run: func(s *pipelinev1.TaskRunSpec) {
				s.TaskSpec, s.TaskRef = nil, &pipelinev1.TaskRef{ResolverRef: pipelinev1.ResolverRef{Resolver: "bundles"}}
			}},
		{name: "undeclared-param", reason: reasonValidationFailed, message: "$(params.NOPE)",
			spec: pipelinev1.TaskSpec{Steps: []pipelinev1.Step{script("echo $(params.NOPE)")}}},
		{name: "array-in-string", reason: reasonValidationFailed, message: "$(params.LIST[*])",
			spec: pipelinev1.TaskSpec{Params: []pipelinev1.ParamSpec{{Name: "LIST", Type: pipelinev1.ParamTypeArray,
				Default: pipelinev1.NewStructuredValues("a", "b")}}, Steps: []pipelinev1.Step{script("echo $(params.LIST[*])")}}},
		{name: "missing-param", reason: reasonValidationFailed, message: "missing parameters: IMAGE",
			spec: pipelinev1.TaskSpec{Params: []pipelinev1.ParamSpec{{Name: "IMAGE", Type: pipelinev1.ParamTypeString}}, Steps: []pipelinev1.Step{script("true")}}},
		{name: "unbound-workspace", reason: reasonValidationFailed, message: `workspace "source"`,
			spec: pipelinev1.TaskSpec{Workspaces: []pipelinev1.WorkspaceDeclaration{{Name: "source"}}, Steps: []pipelinev1.Step{script("true")}}},
		{name: "missing-claim", reason: reasonCreateConfigError, message: "persistentVolumeClaim",
			spec: pipelinev1.TaskSpec{Workspaces: []pipelinev1.WorkspaceDeclaration{{Name: "source"}}, Steps: []pipelinev1.Step{script("true")}},
			run: func(s *pipelinev1.TaskRunSpec) {
				s.Workspaces = []pipelinev1.WorkspaceBinding{{Name: "source", PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "nope"}}}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			tr := &pipelinev1.TaskRun{
				ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: ns},
				Spec:       pipelinev1.TaskRunSpec{TaskSpec: &spec},
			}
			if tc.run != nil {
				tc.run(&tr.Spec)
			}
			if err := cp.Client.Create(ctx, tr); err != nil {
				t.Fatal(err)
			}
			got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
			c := condition(got)
			if c.Status != corev1.ConditionFalse || c.Reason != tc.reason || !strings.Contains(c.Message, tc.message) {
				t.Fatalf("want Succeeded=False, reason %s, message naming %q; got %s %s %q", tc.reason, tc.message, c.Status, c.Reason, c.Message)
			}
		})
	}
}

// A TaskRun whose time is up ends as Tekton ends it, whether its step is running or its pod
// is still waiting for a secret that never comes.
func TestTimeoutEndsTheRun(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	ns := namespace(t)
	second := &metav1.Duration{Duration: 1e9}
	running := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeps", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{Timeout: second, TaskSpec: &pipelinev1.TaskSpec{
			Steps: []pipelinev1.Step{{Name: "s", Image: "x", Script: "sleep 300"}}}},
	}
	waiting := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "waits", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{Timeout: second, TaskSpec: &pipelinev1.TaskSpec{
			Steps:   []pipelinev1.Step{{Name: "s", Image: "x", Script: "true", VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh"}}}},
			Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "never"}}}}}},
	}
	for _, tr := range []*pipelinev1.TaskRun{running, waiting} {
		if err := cp.Client.Create(ctx, tr); err != nil {
			t.Fatal(err)
		}
	}
	for _, tr := range []*pipelinev1.TaskRun{running, waiting} {
		c := condition(waitFor(t, client.ObjectKeyFromObject(tr), "finished", done))
		if c.Status != corev1.ConditionFalse || c.Reason != reasonTaskRunTimeout || !strings.Contains(c.Message, `failed to finish within "1s"`) {
			t.Errorf("%s: want a TaskRunTimeout failure, got %+v", tr.Name, c)
		}
	}
}

// onError: continue lets the task go on, and the next step reads the exit code where Tekton
// puts it; a step's own timeout fails the run naming the step.
func TestStepExitCodesAndTimeouts(t *testing.T) {
	needRoot(t)
	ns := namespace(t)
	codes := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "codes", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{
			Results: []pipelinev1.TaskResult{{Name: "code"}},
			Steps: []pipelinev1.Step{
				{Name: "first", Image: "x", Script: "exit 3", OnError: pipelinev1.Continue},
				{Name: "second", Image: "x", Script: "cat $(steps.step-first.exitCode.path) > $(results.code.path)"},
			}}},
	}
	slow := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "slow-step", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{
			Steps: []pipelinev1.Step{{Name: "slow", Image: "x", Script: "sleep 300", Timeout: &metav1.Duration{Duration: 1e9}}}}},
	}
	create(t, codes, slow)
	got := waitFor(t, client.ObjectKeyFromObject(codes), "finished", done)
	if !got.IsSuccessful() || result(got, "code") != "3" {
		t.Errorf("want success with the first step's exit code 3 as result, got %+v results %+v", condition(got), got.Status.Results)
	}
	got = waitFor(t, client.ObjectKeyFromObject(slow), "finished", done)
	if c := condition(got); c.Status != corev1.ConditionFalse || !strings.Contains(c.Message, "step-slow exceeded its timeout of 1s") {
		t.Errorf("want the step's timeout to fail the run, got %+v", c)
	}
	if s := got.Status.Steps; len(s) != 1 || s[0].TerminationReason != "TimeoutExceeded" || s[0].Terminated == nil || s[0].Terminated.ExitCode != 1 {
		t.Errorf("want the step's state to say its timeout ended it, exit code 1 as Tekton's entrypoint exits: %+v", s)
	}
}

// A step's script runs against a private copy of the machine: what it writes to /root, /etc,
// /usr, /tmp or /dev/shm stays in its sandbox, the machine's /root is not visible to it, and
// a process it leaves behind dies with it.
func TestStepsAreIsolatedFromTheMachine(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	ns := namespace(t)
	probe := "berth-standin-probe-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	paths := []string{"/root/.ssh/" + probe, "/etc/" + probe, "/usr/local/bin/" + probe, "/tmp/" + probe,
		"/var/tmp/" + probe, "/dev/shm/" + probe, "/run/" + probe, "/usr/bin/retry"}
	var existed []string
	for _, p := range append(paths, "/tekton", "/workspace") {
		if _, err := os.Lstat(p); err == nil {
			existed = append(existed, p)
		}
	}
	marker := "/root/" + probe + "-machine"
	if err := os.WriteFile(marker, []byte("the machine's"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(marker) })

	var writes strings.Builder
	for _, p := range paths[:len(paths)-1] {
		fmt.Fprintf(&writes, "mkdir -p %s && echo step > %s\n", filepath.Dir(p), p)
	}
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "isolated", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{
			Results: []pipelinev1.TaskResult{{Name: "root"}, {Name: "pid"}},
			Steps: []pipelinev1.Step{{Name: "escape", Image: "x", Script: "#!/bin/bash\nset -e\n" + writes.String() +
				"echo '# " + probe + "' >> /etc/hosts\n" +
				"ls -A /root | grep -v '^.ssh$' | tr '\\n' ' ' > $(results.root.path)\n" +
				"echo $$ > $(results.pid.path)\n" +
				"(exec -a " + probe + "-orphan sleep 300) &\n"}},
		}},
	}
	if err := cp.Client.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
	if !got.IsSuccessful() {
		t.Fatalf("step failed: %s", condition(got).Message)
	}
	if root := result(got, "root"); root != "" {
		t.Errorf("the step saw the machine's /root: %q", root)
	}
	if pid := strings.TrimSpace(result(got, "pid")); pid != "1" {
		t.Errorf("the step is not PID 1 of its own namespace: pid %s", pid)
	}
	for _, p := range append(paths, "/tekton", "/workspace") {
		if _, err := os.Lstat(p); err == nil && !contains(existed, p) {
			t.Errorf("%s appeared on the machine", p)
			os.RemoveAll(p)
		}
	}
	if hosts, err := os.ReadFile("/etc/hosts"); err != nil || strings.Contains(string(hosts), probe) {
		t.Errorf("the machine's /etc/hosts was changed (err %v)", err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if cmd, err := os.ReadFile(p); err == nil && strings.Contains(string(cmd), probe+"-orphan") {
			t.Errorf("a process the step left behind is still running: %s", p)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A build task pulls the image it built from an OCI layout, `buildah pull oci:<dir>:<name>`, and
// pushes it by <name>: the step's buildah names the pull as the task image's buildah does.
func TestBuildahNamesAnOCIPullAfterItsReference(t *testing.T) {
	needRoot(t)
	ns := namespace(t)
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "oci-pull", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{
			Results: []pipelinev1.TaskResult{{Name: "names"}},
			Steps: []pipelinev1.Step{{Name: "pull", Image: "x", Env: []corev1.EnvVar{{Name: "STORAGE_DRIVER", Value: "vfs"}}, Script: `#!/bin/bash
set -euo pipefail
mkdir -p /tmp/ctx && echo hi >/tmp/ctx/f && printf 'FROM scratch\nCOPY f /\n' >/tmp/ctx/Containerfile
buildah bud -q -t built /tmp/ctx >/dev/null
buildah push -q built oci:/tmp/layout:registry.invalid/team/app:dev
buildah rmi -f built >/dev/null
buildah pull -q oci:/tmp/layout:registry.invalid/team/app:dev >/dev/null
buildah images --format '{{.Name}}:{{.Tag}}' | sort | tr '\n' ' ' >$(results.names.path)
`}}}},
	}
	create(t, tr)
	got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
	if !got.IsSuccessful() {
		t.Fatalf("the pull failed: %+v", condition(got))
	}
	if names := result(got, "names"); !strings.Contains(names, "registry.invalid/team/app:dev") {
		t.Errorf("images after the pull: %q; want one named registry.invalid/team/app:dev", names)
	}
}
