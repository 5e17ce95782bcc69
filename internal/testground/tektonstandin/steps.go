package tektonstandin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// runSteps runs a TaskRun's steps in order as local processes, the way its pod would: secret,
// config map and emptyDir volumes appear at their mount paths (bind-mounted in a mount namespace
// private to the step), Tekton's $(params…), $(context…), $(results…) and $(workspaces…)
// references are substituted, and the results files become the TaskRun's results.
func (s *StandIn) runSteps(ctx context.Context, tr *pipelinev1.TaskRun) (map[string]string, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the tekton stand-in runs step scripts only as root: each step needs its own mount namespace for its volumes")
	}
	if tr.Spec.Timeout != nil && tr.Spec.Timeout.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, tr.Spec.Timeout.Duration)
		defer cancel()
	}
	dir := filepath.Join(s.opts.WorkDir, "runs", string(tr.UID))
	defer os.RemoveAll(dir)
	volumes, err := s.materialiseVolumes(ctx, tr, filepath.Join(dir, "volumes"))
	if err != nil {
		return nil, err
	}
	resultsDir := filepath.Join(dir, "results")
	subst, err := substitutions(tr, resultsDir, filepath.Join(dir, "workspaces"))
	if err != nil {
		return nil, err
	}
	for i, step := range tr.Status.TaskSpec.Steps {
		if err := s.runStep(ctx, tr, i, step, subst, volumes, dir); err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("step %s: %w", step.Name, ctx.Err())
			}
			return nil, err
		}
	}
	results := map[string]string{}
	for _, r := range tr.Status.TaskSpec.Results {
		data, err := os.ReadFile(filepath.Join(resultsDir, r.Name))
		if err == nil {
			results[r.Name] = string(data)
		}
	}
	return results, nil
}

func (s *StandIn) runStep(ctx context.Context, tr *pipelinev1.TaskRun, index int, step pipelinev1.Step,
	subst *strings.Replacer, volumes map[string]string, dir string) error {
	argv := make([]string, 0, len(step.Command)+len(step.Args)+1)
	if step.Script != "" {
		script := subst.Replace(step.Script)
		if !strings.HasPrefix(script, "#!") {
			script = "#!/bin/sh\nset -e\n" + script // what Tekton runs a shebang-less script with
		}
		path := filepath.Join(dir, "scripts", fmt.Sprintf("%d-%s", index, step.Name))
		if err := writeFile(path, []byte(script), 0o755); err != nil {
			return err
		}
		argv = append(argv, path)
	} else {
		for _, a := range append(append([]string{}, step.Command...), step.Args...) {
			argv = append(argv, subst.Replace(a))
		}
	}
	if len(argv) == 0 {
		return fmt.Errorf("step %s has neither script nor command", step.Name)
	}

	// The wrapper bind-mounts each volume and then execs the step; paths travel as arguments,
	// never inside the shell text.
	wrapper := []string{"/bin/sh", "-c",
		`set -e; while [ "$1" != -- ]; do mount --bind "$1" "$2"; if [ "$3" = ro ]; then mount -o remount,bind,ro "$2"; fi; shift 3; done; shift; exec "$@"`,
		"step"}
	for _, m := range step.VolumeMounts {
		src, ok := volumes[m.Name]
		if !ok {
			return fmt.Errorf("step %s mounts volume %q, which the task does not declare", step.Name, m.Name)
		}
		release, err := s.mounts.acquire(m.MountPath)
		if err != nil {
			return err
		}
		defer release()
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		wrapper = append(wrapper, src, m.MountPath, mode)
	}
	wrapper = append(append(wrapper, "--"), argv...)

	env, err := s.stepEnv(ctx, tr, step, subst)
	if err != nil {
		return err
	}
	workDir := subst.Replace(step.WorkingDir)
	if workDir == "" {
		workDir = filepath.Join(dir, "work")
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(s.opts.WorkDir, "logs", fmt.Sprintf("%s_%s_%s.log", tr.Namespace, tr.Name, step.Name))
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	var tail tailBuffer
	out := io.MultiWriter(logFile, &tail)
	if s.opts.StepOutput != nil {
		prefixed := &linePrefixer{w: s.opts.StepOutput, prefix: fmt.Sprintf("[%s/%s %s] ", tr.Namespace, tr.Name, step.Name)}
		defer prefixed.Flush()
		out = io.MultiWriter(logFile, &tail, prefixed)
	}

	cmd := exec.CommandContext(ctx, wrapper[0], wrapper[1:]...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = workDir, env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("step %s failed (%v); last output:\n%s", step.Name, err, tail.String())
	}
	return nil
}

func (s *StandIn) stepEnv(ctx context.Context, tr *pipelinev1.TaskRun, step pipelinev1.Step, subst *strings.Replacer) ([]string, error) {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=/root"}
	for _, e := range step.Env {
		value := subst.Replace(e.Value)
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			var secret corev1.Secret
			if err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: ref.SecretKeyRef.Name}, &secret); err != nil {
				return nil, fmt.Errorf("step %s env %s: %w", step.Name, e.Name, err)
			}
			value = string(secret.Data[ref.SecretKeyRef.Key])
		}
		env = append(env, e.Name+"="+value)
	}
	return env, nil
}

// materialiseVolumes writes each secret, config map and emptyDir volume of the task into its
// own directory and returns volume name → directory.
func (s *StandIn) materialiseVolumes(ctx context.Context, tr *pipelinev1.TaskRun, dir string) (map[string]string, error) {
	paths := map[string]string{}
	for _, v := range volumes(tr) {
		path := filepath.Join(dir, v.Name)
		if err := os.MkdirAll(path, 0o755); err != nil {
			return nil, err
		}
		paths[v.Name] = path
		switch {
		case v.Secret != nil:
			var secret corev1.Secret
			if err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: v.Secret.SecretName}, &secret); err != nil {
				return nil, fmt.Errorf("volume %s: secret %s: %w", v.Name, v.Secret.SecretName, err)
			}
			if err := writeKeys(path, secret.Data, v.Secret.Items, v.Secret.DefaultMode); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
		case v.ConfigMap != nil:
			var cm corev1.ConfigMap
			if err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: v.ConfigMap.Name}, &cm); err != nil {
				return nil, fmt.Errorf("volume %s: config map %s: %w", v.Name, v.ConfigMap.Name, err)
			}
			data := map[string][]byte{}
			for k, val := range cm.Data {
				data[k] = []byte(val)
			}
			if err := writeKeys(path, data, v.ConfigMap.Items, v.ConfigMap.DefaultMode); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
		}
	}
	return paths, nil
}

// writeKeys lays out a secret's or config map's keys as files, honouring items and modes as
// the kubelet does (0644 unless the volume says otherwise).
func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32) error {
	mode := os.FileMode(0o644)
	if defaultMode != nil {
		mode = os.FileMode(*defaultMode)
	}
	if len(items) == 0 {
		for k := range data {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, item := range items {
		value, ok := data[item.Key]
		if !ok {
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

// variables are the param and context references Tekton substitutes in a task's spec.
func variables(tr *pipelinev1.TaskRun) []string {
	values := map[string]string{}
	if spec := tr.Status.TaskSpec; spec != nil {
		for _, p := range spec.Params {
			if p.Default != nil {
				values[p.Name] = p.Default.StringVal
			}
		}
	}
	for _, p := range tr.Spec.Params {
		values[p.Name] = p.Value.StringVal
	}
	var pairs []string
	for name, value := range values {
		pairs = append(pairs,
			"$(params."+name+")", value,
			"$(params['"+name+"'])", value,
			`$(params["`+name+`"])`, value)
	}
	return append(pairs,
		"$(context.taskRun.name)", tr.Name,
		"$(context.taskRun.namespace)", tr.Namespace,
		"$(context.taskRun.uid)", string(tr.UID))
}

// volumes returns the task's volumes as its pod gets them: status.taskSpec keeps references
// like multi-platform-ssh-$(context.taskRun.name), the pod has them substituted.
func volumes(tr *pipelinev1.TaskRun) []corev1.Volume {
	if tr.Status.TaskSpec == nil {
		return nil
	}
	subst := strings.NewReplacer(variables(tr)...)
	out := make([]corev1.Volume, 0, len(tr.Status.TaskSpec.Volumes))
	for _, v := range tr.Status.TaskSpec.Volumes {
		v = *v.DeepCopy()
		if v.Secret != nil {
			v.Secret.SecretName = subst.Replace(v.Secret.SecretName)
		}
		if v.ConfigMap != nil {
			v.ConfigMap.Name = subst.Replace(v.ConfigMap.Name)
		}
		out = append(out, v)
	}
	return out
}

// substitutions builds the replacer for Tekton's variable references in steps.
func substitutions(tr *pipelinev1.TaskRun, resultsDir, workspacesDir string) (*strings.Replacer, error) {
	spec := tr.Status.TaskSpec
	pairs := variables(tr)
	if err := os.MkdirAll(resultsDir, 0o777); err != nil {
		return nil, err
	}
	for _, r := range spec.Results {
		pairs = append(pairs, "$(results."+r.Name+".path)", filepath.Join(resultsDir, r.Name))
	}
	for _, w := range spec.Workspaces {
		path := filepath.Join(workspacesDir, w.Name)
		if err := os.MkdirAll(path, 0o777); err != nil {
			return nil, err
		}
		pairs = append(pairs, "$(workspaces."+w.Name+".path)", path)
	}
	return strings.NewReplacer(pairs...), nil
}

// mountPoints creates the mount-point directories steps need (a pod's /ssh, say) and removes
// the ones it created once no running step uses them, so the machine is left as it was.
type mountPoints struct {
	mu      sync.Mutex
	users   map[string]int
	created map[string][]string // mount path → directories created for it, deepest last
}

func newMountPoints() *mountPoints {
	return &mountPoints{users: map[string]int{}, created: map[string][]string{}}
}

func (m *mountPoints) acquire(path string) (release func(), err error) {
	path = filepath.Clean(path)
	if !filepath.IsAbs(path) || path == "/" {
		return nil, fmt.Errorf("mount path %q must be an absolute path below /", path)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.users[path] == 0 {
		var missing []string
		for p := path; p != "/"; p = filepath.Dir(p) {
			if _, err := os.Stat(p); err == nil {
				break
			}
			missing = append([]string{p}, missing...)
		}
		for _, p := range missing {
			if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
				return nil, fmt.Errorf("creating mount point %s: %w", p, err)
			}
		}
		m.created[path] = missing
	}
	m.users[path]++
	return func() { m.release(path) }, nil
}

func (m *mountPoints) release(path string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.users[path]--
	if m.users[path] > 0 {
		return
	}
	delete(m.users, path)
	dirs := m.created[path]
	delete(m.created, path)
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i]) // only empty directories go; anything else was not ours alone
	}
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		return err
	}
	return os.Chmod(path, mode) // WriteFile's mode is filtered by umask
}

// tailBuffer keeps the last few KiB of a step's output for its failure message.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const tailSize = 4 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if t.buf.Len() > 2*tailSize {
		keep := append([]byte(nil), t.buf.Bytes()[t.buf.Len()-tailSize:]...)
		t.buf.Reset()
		t.buf.Write(keep)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf.Bytes()
	if len(b) > tailSize {
		b = b[len(b)-tailSize:]
	}
	return string(b)
}

// linePrefixer writes whole lines to w, each behind prefix.
type linePrefixer struct {
	mu      sync.Mutex
	w       io.Writer
	prefix  string
	partial []byte
}

func (l *linePrefixer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		fmt.Fprintf(l.w, "%s%s\n", l.prefix, l.partial[:i])
		l.partial = l.partial[i+1:]
	}
}

// Flush writes a last line that had no newline.
func (l *linePrefixer) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		fmt.Fprintf(l.w, "%s%s\n", l.prefix, l.partial)
		l.partial = nil
	}
}
