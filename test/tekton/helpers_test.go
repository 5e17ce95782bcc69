//go:build linux

package tekton

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/hosts"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// stepImage names the image of the test Task's step: kwok pulls nothing.
const stepImage = "testground.invalid/buildah"

var configured sync.Once

// namespace makes the test's namespace with the Task "build" in it, once the suite's config
// (the three platforms) is in force and the local platform's node is there.
func namespace(t *testing.T) string {
	t.Helper()
	configured.Do(func() {
		data := stack.StaticHostConfig(staticPlatform, hostSlots, localPlatform)
		stack.AddDynamicPlatform(data, vmPlatform, devstack.DynamicSettings{Provider: devstack.ProviderAWS, MaxInstances: 3})
		stacktest.ApplyConfig(t, stack, data)
		if err := stack.Tekton.AddNode(context.Background(), localNode, "linux", "arm64"); err != nil {
			t.Fatal(err)
		}
	})
	ns := stacktest.Namespace(t, stack)
	if err := stack.Tekton.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	task := buildTask(ns, "build", pipelinev1.ParamSpec{Name: contract.PlatformParam, Type: pipelinev1.ParamTypeString})
	if err := c().Create(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range stack.Tekton.Processes() {
				t.Logf("end of %s's log:\n%s", p.Name, shortLines(p.LogTail(10), 400))
			}
		}
	})
	return ns
}

// buildTask is a Task of the params given whose step does what a remote build's step does:
// it mounts the secret berth makes for its TaskRun and logs in to the host the secret names.
func buildTask(ns, name string, params ...pipelinev1.ParamSpec) *pipelinev1.Task {
	optional := false
	return &pipelinev1.Task{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: pipelinev1.TaskSpec{
			Params: params,
			Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: contract.SecretPrefix + "$(context.taskRun.name)", Optional: &optional}}}},
			Steps: []pipelinev1.Step{{
				Name: "build", Image: stepImage,
				Script:       `ssh -i /ssh/id_rsa "$(cat /ssh/host)" make`,
				VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}},
			}},
		},
	}
}

// pipelineRun is a PipelineRun of one pipeline task, "build", running the Task build once per
// platform (a matrix over PLATFORM, as Konflux's multi-platform builds do), with retries and
// the given annotations (Tekton passes them on to the TaskRuns, and those to their pods).
func pipelineRun(ns, name string, retries int, annotations map[string]string, platforms ...string) *pipelinev1.PipelineRun {
	return &pipelinev1.PipelineRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: pipelinev1.PipelineRunSpec{PipelineSpec: &pipelinev1.PipelineSpec{
			Tasks: []pipelinev1.PipelineTask{{
				Name:    "build",
				TaskRef: &pipelinev1.TaskRef{Name: "build"},
				Retries: retries,
				Matrix: &pipelinev1.Matrix{Params: pipelinev1.Params{{
					Name: contract.PlatformParam, Value: pipelinev1.ParamValue{Type: pipelinev1.ParamTypeArray, ArrayVal: platforms},
				}}},
			}},
		}},
	}
}

// held are the annotations that keep a run's steps going until the test ends them.
func held() map[string]string {
	return map[string]string{"testground.berth-ci.dev/hold": "true"}
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := c().Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// taskRunsOf waits until the PipelineRun has n TaskRuns and returns them by PLATFORM.
func taskRunsOf(t *testing.T, pr *pipelinev1.PipelineRun, n int) map[string]*pipelinev1.TaskRun {
	t.Helper()
	byPlatform := map[string]*pipelinev1.TaskRun{}
	stacktest.Eventually(t, fmt.Sprintf("%s has %d TaskRuns", pr.Name, n), func() (bool, error) {
		var list pipelinev1.TaskRunList
		if err := c().List(context.Background(), &list, client.InNamespace(pr.Namespace),
			client.MatchingLabels{"tekton.dev/pipelineRun": pr.Name}); err != nil {
			return false, err
		}
		clear(byPlatform)
		for i := range list.Items {
			byPlatform[contract.Platform(&list.Items[i])] = &list.Items[i]
		}
		if len(list.Items) == n {
			return true, nil
		}
		// What Tekton says of the PipelineRun, for a failure.
		if err := c().Get(context.Background(), client.ObjectKeyFromObject(pr), pr); err != nil {
			return false, err
		}
		if cond := pr.Status.GetCondition(apis.ConditionSucceeded); cond != nil && cond.IsFalse() {
			t.Fatalf("%s failed with %d TaskRuns: %s: %s", pr.Name, len(list.Items), cond.Reason, cond.Message)
		}
		return false, nil
	})
	return byPlatform
}

// runningPod waits until the TaskRun's current attempt runs its steps, and returns its pod.
func runningPod(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	stacktest.Eventually(t, "the steps of "+tr.Name+" run", func() (bool, error) {
		if err := c().Get(context.Background(), client.ObjectKeyFromObject(tr), tr); err != nil || tr.Status.PodName == "" {
			return false, err
		}
		err := c().Get(context.Background(), client.ObjectKey{Namespace: tr.Namespace, Name: tr.Status.PodName}, pod)
		return pod.Status.Phase == corev1.PodRunning && pod.Annotations["tekton.dev/ready"] == "READY", client.IgnoreNotFound(err)
	})
	return pod
}

// mounted is what the pod's ssh secret held when it started, as its step reads it.
func mounted(t *testing.T, tr *pipelinev1.TaskRun, pod *corev1.Pod) map[string][]byte {
	t.Helper()
	data := stack.Tekton.MountedSecrets(pod.Namespace, pod.Name)[contract.SecretPrefix+tr.Name]
	if data == nil {
		t.Fatalf("pod %s runs without its secret %s%s mounted", pod.Name, contract.SecretPrefix, tr.Name)
	}
	if msg, failed := data["error"]; failed {
		t.Fatalf("%s got an error secret: %s", tr.Name, msg)
	}
	return data
}

// endSteps ends the held steps of the TaskRun's current attempt.
func endSteps(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := stack.Tekton.EndSteps(context.Background(), pod.Namespace, pod.Name); err != nil {
		t.Fatal(err)
	}
}

// logIn does what the build step does with the secret it mounted: log in to the host it names
// with its key (or, with a one-time token, the key the OTP server hands for it) and run a
// command there; it returns the name the host knows the build user by.
func logIn(t *testing.T, data map[string][]byte) string {
	t.Helper()
	user, address, ok := strings.Cut(string(data["host"]), "@")
	if !ok {
		t.Fatalf("the secret's host %q is not user@address", data["host"])
	}
	key := data["id_rsa"]
	if token, ok := data["otp"]; ok {
		key = redeem(t, data, token)
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		t.Fatalf("the key the secret gave: %v", err)
	}
	out, err := hostAt(t, address).RunAs(context.Background(), user, signer, "id -un")
	if err != nil {
		t.Fatalf("logging in as %s@%s: %v", user, address, err)
	}
	return strings.TrimSpace(out)
}

// redeem POSTs the token to the OTP server the secret names, trusting its otp-ca, as the real
// buildah-remote Task's curl does, and returns the key.
func redeem(t *testing.T, data map[string][]byte, token []byte) []byte {
	t.Helper()
	status, body := tryRedeem(t, data, token)
	if status != http.StatusOK {
		t.Fatalf("the OTP server answered %d: %s", status, body)
	}
	return body
}

func tryRedeem(t *testing.T, data map[string][]byte, token []byte) (int, []byte) {
	t.Helper()
	status, body, err := stacktest.Redeem(string(data["otp-server"]), data["otp-ca"], string(token))
	if err != nil {
		t.Fatal(err)
	}
	return status, body
}

// hostAt is the test host or VM at address.
func hostAt(t *testing.T, address string) *sshhosts.Host {
	t.Helper()
	for _, h := range stack.Fleet.Hosts {
		if h.Address == address {
			return h
		}
	}
	for _, inst := range stack.VMCloud.Instances() {
		if inst.Address == address && inst.State != vmcloud.Gone {
			if h := stack.VMCloud.Host(inst.ID); h != nil {
				return h
			}
		}
	}
	t.Fatalf("no test host or VM at %s", address)
	return nil
}

// ended waits until the PipelineRun has ended, and returns its Succeeded condition.
func ended(t *testing.T, pr *pipelinev1.PipelineRun) *apis.Condition {
	t.Helper()
	var cond *apis.Condition
	stacktest.Eventually(t, pr.Name+" ends", func() (bool, error) {
		err := c().Get(context.Background(), client.ObjectKeyFromObject(pr), pr)
		cond = pr.Status.GetCondition(apis.ConditionSucceeded)
		return cond != nil && !cond.IsUnknown(), err
	})
	return cond
}

// settled waits until berth owes nothing for the namespace (stacktest.Settled), no build user
// is left on any host, every VM berth launched is gone, and then checks that the apiserver
// refused none of berth's writes.
func settled(t *testing.T, ns string) {
	t.Helper()
	stacktest.Settled(t, c(), ns)
	stacktest.Eventually(t, "no build user on any host and no VM left", func() (bool, error) {
		for _, h := range stack.Fleet.Hosts {
			if users, err := h.BuildUsers(context.Background()); err != nil || len(users) > 0 {
				return false, fmt.Errorf("host %s has build users %v (%v)", h.Name, users, err)
			}
		}
		for _, inst := range stack.VMCloud.Instances() {
			if inst.State != vmcloud.Gone {
				return false, fmt.Errorf("VM %s is %s", inst.ID, inst.State)
			}
		}
		var vms berthv1.BuildHostList
		if err := c().List(context.Background(), &vms, client.InNamespace(devstack.Namespace), client.HasLabels{hosts.LabelVM}); err != nil {
			return false, err
		}
		if len(vms.Items) > 0 {
			return false, fmt.Errorf("VM records left: %s", vms.Items[0].Name)
		}
		return true, nil
	})
	noRefusedWrites(t)
}

// controllerUser is whom berth's controller acts as.
var controllerUser = "system:serviceaccount:" + devstack.Namespace + ":" + devstack.ControllerServiceAccount

// noRefusedWrites reads the apiserver's audit log: no write of berth's controller so far was
// refused (by Tekton's webhook, validation, berth's RBAC or a limit).
func noRefusedWrites(t *testing.T) {
	t.Helper()
	var refused []string
	writes, stale := 0, 0
	err := controlplane.ReadAuditLog(auditLog, func(ev *auditv1.Event) {
		if ev.ImpersonatedUser == nil || ev.ImpersonatedUser.Username != controllerUser || ev.ResponseStatus == nil {
			return
		}
		writes++
		switch answerOf(ev.ResponseStatus) {
		case moot:
			stale++
		case refusedWrite:
			detail, _ := json.Marshal(ev.ResponseStatus)
			refused = append(refused, fmt.Sprintf("%s %s %s/%s: %s", ev.Verb, ev.ObjectRef.Resource, ev.ObjectRef.Namespace, ev.ObjectRef.Name, detail))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if writes == 0 {
		t.Fatalf("the audit log %s holds no write of %s: a check of its refusals would prove nothing", auditLog, controllerUser)
	}
	if len(refused) > 0 {
		t.Errorf("%d of berth's %d writes were refused:\n%s", len(refused), writes, strings.Join(refused, "\n"))
	}
	t.Logf("berth's writes so far: %d, of them %d moot or stale (404, 409, a patch's failed test), %d refused", writes, stale, len(refused))
}

// What the apiserver's answer to a write was.
type answer int

const (
	done answer = iota
	// moot: a write of something already gone (404), or from a copy that was not the latest
	// (409, or 422 without details: a JSON patch whose test no longer holds, which berth takes
	// for a conflict too); a controller meeting the garbage collector, Tekton's own writes or
	// its cache lag, and retrying from a fresh read.
	moot
	// refusedWrite: any other 4xx, Tekton's webhook, validation, RBAC or a limit saying no.
	refusedWrite
)

func answerOf(status *metav1.Status) answer {
	code := status.Code
	d := status.Details
	switch {
	case code < 400 || code >= 500:
		return done
	case code == http.StatusNotFound || code == http.StatusConflict:
		return moot
	case code == http.StatusUnprocessableEntity && (d == nil || d.Kind == "" && d.Name == "" && len(d.Causes) == 0):
		return moot
	}
	return refusedWrite
}

// recordOf waits until the TaskRun has its build user, and returns berth's record of it.
func recordOf(t *testing.T, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	return stacktest.Ready(t, c(), tr)
}

// nodeOf is the node the pod was placed on.
func nodeOf(t *testing.T, pod *corev1.Pod) *corev1.Node {
	t.Helper()
	var node corev1.Node
	if err := c().Get(context.Background(), client.ObjectKey{Name: pod.Spec.NodeName}, &node); err != nil {
		t.Fatal(err)
	}
	return &node
}

// The audit check tells refusals from moot writes as the apiserver words them.
func TestAnswersOfTheAPIServer(t *testing.T) {
	for _, c := range []struct {
		name   string
		status metav1.Status
		want   answer
	}{
		{"created", metav1.Status{Code: 201}, done},
		{"deleted already", metav1.Status{Code: 404, Reason: metav1.StatusReasonNotFound}, moot},
		{"stale resourceVersion", metav1.Status{Code: 409, Reason: metav1.StatusReasonConflict}, moot},
		{"a JSON patch's test failed", metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid, Details: &metav1.StatusDetails{}}, moot},
		{"invalid label value", metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid, Details: &metav1.StatusDetails{
			Kind: "TaskRun", Name: "x", Causes: []metav1.StatusCause{{Field: "metadata.labels"}}}}, refusedWrite},
		{"Tekton's webhook denied it", metav1.Status{Code: 400, Reason: metav1.StatusReasonBadRequest,
			Message: `admission webhook "validation.webhook.pipeline.tekton.dev" denied the request`}, refusedWrite},
		{"forbidden", metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden}, refusedWrite},
		{"throttled", metav1.Status{Code: 429, Reason: metav1.StatusReasonTooManyRequests}, refusedWrite},
		{"server error", metav1.Status{Code: 500}, done},
	} {
		if got := answerOf(&c.status); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// shortLines cuts each line of text to n bytes: Tekton logs whole HTTP requests on a line.
func shortLines(text string, n int) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if len(l) > n {
			lines[i] = l[:n] + " …"
		}
	}
	return strings.Join(lines, "\n")
}
