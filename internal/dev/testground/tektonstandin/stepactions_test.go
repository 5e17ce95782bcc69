package tektonstandin

import (
	"context"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// A StepAction written as the real ones are (tekton.dev/v1alpha1), used the way Konflux's
// integration pipelines use theirs: params from the TaskRun's, a default naming another
// param, a volume named by a param, a result written to $(step.results.<name>.path) and read
// by the next step through a param and through its env and args; the task's result takes
// its value from the step's.
const greetAction = `
apiVersion: tekton.dev/v1alpha1
kind: StepAction
metadata:
  name: greet
spec:
  image: registry.invalid/greeter:1
  params:
    - name: who
    - name: greeting
      default: hello
    - name: line
      default: "$(params.greeting), $(params.who)"
    - name: scratch
  results:
    - name: said
  env:
    - name: LINE
      value: "$(params.line)"
    - name: NS
      value: "$(context.taskRun.namespace)"
  volumeMounts:
    - name: "$(params.scratch)"
      mountPath: /scratch
  script: |
    #!/bin/bash
    set -eo pipefail
    echo -n "$LINE" > /scratch/line
    echo -n "$LINE in $NS" > "$(step.results.said.path)"
`

const echoAction = `
apiVersion: tekton.dev/v1alpha1
kind: StepAction
metadata:
  name: echo
spec:
  image: registry.invalid/echo:1
  params:
    - name: text
  env:
    - name: TEXT
      value: "$(params.text)"
  script: |
    #!/bin/bash
    echo -n "$TEXT|$(cat /scratch/line)" > $(results.echoed.path)
`

func applyStepActionManifest(t *testing.T, ns, manifest string) {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(manifest), &u.Object); err != nil {
		t.Fatal(err)
	}
	u.SetNamespace(ns)
	create(t, u)
}

func TestStepActionsAndStepResults(t *testing.T) {
	needRoot(t)
	ns := namespace(t)
	applyStepActionManifest(t, ns, greetAction)
	applyStepActionManifest(t, ns, echoAction)
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "greet", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{strParam("name", "berth")},
			TaskSpec: &pipelinev1.TaskSpec{
				Params:  []pipelinev1.ParamSpec{{Name: "name", Type: pipelinev1.ParamTypeString}},
				Volumes: []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				Results: []pipelinev1.TaskResult{
					{Name: "said", Value: pipelinev1.NewStructuredValues("$(steps.greet.results.said)")},
					{Name: "echoed"}, {Name: "seen"},
				},
				Steps: []pipelinev1.Step{
					{Name: "greet", Ref: &pipelinev1.Ref{Name: "greet"},
						Params: pipelinev1.Params{strParam("who", "$(params.name)"), strParam("scratch", "work")}},
					{Name: "echo", Ref: &pipelinev1.Ref{Name: "echo"},
						Params: pipelinev1.Params{strParam("text", "$(steps.greet.results.said)")},
						// the StepAction declares no mounts: the step's own stay
						VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/scratch"}}},
					{Name: "inline", Image: "x", Command: []string{"/bin/sh", "-c", `echo -n "$SAID/$1" > $(results.seen.path)`, "sh"},
						Args: []string{"$(steps.greet.results.said)"},
						Env:  []corev1.EnvVar{{Name: "SAID", Value: "env:$(steps.greet.results.said)"}}},
				},
			},
		},
	}
	create(t, tr)
	got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
	if !got.IsSuccessful() {
		t.Fatalf("failed: %s", condition(got).Message)
	}
	said := "hello, berth in " + ns
	for name, want := range map[string]string{
		"said":   said,
		"echoed": said + "|hello, berth",
		"seen":   "env:" + said + "/" + said,
	} {
		if r := result(got, name); r != want {
			t.Errorf("result %s: got %q, want %q", name, r, want)
		}
	}
	resolved := got.Status.TaskSpec.Steps
	if len(resolved) != 3 || resolved[0].Ref != nil || resolved[0].Params != nil || resolved[0].Image != "registry.invalid/greeter:1" {
		t.Fatalf("status.taskSpec must hold the resolved steps, as Tekton stores them; got %+v", resolved)
	}
	if env := resolved[1].Env; len(env) != 1 || env[0].Value != "$(steps.greet.results.said)" {
		t.Errorf("a step result passed as a param stays a reference until the step starts; got %+v", env)
	}
	if len(got.Status.Steps) != 3 {
		t.Fatalf("status.steps: %+v", got.Status.Steps)
	}
	if rs := got.Status.Steps[0].Results; len(rs) != 1 || rs[0].Name != "said" || rs[0].Value.StringVal != said {
		t.Errorf("status.steps[0].results: got %+v", rs)
	}
}

// What Tekton refuses when it resolves StepActions fails the run with its reason and words.
func TestStepActionResolutionFailures(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	ns := namespace(t)
	applyStepActionManifest(t, ns, greetAction)
	ref := func(name string, params ...pipelinev1.Param) pipelinev1.Step {
		return pipelinev1.Step{Name: "s", Ref: &pipelinev1.Ref{Name: name}, Params: params}
	}
	for _, tc := range []struct {
		name, reason, message string
		steps                 []pipelinev1.Step
	}{
		{name: "not-found", reason: reasonResolutionFailed, message: `failed to resolve step ref for step "s" (index 0): stepactions.tekton.dev "nope" not found`,
			steps: []pipelinev1.Step{ref("nope")}},
		{name: "missing-param", reason: reasonResolutionFailed, message: "non-existent params in Step: [scratch]",
			steps: []pipelinev1.Step{ref("greet", strParam("who", "x"))}},
		{name: "extra-param", reason: reasonResolutionFailed, message: "extra params passed by Step to StepAction: [colour]",
			steps: []pipelinev1.Step{ref("greet", strParam("who", "x"), strParam("scratch", "v"), strParam("colour", "red"))}},
		{name: "remote", reason: ReasonUnsupported, message: `remote resolution of StepActions (step "s", resolver "git")`,
			steps: []pipelinev1.Step{{Name: "s", Ref: &pipelinev1.Ref{ResolverRef: pipelinev1.ResolverRef{Resolver: "git"}}}}},
		{name: "unknown-step-result", reason: reasonValidationFailed, message: "$(steps.first.results.out) names no result of an earlier step",
			steps: []pipelinev1.Step{{Name: "s", Image: "x", Script: "true", Env: []corev1.EnvVar{{Name: "A", Value: "$(steps.first.results.out)"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: ns},
				Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: tc.steps}}}
			if err := cp.Client.Create(ctx, tr); err != nil {
				t.Fatal(err)
			}
			c := condition(waitFor(t, client.ObjectKeyFromObject(tr), "finished", done))
			if c.Status != corev1.ConditionFalse || c.Reason != tc.reason || !strings.Contains(c.Message, tc.message) {
				t.Fatalf("want Succeeded=False, reason %s, message naming %q; got %s %s %q", tc.reason, tc.message, c.Status, c.Reason, c.Message)
			}
		})
	}
}
