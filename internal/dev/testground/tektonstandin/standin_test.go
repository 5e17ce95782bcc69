package tektonstandin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
)

var (
	cp      *controlplane.ControlPlane
	standIn *StandIn
	// berthImageDir holds the programs of berthImage's steps (see Options.Images); a test
	// builds into it what it needs.
	berthImageDir string
)

// berthImage is the repository of berth's own image (config/manager/deployment.yaml); the
// stand-in gives every tag and digest of it the programs of berthImageDir.
const berthImage = "ghcr.io/berth-ci/berth"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-standin-image-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	berthImageDir = dir
	code := controlplane.RunTests(m, &cp, func(ctx context.Context) error {
		standIn = New(Options{Scheme: controlplane.Scheme(), RunScripts: func(*pipelinev1.TaskRun) bool { return true },
			Images: map[string]string{berthImage: berthImageDir}})
		standIn.Register([]string{"fake-provision"}, func(ctx context.Context, tr *pipelinev1.TaskRun) (map[string]string, error) {
			if tr.Spec.Params[0].Value.StringVal == "unreachable" {
				return nil, errors.New("host unreachable did not answer")
			}
			return map[string]string{"host": "u-1234@" + tr.Spec.Params[0].Value.StringVal}, nil
		})
		go func() {
			if err := standIn.Start(ctx, cp.Config); err != nil {
				panic(err)
			}
		}()
		return nil
	})
	_ = os.RemoveAll(berthImageDir)
	os.Exit(code)
}

func namespace(t *testing.T) string {
	t.Helper()
	ns := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if len(ns) > 60 {
		ns = ns[:60]
	}
	if err := cp.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// waitFor polls the TaskRun until cond holds; it fails the test after a generous bound.
func waitFor(t *testing.T, key types.NamespacedName, what string, cond func(*pipelinev1.TaskRun) bool) *pipelinev1.TaskRun {
	t.Helper()
	var tr pipelinev1.TaskRun
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, key, &tr); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cond(&tr), nil
	})
	if err != nil {
		t.Fatalf("TaskRun %s never %s; last status: %+v", key, what, tr.Status)
	}
	return &tr
}

func done(tr *pipelinev1.TaskRun) bool { return tr.IsDone() }

func TestResolvesTaskRefAndCreatesPod(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	task := &pipelinev1.Task{
		ObjectMeta: metav1.ObjectMeta{Name: "buildah-remote", Namespace: ns},
		Spec: pipelinev1.TaskSpec{
			Params: []pipelinev1.ParamSpec{{Name: "PLATFORM", Type: pipelinev1.ParamTypeString}},
			Steps: []pipelinev1.Step{{Name: "build", Image: "registry.example/buildah", Script: "echo hi",
				VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
			Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: "multi-platform-ssh-$(context.taskRun.name)"}}}},
		},
	}
	if err := cp.Client.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	// A task-type label chooses nothing: a user's step is no executor's, and the run stays in
	// progress until Finish. Its pod template's scheduling fields go into the pod, as Tekton
	// puts them there.
	scheduling := &pod.Template{
		NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
		Tolerations:  []corev1.Toleration{{Key: "builds", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "kubernetes.io/arch", Operator: corev1.NodeSelectorOpIn, Values: []string{"s390x"}}}}}}}},
	}
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "build", Namespace: ns, Labels: map[string]string{contract.TaskTypeLabel: "provision"}},
		Spec: pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "buildah-remote"},
			Params:      pipelinev1.Params{{Name: "PLATFORM", Value: *pipelinev1.NewStructuredValues("linux/s390x")}},
			PodTemplate: scheduling.DeepCopy()},
	}
	if err := cp.Client.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(tr)
	got := waitFor(t, key, "resolved", func(tr *pipelinev1.TaskRun) bool { return tr.Status.TaskSpec != nil })
	if got.Status.TaskSpec.Steps[0].Name != "build" || got.Status.TaskSpec.Volumes[0].Secret == nil {
		t.Fatalf("status.taskSpec is not the Task's spec: %+v", got.Status.TaskSpec)
	}
	if c := got.Status.GetCondition(apis.ConditionSucceeded); c == nil || c.Status != corev1.ConditionUnknown {
		t.Fatalf("a started run must be Succeeded=Unknown, got %+v", c)
	}

	var pod corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return cp.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: got.Status.PodName}, &pod) == nil, nil
	})
	if err != nil {
		t.Fatalf("pod %s was not created", got.Status.PodName)
	}
	if len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].UID != got.UID {
		t.Fatalf("pod is not owned by the TaskRun: %+v", pod.OwnerReferences)
	}
	if pod.Spec.Volumes[0].Secret == nil || pod.Spec.Volumes[0].Secret.SecretName != "multi-platform-ssh-build" || pod.Spec.Containers[0].VolumeMounts[0].MountPath != "/ssh" {
		t.Fatalf("pod lost the task's secret volume: %+v", pod.Spec)
	}
	// (The apiserver's admission adds tolerations of its own.)
	if !equality.Semantic.DeepEqual(pod.Spec.Affinity, scheduling.Affinity) || !equality.Semantic.DeepEqual(pod.Spec.NodeSelector, scheduling.NodeSelector) ||
		!slices.ContainsFunc(pod.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.MatchToleration(&scheduling.Tolerations[0]) }) {
		t.Fatalf("pod is not scheduled as its TaskRun's podTemplate says: affinity %+v, nodeSelector %v, tolerations %+v", pod.Spec.Affinity, pod.Spec.NodeSelector, pod.Spec.Tolerations)
	}

	if err := standIn.Finish(ctx, key, nil); err != nil {
		t.Fatal(err)
	}
	final := waitFor(t, key, "finished", done)
	if !final.IsSuccessful() || final.Status.CompletionTime == nil {
		t.Fatalf("Finish(nil) must succeed the run with a completion time: %+v", final.Status)
	}
}

func TestExecutorRunsToCompletion(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	for _, tc := range []struct {
		host, wantHost, wantMessage string
		succeed                     bool
	}{
		{host: "198.18.1.2", wantHost: "u-1234@198.18.1.2", succeed: true},
		{host: "unreachable", wantMessage: "host unreachable did not answer"},
	} {
		tr := &pipelinev1.TaskRun{
			ObjectMeta: metav1.ObjectMeta{Name: "provision-" + strings.ReplaceAll(tc.host, ".", "-"), Namespace: ns,
				Labels: map[string]string{contract.TaskTypeLabel: "provision"}},
			Spec: pipelinev1.TaskRunSpec{
				Params:   pipelinev1.Params{{Name: "HOST", Value: *pipelinev1.NewStructuredValues(tc.host)}},
				TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "provision", Image: "berth", Command: []string{"fake-provision"}}}},
			},
		}
		if err := cp.Client.Create(ctx, tr); err != nil {
			t.Fatal(err)
		}
		got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
		if got.IsSuccessful() != tc.succeed {
			t.Fatalf("%s: succeeded=%v, want %v: %+v", tc.host, got.IsSuccessful(), tc.succeed, got.Status.Conditions)
		}
		if got.Status.CompletionTime == nil {
			t.Errorf("%s: no completion time", tc.host)
		}
		if tc.succeed && (len(got.Status.Results) != 1 || got.Status.Results[0].Value.StringVal != tc.wantHost) {
			t.Errorf("%s: results %+v, want host=%s", tc.host, got.Status.Results, tc.wantHost)
		}
		if msg := got.Status.GetCondition(apis.ConditionSucceeded).Message; !tc.succeed && msg != tc.wantMessage {
			t.Errorf("%s: message %q, want %q", tc.host, msg, tc.wantMessage)
		}
	}
}

func TestMissingTaskFailsTheRun(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: ns},
		Spec:       pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "no-such-task"}},
	}
	if err := cp.Client.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
	if got.IsSuccessful() || !strings.Contains(got.Status.GetCondition(apis.ConditionSucceeded).Message, "no-such-task") {
		t.Fatalf("want a failure naming the task, got %+v", got.Status.Conditions)
	}
}

// The user task's step reads its key from the secret volume at the pod's mount path, and
// cannot start before that secret exists — the contract's only blocking mechanism.
func TestStepScriptReadsMaterialisedSecret(t *testing.T) {
	if os.Geteuid() != 0 {
		missing.Skip(t, "this test needs root (mount namespaces)")
	}
	const mountPath = "/berth-standin-test/ssh"
	if _, err := os.Stat("/berth-standin-test"); err == nil {
		t.Fatal("/berth-standin-test exists before the test; remove it")
	}
	ctx := context.Background()
	ns := namespace(t)
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "remote-build", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: "PLATFORM", Value: *pipelinev1.NewStructuredValues("linux/s390x")}},
			TaskSpec: &pipelinev1.TaskSpec{
				Params:  []pipelinev1.ParamSpec{{Name: "PLATFORM", Type: pipelinev1.ParamTypeString}},
				Results: []pipelinev1.TaskResult{{Name: "seen"}},
				Steps: []pipelinev1.Step{{Name: "build", Image: "buildah", Script: `
if [ -e ` + mountPath + `/error ]; then cat ` + mountPath + `/error; exit 1; fi
printf '%s %s %s' "$(params.PLATFORM)" "$(cat ` + mountPath + `/host)" "$(head -n1 ` + mountPath + `/id_rsa)" > $(results.seen.path)
`,
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: mountPath, ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: "multi-platform-ssh-remote-build"}}}},
			},
		},
	}
	if err := cp.Client.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(tr)
	waitFor(t, key, "resolved", func(tr *pipelinev1.TaskRun) bool { return tr.Status.TaskSpec != nil })
	var before pipelinev1.TaskRun
	if err := cp.Client.Get(ctx, key, &before); err != nil {
		t.Fatal(err)
	}
	if before.IsDone() {
		t.Fatalf("the run ended before its secret existed: %+v", before.Status.Conditions)
	}

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "multi-platform-ssh-remote-build", Namespace: ns},
		Data: map[string][]byte{
			"id_rsa":   []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"),
			"host":     []byte("u-abc@198.18.1.2"),
			"user-dir": []byte("/home/u-abc/build"),
		},
	}
	if err := cp.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, key, "finished", done)
	if !got.IsSuccessful() {
		t.Fatalf("step failed: %s", got.Status.GetCondition(apis.ConditionSucceeded).Message)
	}
	want := "linux/s390x u-abc@198.18.1.2 -----BEGIN OPENSSH PRIVATE KEY-----"
	if len(got.Status.Results) != 1 || got.Status.Results[0].Value.StringVal != want {
		t.Fatalf("results %+v, want seen=%q", got.Status.Results, want)
	}
	if _, err := os.Stat("/berth-standin-test"); !os.IsNotExist(err) {
		t.Fatalf("the mount point directories it created were left behind (stat: %v)", err)
	}
}

func TestFailingStepReportsItsOutput(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for mount namespaces")
	}
	ctx := context.Background()
	ns := namespace(t)
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "fails", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{
			{Name: "first", Image: "x", Script: "echo the platform is unsupported >&2; exit 3"},
			{Name: "never", Image: "x", Script: "echo must not run > /dev/null"},
		}}},
	}
	if err := cp.Client.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
	msg := got.Status.GetCondition(apis.ConditionSucceeded).Message
	if got.IsSuccessful() || !strings.Contains(msg, `"step-first" exited with code 3`) || !strings.Contains(msg, "the platform is unsupported") {
		t.Fatalf("want a failure naming the step with its output, got %q", msg)
	}
}

// status.steps says of each step what Tekton says of it: its container's exit code and the
// kubelet's reason, Tekton's terminationReason (Continued for a failure let pass, Skipped for
// the steps after a failure), and each step's output is its log.
func TestStepStatesAndLogs(t *testing.T) {
	needRoot(t)
	ns := namespace(t)
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "states", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{
			{Name: "ok", Image: "x", Script: "echo fine"},
			{Name: "let-pass", Image: "x", Script: "exit 3", OnError: pipelinev1.Continue},
			{Name: "fails", Image: "x", Script: "echo registry 127.0.0.1:9 refused >&2; exit 2"},
			{Image: "x", Script: "echo must not run"},
		}}},
	}
	create(t, tr)
	got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
	if got.IsSuccessful() {
		t.Fatal("the run succeeded past a failing step")
	}
	type state struct {
		name, container string
		code            int32
		reason, term    string
	}
	want := []state{
		{"ok", "step-ok", 0, "Completed", "Completed"},
		{"let-pass", "step-let-pass", 3, "Completed", "Continued"},
		{"fails", "step-fails", 2, "Error", "Error"},
		{"unnamed-3", "step-unnamed-3", 1, "Error", "Skipped"},
	}
	var states []state
	for _, s := range got.Status.Steps {
		if s.Terminated == nil || s.Terminated.StartedAt.IsZero() || s.Terminated.FinishedAt.Before(&s.Terminated.StartedAt) {
			t.Fatalf("step %s: not terminated with its times: %+v", s.Name, s.ContainerState)
		}
		states = append(states, state{s.Name, s.Container, s.Terminated.ExitCode, s.Terminated.Reason, s.TerminationReason})
	}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("status.steps\n got %v\nwant %v", states, want)
	}
	key := client.ObjectKeyFromObject(tr)
	if log, err := standIn.StepLog(key, "ok"); err != nil || string(log) != "fine\n" {
		t.Errorf("the log of step ok: %q %v", log, err)
	}
	if log, err := standIn.StepLog(key, "fails"); err != nil || !strings.Contains(string(log), "registry 127.0.0.1:9 refused") {
		t.Errorf("the log of step fails: %q %v", log, err)
	}
}
