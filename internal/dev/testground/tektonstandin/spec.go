package tektonstandin

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"github.com/tektoncd/pipeline/pkg/container"
	"github.com/tektoncd/pipeline/pkg/substitution"
	corev1 "k8s.io/api/core/v1"
)

// Paths Tekton gives a step inside its pod.
const (
	tektonDir        = "/tekton"
	tektonResultsDir = "/tekton/results"
	tektonStepsDir   = "/tekton/steps"
	tektonScriptsDir = "/tekton/scripts"
	tektonCredsDir   = "/tekton/creds"
)

// layout says where a run's results and workspaces are, as the step sees them: inside the
// pod (the sandbox) they are Tekton's own paths, for an in-process executor they are
// directories of this machine.
type layout struct {
	results   string
	workspace func(pipelinev1.WorkspaceDeclaration) string
}

// podLayout is what a step in a real pod sees.
var podLayout = layout{
	results:   tektonResultsDir,
	workspace: func(w pipelinev1.WorkspaceDeclaration) string { return w.GetMountPath() },
}

// runSpec is a TaskRun's task as its pod runs it: Tekton's variables substituted, the
// stepTemplate merged into every step, and the TaskRun's workspace bindings matched to the
// task's declarations.
type runSpec struct {
	steps      []pipelinev1.Step
	volumes    []corev1.Volume
	workspaces []boundWorkspace
	results    []pipelinev1.TaskResult
	podEnv     []corev1.EnvVar // podTemplate env: every step gets it, below its own
}

// boundWorkspace is a workspace declaration with the TaskRun's binding, nil when an optional
// workspace was left unbound.
type boundWorkspace struct {
	decl      pipelinev1.WorkspaceDeclaration
	binding   *pipelinev1.WorkspaceBinding
	mountPath string
}

// runError is why a TaskRun cannot run; its reason becomes the Succeeded condition's reason.
type runError struct {
	reason  string
	message string
}

func (e *runError) Error() string { return e.message }

// ReasonUnsupported is the reason of a TaskRun that uses a Tekton feature the stand-in does
// not implement: it fails at once with a message naming the feature, never runs half of it.
const ReasonUnsupported = "StandInUnsupported"

// Reasons Tekton itself gives, used where the stand-in fails a TaskRun the way Tekton would.
const (
	reasonValidationFailed   = "TaskRunValidationFailed"
	reasonCreateConfigError  = string(pipelinev1.TaskRunReasonCreateContainerConfigError)
	reasonPodCreationFailed  = string(pipelinev1.TaskRunReasonPodCreationFailed)
	reasonTaskRunTimeout     = string(pipelinev1.TaskRunReasonTimedOut)
	reasonResolutionFailed   = "TaskRunResolutionFailed"
	reasonFailed             = string(pipelinev1.TaskRunReasonFailed)
	reasonCancelled          = string(pipelinev1.TaskRunReasonCancelled)
	reasonSuccessful         = string(pipelinev1.TaskRunReasonSuccessful)
	reasonPending            = "Pending"
	reasonRunning            = string(pipelinev1.TaskRunReasonRunning)
	defaultTimeoutMinutes    = 60 // Tekton's default-timeout-minutes
	defaultServiceAccount    = "default"
	unsupportedMessagePrefix = "the Tekton stand-in of berth's test ground cannot run this TaskRun: "
)

func unsupported(format string, args ...any) error {
	return &runError{reason: ReasonUnsupported, message: unsupportedMessagePrefix + "it uses " + fmt.Sprintf(format, args...) +
		", which the stand-in does not implement (see internal/dev/testground/tektonstandin)"}
}

func invalid(format string, args ...any) error {
	return &runError{reason: reasonValidationFailed, message: fmt.Sprintf(format, args...)}
}

// buildRunSpec turns the TaskRun's resolved task into what its pod would run, following
// Tekton's substitution order: params (TaskRun values over the task's defaults, arrays
// expanded in place in command and args), then $(context…), $(results…), $(workspaces…),
// $(steps…exitCode.path), $(credentials.path) and $(step.results…path); then the
// stepTemplate is merged into each step. A feature the stand-in does not implement, or a
// reference left unresolved, is an error rather than a run that silently differs from
// Tekton's.
func buildRunSpec(tr *pipelinev1.TaskRun, l layout) (*runSpec, error) {
	if tr.Status.TaskSpec == nil {
		return nil, errors.New("TaskRun has no resolved task spec")
	}
	spec := tr.Status.TaskSpec.DeepCopy()
	if err := checkSupported(tr, spec); err != nil {
		return nil, err
	}
	strs, arrays, err := paramReplacements(tr, spec)
	if err != nil {
		return nil, err
	}
	applyReplacements(spec, strs, arrays)
	applyReplacements(spec, contextReplacements(tr), nil)
	workspaces, err := bindWorkspaces(tr, spec, l, strs)
	if err != nil {
		return nil, err
	}
	for _, p := range []map[string]string{resultReplacements(spec, l), workspaceReplacements(workspaces),
		exitCodeReplacements(spec), {"credentials.path": tektonCredsDir}} {
		applyReplacements(spec, p, nil)
	}
	for i := range spec.Steps {
		container.ApplyStepReplacements(&spec.Steps[i], stepResultPathReplacements(spec.Steps[i], i), nil)
	}
	if err := checkStepResultReferences(spec.Steps); err != nil {
		return nil, err
	}
	steps, err := pipelinev1.MergeStepsWithStepTemplate(spec.StepTemplate, spec.Steps)
	if err != nil {
		return nil, invalid("merging the stepTemplate into the steps: %v", err)
	}
	rs := &runSpec{steps: steps, volumes: spec.Volumes, workspaces: workspaces, results: spec.Results}
	if pt := tr.Spec.PodTemplate; pt != nil {
		rs.podEnv = pt.Env
	}
	if err := checkResolved(rs); err != nil {
		return nil, err
	}
	return rs, nil
}

// checkSupported rejects what the stand-in does not implement, naming it. Fields that only
// steer scheduling or resources (computeResources, nodeSelector, affinity, tolerations,
// stepSpecs, image pull policy, capabilities) are accepted and have no effect here beyond
// the pod object (see podFor).
func checkSupported(tr *pipelinev1.TaskRun, spec *pipelinev1.TaskSpec) error {
	if tr.Spec.Debug != nil {
		return unsupported("debug breakpoints (spec.debug)")
	}
	if pt := tr.Spec.PodTemplate; pt != nil && len(pt.Volumes) > 0 {
		return unsupported("podTemplate volumes")
	}
	if len(spec.Sidecars) > 0 {
		return unsupported("sidecars (sidecar %q)", spec.Sidecars[0].Name)
	}
	for i, step := range spec.Steps {
		name := stepName(step.Name, i)
		switch {
		case step.Ref != nil: // resolve replaced every one it could
			return invalid("%s refers to StepAction %q, which was not resolved", name, step.Ref.Name)
		case len(step.When) > 0:
			return unsupported("when expressions on steps (%s)", name)
		case len(step.Workspaces) > 0:
			return unsupported("isolated workspaces (%s lists workspaces)", name)
		case step.StdoutConfig != nil || step.StderrConfig != nil:
			return unsupported("stdoutConfig/stderrConfig (%s)", name)
		case strings.HasPrefix(step.Script, "#!win"):
			return unsupported("Windows scripts (%s)", name)
		case len(step.VolumeDevices) > 0:
			return unsupported("volumeDevices (%s)", name)
		}
		for _, m := range step.VolumeMounts {
			if m.SubPathExpr != "" {
				return unsupported("volumeMounts subPathExpr (%s mounts %q)", name, m.Name)
			}
		}
		for _, e := range step.Env {
			if err := checkEnvSource(name, e); err != nil {
				return err
			}
		}
	}
	if t := spec.StepTemplate; t != nil {
		for _, e := range t.Env {
			if err := checkEnvSource("stepTemplate", e); err != nil {
				return err
			}
		}
	}
	for _, v := range spec.Volumes {
		if err := checkVolumeSource(fmt.Sprintf("volume %q", v.Name), v.VolumeSource); err != nil {
			return err
		}
	}
	for _, w := range tr.Spec.Workspaces {
		if w.CSI != nil {
			return unsupported("CSI workspace bindings (workspace %q)", w.Name)
		}
		if w.Projected != nil {
			if err := checkVolumeSource(fmt.Sprintf("workspace %q", w.Name), corev1.VolumeSource{Projected: w.Projected}); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRunsAsRoot rejects steps that ask to run as a user other than root: the sandbox runs
// every step as root (an in-process executor runs no process and need not ask).
func checkRunsAsRoot(tr *pipelinev1.TaskRun, rs *runSpec) error {
	nonRoot := func(user *int64, nonRoot *bool) bool {
		return (user != nil && *user != 0) || (nonRoot != nil && *nonRoot)
	}
	if pt := tr.Spec.PodTemplate; pt != nil && pt.SecurityContext != nil && nonRoot(pt.SecurityContext.RunAsUser, pt.SecurityContext.RunAsNonRoot) {
		return unsupported("running steps as a user other than root (podTemplate securityContext)")
	}
	for i, step := range rs.steps {
		if sc := step.SecurityContext; sc != nil && nonRoot(sc.RunAsUser, sc.RunAsNonRoot) {
			return unsupported("running a step as a user other than root (%s securityContext)", stepName(step.Name, i))
		}
	}
	return nil
}

// buildSandboxSpec is buildRunSpec for steps run in the sandbox.
func buildSandboxSpec(tr *pipelinev1.TaskRun) (*runSpec, error) {
	rs, err := buildRunSpec(tr, podLayout)
	if err != nil {
		return nil, err
	}
	return rs, checkRunsAsRoot(tr, rs)
}

// downwardFields are the pod fields a step's env or a downward API file may name.
var downwardFields = []string{"metadata.name", "metadata.namespace", "metadata.uid", "spec.serviceAccountName"}

func checkEnvSource(where string, e corev1.EnvVar) error {
	from := e.ValueFrom
	if from == nil {
		return nil
	}
	if from.FieldRef != nil && !slices.Contains(downwardFields, from.FieldRef.FieldPath) {
		return unsupported("env fieldRef %q (%s env %s; supported: %s)", from.FieldRef.FieldPath, where, e.Name, strings.Join(downwardFields, ", "))
	}
	if from.ResourceFieldRef != nil || from.FileKeyRef != nil {
		return unsupported("env valueFrom other than secretKeyRef, configMapKeyRef and fieldRef (%s env %s)", where, e.Name)
	}
	return nil
}

func checkVolumeSource(what string, v corev1.VolumeSource) error {
	switch {
	case v.EmptyDir != nil, v.Secret != nil, v.ConfigMap != nil, v.PersistentVolumeClaim != nil:
		return nil
	case v.Projected != nil:
		for _, s := range v.Projected.Sources {
			if s.DownwardAPI != nil || s.ClusterTrustBundle != nil || s.PodCertificate != nil {
				return unsupported("projected volume sources other than secret, configMap and serviceAccountToken (%s)", what)
			}
		}
		return nil
	}
	return unsupported("this kind of volume (%s; supported: emptyDir, secret, configMap, projected, persistentVolumeClaim)", what)
}

// paramReplacements checks the TaskRun's params against the task's declarations, as Tekton's
// validation does, and returns the string and array replacements of Tekton's three reference
// forms ($(params.x), $(params["x"]), $(params['x'])), array items and object keys included.
func paramReplacements(tr *pipelinev1.TaskRun, spec *pipelinev1.TaskSpec) (map[string]string, map[string][]string, error) {
	strs, arrays := map[string]string{}, map[string][]string{}
	given := map[string]pipelinev1.ParamValue{}
	for _, p := range tr.Spec.Params {
		given[p.Name] = p.Value
	}
	var missing []string
	values := map[string]pipelinev1.ParamValue{}
	for _, decl := range spec.Params {
		v, ok := given[decl.Name]
		switch {
		case ok:
			if decl.Type != "" && v.Type != decl.Type {
				return nil, nil, invalid("param %q of the task is of type %s, the TaskRun gives a %s", decl.Name, decl.Type, v.Type)
			}
		case decl.Default != nil:
			v = *decl.Default
		default:
			missing = append(missing, decl.Name)
			continue
		}
		values[decl.Name] = v
	}
	if len(missing) > 0 {
		return nil, nil, invalid("missing parameters: %s", strings.Join(missing, ", "))
	}
	for name, v := range given { // Tekton propagates params a TaskRun gives an embedded spec
		if _, ok := values[name]; !ok {
			values[name] = v
		}
	}
	for name, v := range values {
		addParamReplacements(strs, arrays, name, v)
	}
	// A default may refer to another param (Tekton resolves those once).
	for k, v := range strs {
		if strings.Contains(v, "$(params") {
			strs[k] = substitution.ApplyReplacements(v, strs)
		}
	}
	return strs, arrays, nil
}

// addParamReplacements adds the replacements of a param's value under Tekton's three
// reference forms ($(params.x), $(params["x"]), $(params['x'])), array items and object keys
// included.
func addParamReplacements(strs map[string]string, arrays map[string][]string, name string, v pipelinev1.ParamValue) {
	for _, ref := range []string{"params." + name, fmt.Sprintf("params[%q]", name), "params['" + name + "']"} {
		switch v.Type {
		case pipelinev1.ParamTypeArray:
			arrays[ref] = v.ArrayVal
			for i, item := range v.ArrayVal {
				strs[ref+"["+strconv.Itoa(i)+"]"] = item
			}
		case pipelinev1.ParamTypeObject:
			for k, item := range v.ObjectVal {
				strs[ref+"."+k] = item
			}
		default:
			strs[ref] = v.StringVal
		}
	}
}

func contextReplacements(tr *pipelinev1.TaskRun) map[string]string {
	task := ""
	if tr.Spec.TaskRef != nil {
		task = tr.Spec.TaskRef.Name
	}
	return map[string]string{
		"context.taskRun.name":      tr.Name,
		"context.taskRun.namespace": tr.Namespace,
		"context.taskRun.uid":       string(tr.UID),
		"context.task.name":         task,
		"context.task.retry-count":  strconv.Itoa(len(tr.Status.RetriesStatus)),
	}
}

func resultReplacements(spec *pipelinev1.TaskSpec, l layout) map[string]string {
	out := map[string]string{}
	for _, r := range spec.Results {
		p := path.Join(l.results, r.Name)
		out["results."+r.Name+".path"] = p
		out[fmt.Sprintf("results[%q].path", r.Name)] = p
		out["results['"+r.Name+"'].path"] = p
	}
	return out
}

// bindWorkspaces matches the TaskRun's bindings to the task's declarations: a declared,
// non-optional workspace without a binding fails the run, as Tekton's validation does.
func bindWorkspaces(tr *pipelinev1.TaskRun, spec *pipelinev1.TaskSpec, l layout, params map[string]string) ([]boundWorkspace, error) {
	bindings := map[string]*pipelinev1.WorkspaceBinding{}
	for _, b := range tr.Spec.Workspaces {
		b := substituteBinding(b.DeepCopy(), params)
		bindings[b.Name] = b
	}
	out := make([]boundWorkspace, 0, len(spec.Workspaces))
	for _, decl := range spec.Workspaces {
		b := bindings[decl.Name]
		if b == nil && !decl.Optional {
			return nil, invalid("workspace %q is declared by the task but not bound by the TaskRun", decl.Name)
		}
		out = append(out, boundWorkspace{decl: decl, binding: b, mountPath: l.workspace(decl)})
	}
	return out, nil
}

// substituteBinding resolves params in a workspace binding's sub-path and object names, as
// Tekton does before it mounts the workspace.
func substituteBinding(b *pipelinev1.WorkspaceBinding, params map[string]string) *pipelinev1.WorkspaceBinding {
	r := func(s string) string { return substitution.ApplyReplacements(s, params) }
	b.SubPath = r(b.SubPath)
	if b.PersistentVolumeClaim != nil {
		b.PersistentVolumeClaim.ClaimName = r(b.PersistentVolumeClaim.ClaimName)
	}
	if b.Secret != nil {
		b.Secret.SecretName = r(b.Secret.SecretName)
	}
	if b.ConfigMap != nil {
		b.ConfigMap.Name = r(b.ConfigMap.Name)
	}
	if b.Projected != nil {
		for _, s := range b.Projected.Sources {
			if s.Secret != nil {
				s.Secret.Name = r(s.Secret.Name)
			}
			if s.ConfigMap != nil {
				s.ConfigMap.Name = r(s.ConfigMap.Name)
			}
		}
	}
	return b
}

func workspaceReplacements(ws []boundWorkspace) map[string]string {
	out := map[string]string{}
	for _, w := range ws {
		prefix := "workspaces." + w.decl.Name + "."
		if w.binding == nil {
			out[prefix+"bound"], out[prefix+"path"], out[prefix+"claim"] = "false", "", ""
			continue
		}
		out[prefix+"bound"], out[prefix+"path"] = "true", w.mountPath
		out[prefix+"volume"] = "ws-" + w.decl.Name
		out[prefix+"claim"] = ""
		if w.binding.PersistentVolumeClaim != nil {
			out[prefix+"claim"] = w.binding.PersistentVolumeClaim.ClaimName
		}
	}
	return out
}

func exitCodeReplacements(spec *pipelinev1.TaskSpec) map[string]string {
	out := map[string]string{}
	for i, s := range spec.Steps {
		n := stepName(s.Name, i)
		out["steps."+n+".exitCode.path"] = path.Join(tektonStepsDir, n, "exitCode")
	}
	return out
}

// stepName is a step's container name, as Tekton names it.
func stepName(name string, index int) string {
	if name == "" {
		return "step-unnamed-" + strconv.Itoa(index)
	}
	return "step-" + name
}

// applyReplacements substitutes references in every field Tekton substitutes: the steps and
// the stepTemplate (array params expand in command and args), the volumes (names, secret and
// config map names, their items' keys and paths, claim names, projected sources) and the
// workspaces' mount paths.
func applyReplacements(spec *pipelinev1.TaskSpec, strs map[string]string, arrays map[string][]string) {
	for i := range spec.Steps {
		container.ApplyStepReplacements(&spec.Steps[i], strs, arrays)
	}
	if spec.StepTemplate != nil {
		container.ApplyStepTemplateReplacements(spec.StepTemplate, strs, arrays)
	}
	r := func(s string) string { return substitution.ApplyReplacements(s, strs) }
	items := func(list []corev1.KeyToPath) {
		for i := range list {
			list[i].Key, list[i].Path = r(list[i].Key), r(list[i].Path)
		}
	}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		v.Name = r(v.Name)
		if v.Secret != nil {
			v.Secret.SecretName = r(v.Secret.SecretName)
			items(v.Secret.Items)
		}
		if v.ConfigMap != nil {
			v.ConfigMap.Name = r(v.ConfigMap.Name)
			items(v.ConfigMap.Items)
		}
		if v.PersistentVolumeClaim != nil {
			v.PersistentVolumeClaim.ClaimName = r(v.PersistentVolumeClaim.ClaimName)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil {
					s.Secret.Name = r(s.Secret.Name)
					items(s.Secret.Items)
				}
				if s.ConfigMap != nil {
					s.ConfigMap.Name = r(s.ConfigMap.Name)
					items(s.ConfigMap.Items)
				}
				if s.ServiceAccountToken != nil {
					s.ServiceAccountToken.Audience = r(s.ServiceAccountToken.Audience)
				}
			}
		}
	}
	for i := range spec.Workspaces {
		spec.Workspaces[i].MountPath = r(spec.Workspaces[i].MountPath)
	}
}

// tektonReference finds a reference to a Tekton variable Tekton would have resolved (or
// rejected). $(context…) is left out: Tekton itself leaves unknown context variables as
// they are.
var tektonReference = regexp.MustCompile(`\$\((params|results|workspaces|steps|step|credentials|artifacts|step\.artifacts)[.\[][^)]*\)`)

// checkResolved fails a run whose steps or volumes still hold a Tekton reference after
// substitution: a param the task does not declare, an array used inside a string, a
// variable of a feature the stand-in does not implement.
func checkResolved(rs *runSpec) error {
	for i, s := range rs.steps {
		// A step result in env, command or args is read when the step starts (and checked by
		// checkStepResultReferences); anywhere else it stays unresolved, as with Tekton.
		late := append(append([]string{}, s.Command...), s.Args...)
		for _, e := range s.Env {
			late = append(late, e.Value)
		}
		fields := []string{s.Script, s.WorkingDir}
		for _, f := range late {
			fields = append(fields, stepResultReference.ReplaceAllString(f, ""))
		}
		for _, m := range s.VolumeMounts {
			fields = append(fields, m.Name, m.MountPath, m.SubPath)
		}
		for _, f := range fields {
			if ref := tektonReference.FindString(f); ref != "" {
				return invalid("%s: %s cannot be resolved (an undeclared param or result, an array or object param used as a string, or a variable the stand-in does not implement)", stepName(s.Name, i), ref)
			}
		}
	}
	for _, v := range rs.volumes {
		var names []string
		switch {
		case v.Secret != nil:
			names = append(names, v.Secret.SecretName)
			for _, it := range v.Secret.Items {
				names = append(names, it.Key, it.Path)
			}
		case v.ConfigMap != nil:
			names = append(names, v.ConfigMap.Name)
			for _, it := range v.ConfigMap.Items {
				names = append(names, it.Key, it.Path)
			}
		case v.PersistentVolumeClaim != nil:
			names = append(names, v.PersistentVolumeClaim.ClaimName)
		}
		for _, n := range append(names, v.Name) {
			if ref := tektonReference.FindString(n); ref != "" {
				return invalid("volume %q: %s cannot be resolved", v.Name, ref)
			}
		}
	}
	return nil
}
