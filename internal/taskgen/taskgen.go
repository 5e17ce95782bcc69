// Package taskgen makes the remote twin of a Tekton Task, as the buildah-remote Tasks are made
// from buildah: the chosen steps run on the build host berth assigns the TaskRun, everything
// else stays in the pod. The twin gets a PLATFORM param (what berth reads to pick the host)
// and the volume of berth's secret, multi-platform-ssh-$(context.taskRun.name), mounted at
// /ssh in each rewritten step. A rewritten step's script reads the secret (error, localhost,
// otp or id_rsa), copies what the step sees in the pod (workspaces, volumes, results, registry
// credentials) to the host's build directory, runs the step's own script there under podman
// in the step's own image with its environment, and copies back what the step wrote.
//
// The twin is the original's text with a few edits, not a re-encoding of it: steps, params,
// comments and key order that taskgen does not change stay byte for byte, so the two diff
// cleanly. The edits are read back and checked against what they were meant to do, and the
// result must pass Tekton's own validation.
package taskgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	yaml "go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/contract"
)

// DefaultStep is the step rewritten when Options names none: the build step of buildah and
// its kin.
const DefaultStep = "build"

// SecretMountPath is where a rewritten step reads berth's secret, as the real remote Tasks do.
const SecretMountPath = "/ssh"

// secretVolume is the name of the volume of berth's secret.
const secretVolume = "ssh"

// containerStorage is where container images are kept. A volume mounted there is never
// copied: images are owned by ids of a user namespace and only make sense to the engine that
// wrote them, so the host gets an empty one of its own, as buildah-remote's builds do.
const containerStorage = "/var/lib/containers"

// Options choose what Generate rewrites. The zero value rewrites step "build" and names the
// twin <name>-remote.
type Options struct {
	// Steps are the names of the steps that run on the build host; none means DefaultStep.
	Steps []string
	// Name is the twin's name; empty means the Task's name with "-remote".
	Name string
	// RunnerImage, if set, replaces the image the rewritten steps have in the pod, which must
	// have bash, ssh, rsync, and curl for berth's one-time keys. A step's own image still runs
	// on the host (see HostImage). On a local platform the step's script runs in the pod, so
	// in this image.
	RunnerImage string
	// HostImage, if set, is the image podman runs on the host for every rewritten step,
	// instead of each step's own.
	HostImage string
	// Scratch names volumes the host gives the step empty, copying nothing either way (caches,
	// storage of tools). A volume mounted at /var/lib/containers always is scratch.
	Scratch []string
	// HostEpilogue, if set, is a script that runs on the host after a rewritten step's own
	// script succeeds, in the same container: to leave as files what the pod's steps need
	// and would not otherwise get back (buildah: `buildah push "$IMAGE" oci:/shared/image`,
	// as the image itself stays in the host's container storage).
	HostEpilogue string
	// PodEpilogue, if set, is a script that runs in the pod after the step succeeded on the
	// host and what it wrote is back (buildah: `buildah pull oci:/shared/image`). Neither
	// runs on a local platform, where the step's script runs in the pod itself.
	PodEpilogue string
	// KeepCredentialsInPod leaves the registry credentials Tekton puts in $HOME/.docker in the
	// pod. By default they go to the host, so that a build can pull private base images, as
	// buildah-remote's do.
	KeepCredentialsInPod bool
}

// Generate returns the remote twin of task, a tekton.dev/v1 Task in YAML.
func Generate(task []byte, o Options) ([]byte, error) {
	src, err := parseSource(string(task))
	if err != nil {
		return nil, err
	}
	if err := checkKind(src.root); err != nil {
		return nil, err
	}
	var in pipelinev1.Task
	if err := sigsyaml.UnmarshalStrict(task, &in); err != nil {
		return nil, fmt.Errorf("the Task does not read as a tekton.dev/v1 Task: %w", err)
	}
	if err := validate(&in); err != nil {
		return nil, fmt.Errorf("the Task fails Tekton's validation, so taskgen will not rewrite it: %w", err)
	}
	g := &generator{src: src, in: &in, opts: o}
	if len(g.opts.Steps) == 0 {
		g.opts.Steps = []string{DefaultStep}
	}
	if g.opts.Name == "" {
		if in.Name == "" {
			return nil, fmt.Errorf("the Task has no metadata.name; give its remote twin a name (--name)")
		}
		g.opts.Name = in.Name + "-remote"
	}
	want, err := g.rewrite()
	if err != nil {
		return nil, err
	}
	out, err := src.result()
	if err != nil {
		return nil, err
	}
	if err := readsBackAs([]byte(out), want); err != nil {
		return nil, err
	}
	return []byte(out), nil
}

// checkKind tells a Task from anything else before its fields are read.
func checkKind(root *yaml.Node) error {
	_, kind := get(root, "kind")
	_, version := get(root, "apiVersion")
	switch {
	case kind == nil || kind.Value != "Task":
		k := "nothing"
		if kind != nil {
			k = fmt.Sprintf("%q", kind.Value)
		}
		return fmt.Errorf("the input is not a Tekton Task: its kind is %s", k)
	case version == nil || version.Value != pipelinev1.SchemeGroupVersion.String():
		v := "missing"
		if version != nil {
			v = version.Value
		}
		return fmt.Errorf("taskgen reads %s Tasks; this one's apiVersion is %s (convert it to %[1]s first)",
			pipelinev1.SchemeGroupVersion, v)
	}
	return nil
}

// validate runs Tekton's admission: defaults, then validation.
func validate(t *pipelinev1.Task) error {
	ctx := context.Background()
	v := t.DeepCopy()
	v.SetDefaults(ctx)
	if err := v.Validate(ctx); err != nil { // a nil *apis.FieldError is no nil error
		return err
	}
	return nil
}

type generator struct {
	src  *source
	in   *pipelinev1.Task
	opts Options
	// The Task's own indentation: of a mapping's keys below their parent key, and of a block
	// sequence's dashes below the key that holds it (0 when written "key:\n- item").
	indent, seqIndent int
}

// rewrite makes every edit and returns the Task the edited text must read back as.
func (g *generator) rewrite() (*pipelinev1.Task, error) {
	want := g.in.DeepCopy()
	specKey, spec := get(g.src.root, "spec")
	stepsKey, steps := get(spec, "steps")
	if spec == nil || spec.Style&yaml.FlowStyle != 0 || len(spec.Content) == 0 ||
		steps == nil || steps.Kind != yaml.SequenceNode || steps.Style&yaml.FlowStyle != 0 || len(steps.Content) != len(g.in.Spec.Steps) {
		return nil, fmt.Errorf("taskgen edits Tasks whose spec and steps are written in block style (one key a line, steps as \"- \" items)")
	}
	g.indent = spec.Content[0].Column - specKey.Column
	g.seqIndent = steps.Column - stepsKey.Column
	if g.indent < 1 || g.seqIndent < 0 {
		return nil, fmt.Errorf("line %d: taskgen cannot tell how the Task indents its spec", specKey.Line)
	}
	if err := g.refuseRemote(); err != nil {
		return nil, err
	}
	for _, name := range g.opts.Scratch {
		if !slices.ContainsFunc(g.in.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name }) {
			return nil, fmt.Errorf("scratch volume %q: the Task has no volume of that name", name)
		}
	}

	seen := map[string]bool{}
	for _, name := range g.opts.Steps {
		if seen[name] {
			return nil, fmt.Errorf("step %q is named twice", name)
		}
		seen[name] = true
		i := slices.IndexFunc(g.in.Spec.Steps, func(s pipelinev1.Step) bool { return s.Name == name })
		if i < 0 {
			var names []string
			for _, s := range g.in.Spec.Steps {
				names = append(names, s.Name)
			}
			return nil, fmt.Errorf("the Task has no step %q; its steps are %s", name, strings.Join(names, ", "))
		}
		node := steps.Content[i]
		if _, n := get(node, "name"); n == nil || n.Value != name {
			return nil, fmt.Errorf("line %d: taskgen could not find step %q in the Task's text", node.Line, name)
		}
		p, err := g.plan(i)
		if err != nil {
			return nil, fmt.Errorf("step %q cannot run on a build host: %w", name, err)
		}
		script, err := p.wrapper()
		if err != nil {
			return nil, fmt.Errorf("step %q: %w", name, err)
		}
		if err := g.rewriteStep(node, script); err != nil {
			return nil, fmt.Errorf("step %q: %w", name, err)
		}
		step := &want.Spec.Steps[i]
		step.Script = script
		if g.opts.RunnerImage != "" {
			step.Image = g.opts.RunnerImage
		}
		step.VolumeMounts = append(step.VolumeMounts, secretMount())
	}

	_, meta := get(g.src.root, "metadata")
	if err := g.setScalar(meta, "name", g.opts.Name); err != nil {
		return nil, fmt.Errorf("metadata.name: %w", err)
	}
	want.Name = g.opts.Name

	param := platformParam(g.opts.Steps)
	if err := g.appendItem(spec, specKey.Column-1+g.indent, "params", []string{
		"name: " + quoted(param.Name),
		"type: " + quoted(string(param.Type)),
		"description: " + quoted(param.Description),
	}); err != nil {
		return nil, fmt.Errorf("spec.params: %w", err)
	}
	want.Spec.Params = append(want.Spec.Params, param)

	pad := strings.Repeat(" ", g.indent)
	if err := g.appendItem(spec, specKey.Column-1+g.indent, "volumes", []string{
		"name: " + secretVolume,
		"secret:",
		pad + "secretName: " + quoted(contract.SecretPrefix+"$(context.taskRun.name)"),
		pad + "optional: false",
	}); err != nil {
		return nil, fmt.Errorf("spec.volumes: %w", err)
	}
	want.Spec.Volumes = append(want.Spec.Volumes, secretVolumeSpec())
	return want, nil
}

// refuseRemote refuses a Task that is remote already, or whose names would clash with the
// twin's.
func (g *generator) refuseRemote() error {
	for _, p := range g.in.Spec.Params {
		if p.Name == contract.PlatformParam {
			return fmt.Errorf("the Task has a %s param already: it is a remote Task, or uses %[1]s for something else, and berth reads %[1]s to pick the build host", contract.PlatformParam)
		}
	}
	for _, v := range g.in.Spec.Volumes {
		if v.Secret != nil && strings.HasPrefix(v.Secret.SecretName, contract.SecretPrefix) {
			return fmt.Errorf("volume %q mounts berth's secret (%s...) already: the Task is remote", v.Name, contract.SecretPrefix)
		}
		if v.Name == secretVolume {
			return fmt.Errorf("the Task has a volume named %q already; the twin needs that name for berth's secret", secretVolume)
		}
	}
	return nil
}

// rewriteStep replaces the step's script with script, its image with the runner image if one
// is given, and adds the secret's mount.
func (g *generator) rewriteStep(step *yaml.Node, script string) error {
	if step.Kind != yaml.MappingNode || step.Style&yaml.FlowStyle != 0 {
		return fmt.Errorf("line %d: taskgen edits steps written in block style", step.Line)
	}
	keyCol := step.Column - 1
	k, v := get(step, "script")
	if k == nil || v.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: the step's script is not a string", step.Line)
	}
	if err := literalSafe(script); err != nil {
		return err
	}
	body := indented(keyCol+g.indent, strings.Split(strings.TrimSuffix(script, "\n"), "\n"))
	// The value's first line becomes the literal block's header "|"; a comment after the
	// value stays where it was.
	start, end := g.src.nodeOffset(v), -1
	if v.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		end = start + 1 + len(g.src.text[start+1:]) - len(strings.TrimLeft(g.src.text[start+1:], "+-0123456789"))
	} else if e, err := g.src.scalarEnd(v); err == nil {
		end = e
	}
	if end < 0 || v.Line != k.Line {
		// A string over several lines, or below its key: it goes whole, with any comment on
		// its last line.
		colon := strings.IndexByte(g.src.text[g.src.nodeOffset(k):], ':')
		g.src.replace(g.src.nodeOffset(k)+colon+1, g.src.entryEnd(k, v), " |\n"+body)
	} else {
		g.src.replace(start, end, "|")
		g.src.replace(g.src.lineEnd(v.Line), g.src.entryEnd(k, v), body)
	}
	if g.opts.RunnerImage != "" {
		if err := g.setScalar(step, "image", g.opts.RunnerImage); err != nil {
			return fmt.Errorf("image: %w", err)
		}
	}
	return g.appendItem(step, keyCol, "volumeMounts", []string{
		"name: " + secretVolume,
		"mountPath: " + SecretMountPath,
		"readOnly: true",
	})
}

// setScalar sets key of mapping m to value, adding the key if m has none.
func (g *generator) setScalar(m *yaml.Node, key, value string) error {
	if m == nil || m.Kind != yaml.MappingNode || len(m.Content) == 0 || m.Style&yaml.FlowStyle != 0 {
		return fmt.Errorf("taskgen edits mappings written in block style")
	}
	k, v := get(m, key)
	if k == nil {
		g.appendKey(m, m.Content[0].Column-1, []string{key + ": " + quoted(value)})
		return nil
	}
	if v.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: not a string", v.Line)
	}
	end, err := g.src.scalarEnd(v)
	if err != nil {
		return err
	}
	g.src.replace(g.src.nodeOffset(v), end, quoted(value))
	return nil
}

// appendItem adds an item (its lines, relative to the item's own indentation) at the end of
// the block sequence under key of mapping m, whose keys sit at column keyCol; it adds the
// key if m has none.
func (g *generator) appendItem(m *yaml.Node, keyCol int, key string, lines []string) error {
	k, v := get(m, key)
	if k == nil {
		g.appendKey(m, keyCol, append([]string{key + ":"}, item(g.seqIndent, lines)...))
		return nil
	}
	if v.Kind != yaml.SequenceNode || v.Style&yaml.FlowStyle != 0 || len(v.Content) == 0 {
		return fmt.Errorf("line %d: %s is empty or written in flow style ([...]); write it as a block sequence (\"- \" items)", k.Line, key)
	}
	last := v.Content[len(v.Content)-1]
	end, err := g.src.itemEnd(last)
	if err != nil {
		return err
	}
	dash, err := g.src.dashColumn(last)
	if err != nil {
		return err
	}
	g.src.insert(end, indented(dash, item(0, lines)))
	return nil
}

// appendKey adds lines (a key and its value, relative to keyCol) at the end of mapping m.
func (g *generator) appendKey(m *yaml.Node, keyCol int, lines []string) {
	lastK, lastV := m.Content[len(m.Content)-2], m.Content[len(m.Content)-1]
	g.src.insert(g.src.entryEnd(lastK, lastV), indented(keyCol, lines))
}

// item turns an item's lines into a sequence item whose dash sits at column dash.
func item(dash int, lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		prefix := strings.Repeat(" ", dash+2)
		if i == 0 {
			prefix = strings.Repeat(" ", dash) + "- "
		}
		out[i] = prefix + l
	}
	return out
}

// literalSafe refuses text that a YAML literal block cannot carry as it is.
func literalSafe(text string) error {
	for _, r := range text {
		switch {
		case r == '\t' || r == '\n' || r == 0x85:
		case r >= 0x20 && r <= 0x7e, r >= 0xa0 && r <= 0xd7ff, r >= 0xe000 && r <= 0xfffd && r != 0xfeff, r >= 0x10000 && r <= 0x10ffff:
		default:
			return fmt.Errorf("the script holds the character %U, which a YAML literal block cannot carry; remove it from the script", r)
		}
	}
	return nil
}

func platformParam(steps []string) pipelinev1.ParamSpec {
	which := "step " + steps[0]
	if len(steps) > 1 {
		which = "steps " + strings.Join(steps, ", ")
	}
	return pipelinev1.ParamSpec{
		Name:        contract.PlatformParam,
		Type:        pipelinev1.ParamTypeString,
		Description: fmt.Sprintf("The platform (os/arch, e.g. linux/arm64) of the build host berth assigns to run %s", which),
	}
}

func secretVolumeSpec() corev1.Volume {
	optional := false
	return corev1.Volume{Name: secretVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: contract.SecretPrefix + "$(context.taskRun.name)",
		Optional:   &optional,
	}}}
}

func secretMount() corev1.VolumeMount {
	return corev1.VolumeMount{Name: secretVolume, MountPath: SecretMountPath, ReadOnly: true}
}

// readsBackAs checks that the edited text is the Task the edits meant, and a valid one.
func readsBackAs(out []byte, want *pipelinev1.Task) error {
	var got pipelinev1.Task
	if err := sigsyaml.UnmarshalStrict(out, &got); err != nil {
		return fmt.Errorf("the remote Task taskgen wrote does not read back (a bug in taskgen; please report it with the input Task): %w", err)
	}
	if !equality.Semantic.DeepEqual(&got, want) {
		return fmt.Errorf("the remote Task taskgen wrote does not read back as intended (a bug in taskgen; please report it with the input Task): %s", difference(want, &got))
	}
	if err := validate(&got); err != nil {
		return fmt.Errorf("the remote Task fails Tekton's validation (a bug in taskgen; please report it with the input Task): %w", err)
	}
	return nil
}

// difference shows where two Tasks' JSON first differ.
func difference(want, got *pipelinev1.Task) string {
	w, _ := json.Marshal(want)
	g, _ := json.Marshal(got)
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	from := max(0, i-60)
	return fmt.Sprintf("intended ...%s..., read back ...%s...", clip(w, from, i+60), clip(g, from, i+60))
}

func clip(b []byte, from, to int) []byte {
	return bytes.TrimSpace(b[min(from, len(b)):min(to, len(b))])
}
