package tektonstandin

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	pipelinev1beta1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1beta1"
	"github.com/tektoncd/pipeline/pkg/container"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// StepActions, as Tekton resolves them when it prepares a TaskRun: a step with `ref` takes
// the named StepAction of the TaskRun's namespace, the step's params (themselves substituted
// with the TaskRun's) fill the StepAction's, its image, script, command, args, env, volume
// mounts, working dir, security context and results replace the step's, and the resolved
// steps are what status.taskSpec then holds. A step param may carry a step result reference
// ($(steps.<step>.results.<name>)); it stays a reference in the resolved step and is read
// when the step starts (see stepResultValues), as Tekton's entrypoint reads it.

// stepActionGVK is the version Tekton reads StepActions in; the apiserver serves the
// v1alpha1 the real ones are written in as the same object.
var stepActionGVK = pipelinev1beta1.SchemeGroupVersion.WithKind("StepAction")

// resolveStepActions returns spec's steps with every StepAction reference resolved, or an
// error worded as Tekton words it (its reason TaskRunResolutionFailed).
func (s *StandIn) resolveStepActions(ctx context.Context, tr *pipelinev1.TaskRun, spec *pipelinev1.TaskSpec) ([]pipelinev1.Step, error) {
	steps := slices.Clone(spec.Steps)
	for i, step := range spec.Steps {
		if step.Ref == nil {
			continue
		}
		if step.Ref.Resolver != "" {
			return nil, unsupported("remote resolution of StepActions (step %q, resolver %q); apply the StepAction to the namespace and refer to it by name", step.Name, step.Ref.Resolver)
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(stepActionGVK)
		err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: step.Ref.Name}, u)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err // the apiserver's trouble: tried again
		}
		var resolved pipelinev1.Step
		if err == nil {
			var action *pipelinev1beta1.StepActionSpec
			if action, err = stepActionSpec(u); err == nil {
				resolved, err = applyStepAction(tr, spec, step, action)
			}
		}
		if err != nil {
			return nil, &runError{reason: reasonResolutionFailed,
				message: fmt.Sprintf("failed to resolve step ref for step %q (index %d): %v", step.Name, i, err)}
		}
		steps[i] = resolved
	}
	return steps, nil
}

// stepActionSpec is a StepAction as read, its params' types defaulted as Tekton does.
func stepActionSpec(u *unstructured.Unstructured) (*pipelinev1beta1.StepActionSpec, error) {
	var action pipelinev1beta1.StepAction
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &action); err != nil {
		return nil, fmt.Errorf("StepAction %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	spec := action.Spec
	for i := range spec.Params {
		if spec.Params[i].Type == "" { // what SetDefaults does: a param is a string unless said
			spec.Params[i].Type = pipelinev1.ParamTypeString
			if d := spec.Params[i].Default; d != nil && d.Type != "" {
				spec.Params[i].Type = d.Type
			}
		}
	}
	return &spec, nil
}

// applyStepAction is one step's StepAction applied: params checked (none extra, none required
// missing), substituted in Tekton's order (the TaskRun's params into the step's, then the
// step's over the StepAction's defaults, defaults that name other params resolved), and the
// StepAction's fields merged over the step's.
func applyStepAction(tr *pipelinev1.TaskRun, spec *pipelinev1.TaskSpec, step pipelinev1.Step, action *pipelinev1beta1.StepActionSpec) (pipelinev1.Step, error) {
	given := step.Params
	if given != nil {
		strs, arrays, err := paramReplacements(tr, spec)
		if err != nil {
			return pipelinev1.Step{}, err
		}
		given = given.ReplaceVariables(strs, arrays, nil)
	}
	declared := map[string]bool{}
	var extra, missing []string
	for _, p := range action.Params {
		declared[p.Name] = true
	}
	values := map[string]pipelinev1.ParamValue{}
	for _, p := range given {
		if !declared[p.Name] {
			extra = append(extra, p.Name)
		}
		values[p.Name] = p.Value
	}
	if len(extra) > 0 {
		return pipelinev1.Step{}, fmt.Errorf("extra params passed by Step to StepAction: %v", extra)
	}
	for _, p := range action.Params {
		if _, ok := values[p.Name]; !ok && p.Default == nil {
			missing = append(missing, p.Name)
		}
	}
	if len(missing) > 0 {
		return pipelinev1.Step{}, fmt.Errorf("non-existent params in Step: %v", missing)
	}
	if err := resolveDefaults(action.Params, values); err != nil {
		return pipelinev1.Step{}, err
	}
	strs, arrays := map[string]string{}, map[string][]string{}
	for name, v := range values {
		addParamReplacements(strs, arrays, name, v)
	}
	from := action.ToStep()
	container.ApplyStepReplacements(from, strs, arrays)

	out := *step.DeepCopy()
	out.Image, out.SecurityContext, out.WorkingDir = from.Image, from.SecurityContext, from.WorkingDir
	if len(from.Command) > 0 {
		out.Command = from.Command
	}
	if len(from.Args) > 0 {
		out.Args = from.Args
	}
	if from.Script != "" {
		out.Script = from.Script
	}
	if from.Env != nil {
		out.Env = from.Env
	}
	if len(from.VolumeMounts) > 0 {
		out.VolumeMounts = from.VolumeMounts
	}
	if len(from.Results) > 0 {
		out.Results = from.Results
	}
	out.Ref, out.Params = nil, nil
	return out, nil
}

// paramReference finds $(params.<name>) in a default, the one form Tekton follows there.
var paramReference = regexp.MustCompile(`\$\(params\.([^.)\[\]]+)\)`)

// resolveDefaults adds to values every declared param the step left out, from its default; a
// default that names other params takes their values, in as many rounds as the chain needs.
func resolveDefaults(decls []pipelinev1.ParamSpec, values map[string]pipelinev1.ParamValue) error {
	pending := map[string]pipelinev1.ParamValue{}
	for _, p := range decls {
		if _, ok := values[p.Name]; ok || p.Default == nil {
			continue
		}
		if !strings.Contains(p.Default.StringVal, "$(params.") {
			values[p.Name] = *p.Default
			continue
		}
		pending[p.Name] = *p.Default
	}
	for len(pending) > 0 {
		progressed := false
		names := make([]string, 0, len(pending))
		for n := range pending {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, name := range names {
			v := pending[name]
			ready := true
			for _, m := range paramReference.FindAllStringSubmatch(v.StringVal, -1) {
				ref, ok := values[m[1]]
				if !ok {
					if _, waiting := pending[m[1]]; !waiting && !declaredIn(decls, m[1]) {
						return fmt.Errorf("parameter %q references non-existent parameter %q", name, m[1])
					}
					ready = false
					break
				}
				v.StringVal = strings.ReplaceAll(v.StringVal, m[0], ref.StringVal)
			}
			if ready {
				values[name] = v
				delete(pending, name)
				progressed = true
			}
		}
		if !progressed {
			return fmt.Errorf("circular dependency detected in parameter references")
		}
	}
	return nil
}

func declaredIn(decls []pipelinev1.ParamSpec, name string) bool {
	return slices.ContainsFunc(decls, func(p pipelinev1.ParamSpec) bool { return p.Name == name })
}

// stepResultPathReplacements are each step's $(step.results.<name>.path): the file under
// /tekton/steps/<container>/results the step writes its result to.
func stepResultPathReplacements(step pipelinev1.Step, index int) map[string]string {
	out := map[string]string{}
	for _, r := range step.Results {
		p := path.Join(tektonStepsDir, stepName(step.Name, index), "results", r.Name)
		out["step.results."+r.Name+".path"] = p
		out[fmt.Sprintf("step.results[%q].path", r.Name)] = p
		out["step.results['"+r.Name+"'].path"] = p
	}
	return out
}

// stepResultReference is a later step's use of an earlier step's result, which Tekton's
// entrypoint replaces in the step's env, command and args when the step starts.
var stepResultReference = regexp.MustCompile(`\$\(steps\.([^.)]+)\.results\.([^.)\[\]]+)\)`)

// checkStepResultReferences fails a run whose step refers to a result no earlier step
// declares: Tekton's entrypoint would fail it when the step starts, unable to read the file.
func checkStepResultReferences(steps []pipelinev1.Step) error {
	declared := map[string]bool{}
	for i, s := range steps {
		fields := append(append([]string{}, s.Command...), s.Args...)
		for _, e := range s.Env {
			fields = append(fields, e.Value)
		}
		for _, f := range fields {
			for _, m := range stepResultReference.FindAllStringSubmatch(f, -1) {
				if !declared[m[1]+"/"+m[2]] {
					return invalid("%s: %s names no result of an earlier step", stepName(s.Name, i), m[0])
				}
			}
		}
		for _, r := range s.Results {
			declared[s.Name+"/"+r.Name] = true
		}
	}
	return nil
}

// withStepResults replaces, in each of values, every earlier step's result it names by the
// text the step wrote to its result file, as Tekton's entrypoint does in a step's env,
// command and args before it runs the step. A result never written fails the step, as it
// fails the entrypoint.
func withStepResults(values []string, stepsDir string) ([]string, error) {
	out := slices.Clone(values)
	for i, v := range out {
		var failed error
		out[i] = stepResultReference.ReplaceAllStringFunc(v, func(ref string) string {
			m := stepResultReference.FindStringSubmatch(ref)
			value, err := readStepResult(filepath.Join(stepsDir, "step-"+m[1], "results", m[2]))
			if err != nil && failed == nil {
				failed = fmt.Errorf("reading %s: %w", ref, err)
			}
			return value.StringVal
		})
		if failed != nil {
			return nil, failed
		}
	}
	return out, nil
}

// readStepResult reads a result file as Tekton reads it: JSON if it is JSON, else its text.
func readStepResult(file string) (pipelinev1.ResultValue, error) {
	var v pipelinev1.ResultValue
	data, err := os.ReadFile(file)
	if err != nil {
		return v, err
	}
	return v, v.UnmarshalJSON(data)
}

// stepResults are the results a step declares and wrote, for its status.steps entry.
func stepResults(step pipelinev1.Step, index int, stepsDir string) []pipelinev1.TaskRunStepResult {
	var out []pipelinev1.TaskRunStepResult
	for _, r := range step.Results {
		v, err := readStepResult(filepath.Join(stepsDir, stepName(step.Name, index), "results", r.Name))
		if err != nil {
			continue // not written: Tekton reports none
		}
		kind := pipelinev1.ResultsTypeString
		if r.Type != "" {
			kind = r.Type
		}
		out = append(out, pipelinev1.TaskRunStepResult{Name: r.Name, Type: kind, Value: v})
	}
	return out
}

// taskResultsFromSteps fills the task results whose value names a step's result
// (`value: $(steps.<step>.results.<name>)`) from that step's, as Tekton does when the pod
// ends; a result the task's own files already gave is kept.
func taskResultsFromSteps(results []pipelinev1.TaskResult, states []pipelinev1.StepState, into map[string]string) {
	for _, r := range results {
		if r.Value == nil || into[r.Name] != "" {
			continue
		}
		m := stepResultReference.FindStringSubmatch(r.Value.StringVal)
		if m == nil || m[0] != r.Value.StringVal {
			continue
		}
		for _, st := range states {
			if st.Name != m[1] {
				continue
			}
			for _, sr := range st.Results {
				if sr.Name == m[2] {
					into[r.Name] = sr.Value.StringVal
				}
			}
		}
	}
}
