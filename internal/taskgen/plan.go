package taskgen

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
)

// stepPlan is what a rewritten step does: what it copies to the host and back, and how it
// runs the step's script there.
type stepPlan struct {
	task, step string
	script     string // the step's own script, with the #! line Tekton would give it
	hostImage  string
	user       string // podman's --user, "" for the image's own
	workingDir string // "" for the image's own
	env        []string
	syncs      []sync
	scratch    []string // paths the host gives the step empty
	// Options.HostEpilogue and PodEpilogue as scripts, "" for none.
	hostEpilogue, podEpilogue string
}

// sync is a path the step sees in the pod (path, a bash word), copied to there, a path below
// the build directory, before the step runs; with back, copied back after it (when the pod's
// copy is writable).
type sync struct {
	path, there string
	back        bool
}

// tektonResults is where Tekton's steps write their results ($(results.<name>.path)).
const tektonResults = "/tekton/results"

// refsThatStay are the Tekton references to places of the pod that taskgen does not copy to
// the host.
var refsThatStay = []struct{ ref, what string }{
	{"$(steps.", "other steps' exit codes or results (/tekton/steps)"},
	{"$(step.", "step results or artifacts"},
	{"$(credentials.path)", "Tekton's credentials directory"},
}

// plan decides how step i runs on a host, or says why it cannot.
func (g *generator) plan(i int) (*stepPlan, error) {
	step := g.in.Spec.Steps[i]
	tmpl := g.in.Spec.StepTemplate
	if tmpl == nil {
		tmpl = &pipelinev1.StepTemplate{}
	}
	switch {
	case step.Ref != nil:
		return nil, fmt.Errorf("it refers to a StepAction; taskgen moves steps that carry their own script")
	case step.Script == "":
		return nil, fmt.Errorf("it has no script (it runs its command); taskgen moves steps that run a script")
	case strings.HasPrefix(step.Script, "#!win"):
		return nil, fmt.Errorf("its script is a Windows script; berth's build hosts run podman on Linux")
	case len(step.EnvFrom) > 0 || len(tmpl.EnvFrom) > 0:
		return nil, fmt.Errorf("it takes variables from envFrom, whose names taskgen cannot know to pass on; list them under env instead")
	case len(step.VolumeDevices) > 0 || len(tmpl.VolumeDevices) > 0:
		return nil, fmt.Errorf("it uses volumeDevices, which cannot be copied to a host")
	case len(step.Results) > 0:
		return nil, fmt.Errorf("it declares step results, which taskgen does not copy back; write Task results instead")
	}
	texts := []string{step.Script, step.WorkingDir}
	texts = append(texts, step.Args...)
	for _, e := range append(append([]corev1.EnvVar{}, tmpl.Env...), step.Env...) {
		texts = append(texts, e.Value)
	}
	for _, t := range texts {
		for _, r := range refsThatStay {
			if strings.Contains(t, r.ref) {
				return nil, fmt.Errorf("it uses %s..., %s, which stay in the pod", r.ref, r.what)
			}
		}
	}

	p := &stepPlan{task: g.in.Name, step: step.Name, hostImage: g.opts.HostImage, workingDir: step.WorkingDir}
	p.script = asScript(step.Script)
	if g.opts.HostEpilogue != "" {
		p.hostEpilogue = asScript(g.opts.HostEpilogue)
	}
	if g.opts.PodEpilogue != "" {
		p.podEpilogue = asScript(g.opts.PodEpilogue)
	}
	if p.hostImage == "" {
		p.hostImage = step.Image
	}
	if p.hostImage == "" {
		p.hostImage = tmpl.Image
	}
	if p.hostImage == "" {
		return nil, fmt.Errorf("it has no image to run on the host")
	}
	if p.workingDir == "" {
		p.workingDir = tmpl.WorkingDir
	}
	p.user = user(step.SecurityContext)
	if p.user == "" {
		p.user = user(tmpl.SecurityContext)
	}

	// The environment: HOME first (the step keeps the home it has in the pod, where its
	// registry credentials are), then the template's and the step's variables.
	p.env = []string{"HOME"}
	for _, e := range append(append([]corev1.EnvVar{}, tmpl.Env...), step.Env...) {
		if !slices.Contains(p.env, e.Name) {
			p.env = append(p.env, e.Name)
		}
	}

	// Workspaces: the step's own list if it has one, else all of the Task's.
	for _, w := range g.in.Spec.Workspaces {
		if len(step.Workspaces) > 0 && !slices.ContainsFunc(step.Workspaces, func(u pipelinev1.WorkspaceUsage) bool { return u.Name == w.Name }) {
			continue
		}
		p.syncs = append(p.syncs, sync{path: `"$(workspaces.` + w.Name + `.path)"`, there: "workspaces/" + w.Name, back: !w.ReadOnly})
	}

	// Volumes: the template's mounts, each replaced by a step mount at the same path, as
	// Tekton merges them.
	var mounts []corev1.VolumeMount
	for _, m := range tmpl.VolumeMounts {
		if !slices.ContainsFunc(step.VolumeMounts, func(s corev1.VolumeMount) bool { return s.MountPath == m.MountPath }) {
			mounts = append(mounts, m)
		}
	}
	mounts = append(mounts, step.VolumeMounts...)
	seen := map[string]bool{}
	for _, m := range mounts {
		if m.MountPath == SecretMountPath {
			return nil, fmt.Errorf("it mounts volume %q at %s, where the remote step reads berth's secret", m.Name, SecretMountPath)
		}
		if seen[m.Name] {
			return nil, fmt.Errorf("it mounts volume %q twice, and taskgen copies each volume to the host once", m.Name)
		}
		seen[m.Name] = true
		vi := slices.IndexFunc(g.in.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if vi < 0 {
			return nil, fmt.Errorf("it mounts volume %q, which the Task does not declare", m.Name)
		}
		v := g.in.Spec.Volumes[vi]
		if m.MountPath == containerStorage || slices.Contains(g.opts.Scratch, m.Name) {
			p.scratch = append(p.scratch, m.MountPath)
			continue
		}
		// Secrets, config maps and the like are read-only in the pod: they go to the host only.
		readOnly := m.ReadOnly || v.Secret != nil || v.ConfigMap != nil || v.Projected != nil || v.DownwardAPI != nil
		path, err := shellWord(m.MountPath)
		if err != nil {
			return nil, err
		}
		p.syncs = append(p.syncs, sync{path: path, there: "volumes/" + m.Name, back: !readOnly})
	}
	p.syncs = append(p.syncs, sync{path: tektonResults, there: "results", back: true})
	if !g.opts.KeepCredentialsInPod {
		p.syncs = append(p.syncs, sync{path: `"$HOME/.docker"`, there: ".docker"})
	}
	return p, nil
}

// user is podman's --user for a security context: the uid, and the gid if it names one.
func user(sc *corev1.SecurityContext) string {
	if sc == nil || sc.RunAsUser == nil {
		return ""
	}
	u := strconv.FormatInt(*sc.RunAsUser, 10)
	if sc.RunAsGroup != nil {
		u += ":" + strconv.FormatInt(*sc.RunAsGroup, 10)
	}
	return u
}
