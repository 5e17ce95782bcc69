package tektonstandin

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func specRun(spec pipelinev1.TaskSpec, params ...pipelinev1.Param) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "tr", Namespace: "ns", UID: "uid-1"},
		Spec: pipelinev1.TaskRunSpec{Params: params, TaskRef: &pipelinev1.TaskRef{Name: "the-task"},
			Workspaces: []pipelinev1.WorkspaceBinding{{Name: "source", PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "claim-$(params.WHO)"}}}},
		Status: pipelinev1.TaskRunStatus{TaskRunStatusFields: pipelinev1.TaskRunStatusFields{TaskSpec: &spec}},
	}
}

// Tekton's substitution, as a step sees it: every reference form, defaults (also ones that
// refer to other params), array items and whole arrays in args, object keys, context,
// results, workspaces; the stepTemplate under the step's own env and mounts.
func TestBuildRunSpecSubstitutesLikeTekton(t *testing.T) {
	spec := pipelinev1.TaskSpec{
		Params: []pipelinev1.ParamSpec{
			{Name: "WHO", Type: pipelinev1.ParamTypeString},
			{Name: "GREETING", Type: pipelinev1.ParamTypeString, Default: pipelinev1.NewStructuredValues("hello $(params.WHO)")},
			{Name: "LIST", Type: pipelinev1.ParamTypeArray, Default: pipelinev1.NewStructuredValues("x")},
			{Name: "OBJ", Type: pipelinev1.ParamTypeObject, Default: pipelinev1.NewObject(map[string]string{"k": "v"})},
		},
		Results:    []pipelinev1.TaskResult{{Name: "out"}},
		Workspaces: []pipelinev1.WorkspaceDeclaration{{Name: "source"}},
		Volumes: []corev1.Volume{{Name: "ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "ca-$(params.WHO)"},
			Items:                []corev1.KeyToPath{{Key: "$(params['WHO']).pem", Path: "ca.pem"}}}}}},
		StepTemplate: &pipelinev1.StepTemplate{
			Env:          []corev1.EnvVar{{Name: "FROM_TEMPLATE", Value: "$(params.WHO)"}, {Name: "OVERRIDDEN", Value: "template"}},
			VolumeMounts: []corev1.VolumeMount{{Name: "ca", MountPath: "/ca"}},
		},
		Steps: []pipelinev1.Step{{
			Name:   "s",
			Args:   []string{"$(params.LIST[*])", "$(params.LIST[0])", `$(params["WHO"])`, "$(params.OBJ.k)"},
			Env:    []corev1.EnvVar{{Name: "OVERRIDDEN", Value: "step"}},
			Script: "$(params.GREETING) $(context.taskRun.name) $(context.taskRun.namespace) $(context.task.name) $(results.out.path) $(workspaces.source.path) $(workspaces.source.claim) $(workspaces.source.bound) $(credentials.path) $(steps.step-s.exitCode.path)",
		}},
	}
	rs, err := buildRunSpec(specRun(spec, strParam("WHO", "world"), arrayParam("LIST", "a", "b c")), podLayout)
	if err != nil {
		t.Fatal(err)
	}
	step := rs.steps[0]
	if want := []string{"a", "b c", "a", "world", "v"}; !reflect.DeepEqual(step.Args, want) {
		t.Errorf("args %q, want %q", step.Args, want)
	}
	want := "hello world tr ns the-task /tekton/results/out /workspace/source claim-world true /tekton/creds /tekton/steps/step-s/exitCode"
	if step.Script != want {
		t.Errorf("script %q,\nwant   %q", step.Script, want)
	}
	env := map[string]string{}
	for _, e := range step.Env {
		env[e.Name] = e.Value
	}
	if env["FROM_TEMPLATE"] != "world" || env["OVERRIDDEN"] != "step" {
		t.Errorf("stepTemplate env not merged under the step's: %v", env)
	}
	if len(step.VolumeMounts) != 1 || step.VolumeMounts[0].MountPath != "/ca" {
		t.Errorf("stepTemplate volumeMounts not merged: %+v", step.VolumeMounts)
	}
	if cm := rs.volumes[0].ConfigMap; cm.Name != "ca-world" || cm.Items[0].Key != "world.pem" {
		t.Errorf("volume not substituted: %+v", cm)
	}
}

func TestBuildRunSpecRejects(t *testing.T) {
	strList := pipelinev1.ParamSpec{Name: "LIST", Type: pipelinev1.ParamTypeArray}
	for _, tc := range []struct {
		name    string
		spec    pipelinev1.TaskSpec
		params  []pipelinev1.Param
		reason  string
		message string
	}{
		{"wrong type", pipelinev1.TaskSpec{Params: []pipelinev1.ParamSpec{strList}}, []pipelinev1.Param{strParam("LIST", "a")},
			reasonValidationFailed, `param "LIST" of the task is of type array`},
		{"array in a string", pipelinev1.TaskSpec{Params: []pipelinev1.ParamSpec{strList},
			Steps: []pipelinev1.Step{{Name: "s", Args: []string{"--x=$(params.LIST[*])"}}}}, []pipelinev1.Param{arrayParam("LIST", "a")},
			reasonValidationFailed, "$(params.LIST[*])"},
		{"undeclared result", pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "s", Script: "echo > $(results.nope.path)"}}}, nil,
			reasonValidationFailed, "$(results.nope.path)"},
		{"csi", pipelinev1.TaskSpec{Volumes: []corev1.Volume{{Name: "c", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "d"}}}}}, nil,
			ReasonUnsupported, `volume "c"`},
		{"downward api env", pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "s", Env: []corev1.EnvVar{{Name: "IP",
			ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}}}}}, nil,
			ReasonUnsupported, "status.podIP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := specRun(tc.spec, tc.params...)
			tr.Spec.Workspaces = nil
			_, err := buildRunSpec(tr, podLayout)
			var re *runError
			if !errors.As(err, &re) || re.reason != tc.reason || !strings.Contains(re.message, tc.message) {
				t.Fatalf("want %s naming %q, got %v", tc.reason, tc.message, err)
			}
		})
	}
}

func TestExpandEnvLikeTheKubelet(t *testing.T) {
	lookup := func(n string) (string, bool) { v, ok := map[string]string{"A": "1", "B": "two"}[n]; return v, ok }
	for in, want := range map[string]string{
		"$(A)-$(B)":  "1-two",
		"$(C)":       "$(C)",
		"$$(A)":      "$(A)",
		"cost: $$5":  "cost: $5",
		"$(A":        "$(A",
		"plain $ x$": "plain $ x$",
	} {
		if got := expandEnv(in, lookup); got != want {
			t.Errorf("expandEnv(%q) = %q, want %q", in, got, want)
		}
	}
}
