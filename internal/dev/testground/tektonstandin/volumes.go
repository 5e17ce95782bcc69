package tektonstandin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
)

// mountSource is what a volume or workspace mount shows: a directory (or file) of this
// machine, and whether the kubelet would mount it read-only whatever the mount says (secret,
// config map and projected volumes always are).
type mountSource struct {
	path     string
	readOnly bool
}

// podVolumes returns the task's volumes as its pod gets them: status.taskSpec keeps
// references like multi-platform-ssh-$(context.taskRun.name) or $(params.ACTIVATION_KEY), the
// pod has them substituted. A TaskRun whose params do not validate keeps them as written.
func podVolumes(tr *pipelinev1.TaskRun) []corev1.Volume {
	if tr.Status.TaskSpec == nil {
		return nil
	}
	spec := (&pipelinev1.TaskSpec{Params: tr.Status.TaskSpec.Params, Volumes: tr.Status.TaskSpec.Volumes}).DeepCopy()
	if strs, arrays, err := paramReplacements(tr, spec); err == nil {
		applyReplacements(spec, strs, arrays)
	}
	applyReplacements(spec, contextReplacements(tr), nil)
	return spec.Volumes
}

// workspaceVolume is the volume Tekton makes of a workspace binding. A volumeClaimTemplate
// gets a fresh directory per TaskRun, as the claim Tekton would create for it.
func workspaceVolume(w boundWorkspace) corev1.Volume {
	b := w.binding
	v := corev1.Volume{Name: "ws-" + w.decl.Name}
	switch {
	case b.PersistentVolumeClaim != nil:
		v.PersistentVolumeClaim = b.PersistentVolumeClaim.DeepCopy()
	case b.Secret != nil:
		v.Secret = b.Secret.DeepCopy()
	case b.ConfigMap != nil:
		v.ConfigMap = b.ConfigMap.DeepCopy()
	case b.Projected != nil:
		v.Projected = b.Projected.DeepCopy()
	default: // emptyDir, volumeClaimTemplate
		v.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
	return v
}

// requiredObject is a Secret or ConfigMap without which the kubelet would not start the pod.
type requiredObject struct {
	kind, name, usedBy string
}

func (o requiredObject) String() string { return fmt.Sprintf("%s %s (%s)", o.kind, o.name, o.usedBy) }

// requiredObjects lists the Secrets and ConfigMaps the pod's volumes and workspaces need:
// those not marked optional. Optional ones that are missing become empty directories.
func requiredObjects(rs *runSpec) []requiredObject {
	var out []requiredObject
	add := func(v corev1.Volume, usedBy string) {
		switch {
		case v.Secret != nil && !isTrue(v.Secret.Optional):
			out = append(out, requiredObject{"secret", v.Secret.SecretName, usedBy})
		case v.ConfigMap != nil && !isTrue(v.ConfigMap.Optional):
			out = append(out, requiredObject{"configmap", v.ConfigMap.Name, usedBy})
		case v.Projected != nil:
			for _, s := range v.Projected.Sources {
				if s.Secret != nil && !isTrue(s.Secret.Optional) {
					out = append(out, requiredObject{"secret", s.Secret.Name, usedBy})
				}
				if s.ConfigMap != nil && !isTrue(s.ConfigMap.Optional) {
					out = append(out, requiredObject{"configmap", s.ConfigMap.Name, usedBy})
				}
			}
		}
	}
	for _, v := range rs.volumes {
		add(v, "volume "+v.Name)
	}
	for _, w := range rs.workspaces {
		if w.binding != nil {
			add(workspaceVolume(w), "workspace "+w.decl.Name)
		}
	}
	return out
}

// missingObjects are the required Secrets and ConfigMaps that do not exist yet.
func (s *StandIn) missingObjects(ctx context.Context, namespace string, rs *runSpec) ([]string, error) {
	var missing []string
	for _, o := range requiredObjects(rs) {
		key := types.NamespacedName{Namespace: namespace, Name: o.name}
		var err error
		if o.kind == "secret" {
			err = s.client.Get(ctx, key, &corev1.Secret{})
		} else {
			err = s.client.Get(ctx, key, &corev1.ConfigMap{})
		}
		if apierrors.IsNotFound(err) {
			missing = append(missing, o.String())
			continue
		}
		if err != nil {
			return nil, err
		}
	}
	return missing, nil
}

// podOf is the TaskRun's pod, which ensurePod created before any of its work started.
func (s *StandIn) podOf(ctx context.Context, tr *pipelinev1.TaskRun) (*corev1.Pod, error) {
	var pod corev1.Pod
	if err := s.reader.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: tr.Status.PodName}, &pod); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", tr.Namespace, tr.Status.PodName, err)
	}
	return &pod, nil
}

// materialise lays out every volume and bound workspace of the run under dir, the way the
// kubelet would before the pod's first container starts: volume name → source, and
// workspace name → source.
func (s *StandIn) materialise(ctx context.Context, tr *pipelinev1.TaskRun, pod *corev1.Pod, rs *runSpec, dir string) (volumes, workspaces map[string]mountSource, err error) {
	volumes, workspaces = map[string]mountSource{}, map[string]mountSource{}
	for _, v := range rs.volumes {
		src, err := s.materialiseVolume(ctx, tr, pod, v, filepath.Join(dir, "volumes", v.Name))
		if err != nil {
			return nil, nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		volumes[v.Name] = src
	}
	for _, w := range rs.workspaces {
		if w.binding == nil {
			continue
		}
		src, err := s.materialiseVolume(ctx, tr, pod, workspaceVolume(w), filepath.Join(dir, "workspaces", w.decl.Name))
		if err != nil {
			return nil, nil, fmt.Errorf("workspace %s: %w", w.decl.Name, err)
		}
		if w.binding.SubPath != "" {
			if src, err = subPath(src, w.binding.SubPath); err != nil {
				return nil, nil, fmt.Errorf("workspace %s: %w", w.decl.Name, err)
			}
		}
		src.readOnly = src.readOnly || w.decl.ReadOnly
		workspaces[w.decl.Name] = src
	}
	return volumes, workspaces, nil
}

// materialiseVolume writes one volume into path (a persistentVolumeClaim lives elsewhere, for
// as long as the stand-in's work directory: TaskRuns that share a claim share its files).
func (s *StandIn) materialiseVolume(ctx context.Context, tr *pipelinev1.TaskRun, pod *corev1.Pod, v corev1.Volume, path string) (mountSource, error) {
	if v.PersistentVolumeClaim != nil {
		claim := v.PersistentVolumeClaim.ClaimName
		var pvc corev1.PersistentVolumeClaim
		if err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: claim}, &pvc); err != nil {
			if apierrors.IsNotFound(err) {
				return mountSource{}, &runError{reason: reasonCreateConfigError, message: fmt.Sprintf("persistentVolumeClaim %s/%s not found", tr.Namespace, claim)}
			}
			return mountSource{}, err
		}
		dir := filepath.Join(s.opts.WorkDir, "claims", tr.Namespace, claim)
		return mountSource{path: dir, readOnly: v.PersistentVolumeClaim.ReadOnly}, os.MkdirAll(dir, 0o755)
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return mountSource{}, err
	}
	switch {
	case v.EmptyDir != nil:
		return mountSource{path: path}, os.Chmod(path, 0o777) // as the kubelet makes an emptyDir
	case v.Secret != nil:
		return mountSource{path: path, readOnly: true}, s.writeSecret(ctx, tr.Namespace, v.Secret.SecretName, path, v.Secret.Items, v.Secret.DefaultMode, isTrue(v.Secret.Optional))
	case v.ConfigMap != nil:
		return mountSource{path: path, readOnly: true}, s.writeConfigMap(ctx, tr.Namespace, v.ConfigMap.Name, path, v.ConfigMap.Items, v.ConfigMap.DefaultMode, isTrue(v.ConfigMap.Optional))
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			var err error
			switch {
			case src.Secret != nil:
				err = s.writeSecret(ctx, tr.Namespace, src.Secret.Name, path, src.Secret.Items, v.Projected.DefaultMode, isTrue(src.Secret.Optional))
			case src.ConfigMap != nil:
				err = s.writeConfigMap(ctx, tr.Namespace, src.ConfigMap.Name, path, src.ConfigMap.Items, v.Projected.DefaultMode, isTrue(src.ConfigMap.Optional))
			case src.ServiceAccountToken != nil:
				err = s.writeToken(ctx, tr, pod, src.ServiceAccountToken, path, v.Projected.DefaultMode)
			}
			if err != nil {
				return mountSource{}, err
			}
		}
		return mountSource{path: path, readOnly: true}, nil
	}
	return mountSource{}, unsupported("volume %s's kind", v.Name) // checkSupported lets none through
}

func (s *StandIn) writeSecret(ctx context.Context, namespace, name, dir string, items []corev1.KeyToPath, mode *int32, optional bool) error {
	var secret corev1.Secret
	if err := s.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &secret); err != nil {
		if apierrors.IsNotFound(err) && optional {
			return nil
		}
		return fmt.Errorf("secret %s: %w", name, err)
	}
	if err := writeKeys(dir, secret.Data, items, mode, optional); err != nil {
		return fmt.Errorf("secret %s: %w", name, err)
	}
	return nil
}

func (s *StandIn) writeConfigMap(ctx context.Context, namespace, name, dir string, items []corev1.KeyToPath, mode *int32, optional bool) error {
	var cm corev1.ConfigMap
	if err := s.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &cm); err != nil {
		if apierrors.IsNotFound(err) && optional {
			return nil
		}
		return fmt.Errorf("config map %s: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	if err := writeKeys(dir, data, items, mode, optional); err != nil {
		return fmt.Errorf("config map %s: %w", name, err)
	}
	return nil
}

// writeToken asks the apiserver for a token of the TaskRun's ServiceAccount with the
// projection's audience and lifetime, bound to the pod, as the kubelet does for a
// serviceAccountToken source.
func (s *StandIn) writeToken(ctx context.Context, tr *pipelinev1.TaskRun, pod *corev1.Pod, p *corev1.ServiceAccountTokenProjection, dir string, mode *int32) error {
	token, err := s.requestToken(ctx, tr, pod, p.Audience, p.ExpirationSeconds)
	if err != nil {
		return fmt.Errorf("serviceAccountToken: %w", err)
	}
	m := os.FileMode(0o644)
	if mode != nil {
		m = os.FileMode(*mode)
	}
	return writeFile(filepath.Join(dir, p.Path), []byte(token), m)
}

// writeKeys lays out a secret's or config map's keys as files, honouring items and modes as
// the kubelet does (0644 unless the volume says otherwise). An item naming a key that is
// missing is an error unless the source is optional.
func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32, optional bool) error {
	mode := os.FileMode(0o644)
	if defaultMode != nil {
		mode = os.FileMode(*defaultMode)
	}
	if len(items) == 0 {
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, item := range items {
		value, ok := data[item.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("key %q missing", item.Key)
		}
		m := mode
		if item.Mode != nil {
			m = os.FileMode(*item.Mode)
		}
		if err := writeFile(filepath.Join(dir, item.Path), value, m); err != nil {
			return err
		}
	}
	return nil
}

// subPath is a mount of part of a volume; the kubelet creates a missing sub-path as a
// directory.
func subPath(src mountSource, sub string) (mountSource, error) {
	p := filepath.Join(src.path, filepath.Clean("/"+sub))
	if _, err := os.Lstat(p); os.IsNotExist(err) {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return mountSource{}, err
		}
	}
	return mountSource{path: p, readOnly: src.readOnly}, nil
}

func serviceAccountOf(tr *pipelinev1.TaskRun) string {
	if tr.Spec.ServiceAccountName != "" {
		return tr.Spec.ServiceAccountName
	}
	return defaultServiceAccount
}

func isTrue(b *bool) bool { return b != nil && *b }
