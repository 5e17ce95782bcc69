package tektonstandin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// runSteps runs a TaskRun's steps in order, each as a local process in a sandbox of its own
// (see sandbox.go), the way its pod would: volumes and workspaces laid out as the kubelet
// would, the ServiceAccount's token where rest.InClusterConfig finds it (incluster.go),
// the programs of the step's image on its PATH (images.go), Tekton's variables
// substituted, the ServiceAccount's registry credentials in $HOME/.docker, and the files
// under /tekton/results become the TaskRun's results. Each step that ran has its state in
// the run's steps, as Tekton reports it in status.steps (see stepStates).
func (s *StandIn) runSteps(ctx context.Context, tr *pipelinev1.TaskRun) (*runOutcome, error) {
	out := &runOutcome{}
	if os.Geteuid() != 0 {
		return out, errors.New("the tekton stand-in runs step scripts only as root: each step needs its own mount namespace")
	}
	rs, err := buildSandboxSpec(tr)
	if err != nil {
		return out, err
	}
	dir := filepath.Join(s.opts.WorkDir, "runs", string(tr.UID))
	defer os.RemoveAll(dir)
	tekton := filepath.Join(dir, "tekton")
	for _, d := range []string{"tekton/results", "tekton/scripts", "tekton/creds", "tekton/home", "workspace"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o777); err != nil {
			return out, err
		}
	}
	for i, step := range rs.steps {
		if err := os.MkdirAll(filepath.Join(tekton, "steps", stepName(step.Name, i), "results"), 0o777); err != nil {
			return out, err
		}
	}
	if err := s.writeCredentials(ctx, tr, filepath.Join(tekton, "creds")); err != nil {
		return out, err
	}
	pod, err := s.podOf(ctx, tr)
	if err != nil {
		return out, err
	}
	volumes, workspaces, err := s.materialise(ctx, tr, pod, rs, dir)
	if err != nil {
		return out, err
	}
	podMounts, err := s.serviceAccountMounts(ctx, tr, rs, pod, filepath.Join(dir, "serviceaccount"))
	if err != nil {
		return out, err
	}
	states := stepStates{steps: rs.steps}
	defer func() { out.steps = states.done }() // on every return below, failures included
	for i, step := range rs.steps {
		name := stepName(step.Name, i)
		stepCtx, cancel := ctx, context.CancelFunc(func() {})
		if step.Timeout != nil && step.Timeout.Duration > 0 {
			stepCtx, cancel = context.WithTimeout(ctx, step.Timeout.Duration)
		}
		started := metav1.Now()
		code, err := s.runStep(stepCtx, tr, rs, i, volumes, workspaces, podMounts[name], dir)
		cancel()
		results := stepResults(step, i, filepath.Join(tekton, "steps"))
		if code >= 0 {
			if werr := os.WriteFile(filepath.Join(tekton, "steps", name, "exitCode"), []byte(strconv.Itoa(code)), 0o644); werr != nil {
				return out, werr
			}
		}
		if err == nil {
			states.ended(started, code, terminationCompleted, results)
			continue
		}
		if ctx.Err() != nil {
			return out, fmt.Errorf("%s: %w", name, ctx.Err())
		}
		if stepCtx.Err() != nil {
			states.ended(started, 1, terminationTimeoutExceeded, results) // the entrypoint exits 1
			states.skipRest()
			return out, fmt.Errorf("%s exceeded its timeout of %s", name, step.Timeout.Duration)
		}
		if step.OnError == pipelinev1.Continue && code > 0 {
			states.ended(started, code, terminationContinued, results)
			continue // Tekton records the exit code and goes on
		}
		if code >= 0 {
			states.ended(started, code, terminationError, results)
			states.skipRest()
		}
		return out, err
	}
	out.results = map[string]string{}
	for _, r := range rs.results {
		data, err := os.ReadFile(filepath.Join(tekton, "results", r.Name))
		if err == nil {
			out.results[r.Name] = string(data)
		}
	}
	taskResultsFromSteps(rs.results, states.done, out.results)
	return out, nil
}

// runOutcome is what a run of a TaskRun's steps leaves for its status: the results, and
// the state of each step that ran or was skipped.
type runOutcome struct {
	results map[string]string
	steps   []pipelinev1.StepState
}

// Why a step's container ended, as Tekton's status.steps[].terminationReason says it.
const (
	terminationCompleted       = "Completed"
	terminationError           = "Error"
	terminationContinued       = "Continued"       // onError: continue, a non-zero exit
	terminationSkipped         = "Skipped"         // a step before it failed
	terminationTimeoutExceeded = "TimeoutExceeded" // the step's own timeout
)

// stepStates builds status.steps as Tekton reads it off the pod: a step's container
// terminated with its exit code and the kubelet's reason (Completed for exit 0, else Error),
// beside Tekton's own terminationReason. A step with onError: continue that failed exits 0
// as a container (Completed) but reports its script's exit code; the steps after a failed
// one are skipped by Tekton's entrypoint, which exits 1 for each.
type stepStates struct {
	steps []pipelinev1.Step
	done  []pipelinev1.StepState
}

func (s *stepStates) ended(started metav1.Time, code int, termination string, results []pipelinev1.TaskRunStepResult) {
	reason := terminationCompleted
	if code != 0 && termination != terminationContinued {
		reason = terminationError
	}
	s.add(started, code, reason, termination, results)
}

func (s *stepStates) skipRest() {
	for len(s.done) < len(s.steps) {
		s.add(metav1.Now(), 1, terminationError, terminationSkipped, nil)
	}
}

func (s *stepStates) add(started metav1.Time, code int, reason, termination string, results []pipelinev1.TaskRunStepResult) {
	i := len(s.done)
	container := stepName(s.steps[i].Name, i)
	s.done = append(s.done, pipelinev1.StepState{
		Name:      strings.TrimPrefix(container, "step-"), // as Tekton names it after the container
		Container: container,
		ContainerState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: int32(code), Reason: reason, StartedAt: started, FinishedAt: metav1.Now(),
		}},
		TerminationReason: termination,
		Results:           results,
	})
}

// runStep runs one step and returns its exit code (-1 if it never started). podMounts are the
// step's mounts of what the pod adds to the task's volumes (its ServiceAccount token).
func (s *StandIn) runStep(ctx context.Context, tr *pipelinev1.TaskRun, rs *runSpec, index int,
	volumes, workspaces map[string]mountSource, podMounts []sandboxMount, dir string) (int, error) {
	step := rs.steps[index]
	name := stepName(step.Name, index)
	env, err := s.stepEnv(ctx, tr, rs, step)
	if err != nil {
		return -1, err
	}
	lookup := envLookup(env)
	var argv []string
	if step.Script != "" {
		script := step.Script
		if !strings.HasPrefix(script, "#!") {
			script = "#!/bin/sh\nset -e\n" + script // what Tekton runs a shebang-less script with
		}
		file := fmt.Sprintf("script-%d-%s", index, name)
		if err := writeFile(filepath.Join(dir, "tekton", "scripts", file), []byte(script), 0o755); err != nil {
			return -1, err
		}
		argv = append(argv, filepath.Join(tektonScriptsDir, file))
	} else {
		if len(step.Command) == 0 {
			return -1, unsupported("a step without script or command (%s would run its image's entrypoint)", name)
		}
		for _, c := range step.Command {
			argv = append(argv, expandEnv(c, lookup))
		}
	}
	for _, a := range step.Args {
		argv = append(argv, expandEnv(a, lookup))
	}
	stepsDir := filepath.Join(dir, "tekton", "steps")
	if env, err = withStepResults(env, stepsDir); err == nil {
		argv, err = withStepResults(argv, stepsDir)
	}
	if err != nil {
		return 1, fmt.Errorf("%q: %w", name, err) // Tekton's entrypoint exits 1
	}

	var mounts []sandboxMount
	// Tekton's own: /tekton (results, scripts, step exit codes, credentials) and the
	// /workspace every step of the pod shares.
	mounts = append(mounts, sandboxMount{source: filepath.Join(dir, "tekton"), target: tektonDir},
		sandboxMount{source: filepath.Join(dir, "workspace"), target: "/workspace"})
	for _, w := range rs.workspaces {
		if src, ok := workspaces[w.decl.Name]; ok {
			mounts = append(mounts, sandboxMount{source: src.path, target: w.mountPath, readOnly: src.readOnly})
		}
	}
	for _, m := range step.VolumeMounts {
		src, ok := volumes[m.Name]
		if !ok {
			return -1, invalid("%s mounts volume %q, which the task does not declare", name, m.Name)
		}
		if m.SubPath != "" {
			if src, err = subPath(src, m.SubPath); err != nil {
				return -1, err
			}
		}
		mounts = append(mounts, sandboxMount{source: src.path, target: m.MountPath, readOnly: src.readOnly || m.ReadOnly})
	}
	mounts = append(mounts, podMounts...)
	programs, err := s.imageMounts(step.Image)
	if err != nil {
		return -1, err
	}
	mounts = append(mounts, programs...)

	logPath := s.stepLogPath(client.ObjectKeyFromObject(tr), step.Name)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return -1, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return -1, err
	}
	defer logFile.Close()
	var tail tailBuffer
	out := io.MultiWriter(logFile, &tail)
	if s.opts.StepOutput != nil {
		prefixed := &linePrefixer{w: s.opts.StepOutput, prefix: fmt.Sprintf("[%s/%s %s] ", tr.Namespace, tr.Name, step.Name)}
		defer prefixed.Flush()
		out = io.MultiWriter(logFile, &tail, prefixed)
	}
	sb := sandbox{dir: filepath.Join(dir, "sandbox", strconv.Itoa(index)), mounts: mounts, workingDir: step.WorkingDir, env: env}
	code, err := sb.run(ctx, argv, out)
	switch {
	case err == nil:
		return 0, nil
	case code >= 0: // worded as Tekton words a failed step
		return code, fmt.Errorf("%q exited with code %d; last output:\n%s", name, code, tail.String())
	default:
		return code, fmt.Errorf("%q could not run (%v); last output:\n%s", name, err, tail.String())
	}
}

// StepLog is what a step of a TaskRun run here wrote to its output, as `kubectl logs <pod>
// -c step-<name>` shows it on a cluster; step is the step's name in the Task. Logs stay
// after the run ends (in Options.WorkDir's logs directory).
func (s *StandIn) StepLog(taskRun types.NamespacedName, step string) ([]byte, error) {
	return os.ReadFile(s.stepLogPath(taskRun, step))
}

func (s *StandIn) stepLogPath(taskRun types.NamespacedName, step string) string {
	return filepath.Join(s.opts.WorkDir, "logs", fmt.Sprintf("%s_%s_%s.log", taskRun.Namespace, taskRun.Name, step))
}

// baseEnv is what a step's image would set before the task's own env.
var baseEnv = []corev1.EnvVar{
	{Name: "PATH", Value: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	{Name: "HOME", Value: "/root"},
}

// stepEnv builds a step's environment as the kubelet does: the kubernetes Service's
// variables first, then envFrom, then env in order, each value able to refer to the ones
// before it as $(NAME); a podTemplate's env sits below the step's own. A required Secret or
// ConfigMap key that is missing fails the run, as CreateContainerConfigError fails a Tekton
// TaskRun.
func (s *StandIn) stepEnv(ctx context.Context, tr *pipelinev1.TaskRun, rs *runSpec, step pipelinev1.Step) ([]string, error) {
	var names []string
	values := map[string]string{}
	set := func(name, value string) {
		if _, ok := values[name]; !ok {
			names = append(names, name)
		}
		values[name] = value
	}
	for _, e := range append(append([]corev1.EnvVar{}, baseEnv...), s.apiserver.serviceEnv()...) {
		set(e.Name, e.Value)
	}
	for _, from := range step.EnvFrom {
		data, err := s.envSource(ctx, tr.Namespace, from)
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			set(from.Prefix+k, data[k])
		}
	}
	env := append([]corev1.EnvVar{}, rs.podEnv...)
	for _, e := range step.Env {
		env = slicesDeleteName(env, e.Name)
		env = append(env, e)
	}
	for _, e := range env {
		value := expandEnv(e.Value, func(n string) (string, bool) { v, ok := values[n]; return v, ok })
		if e.ValueFrom != nil {
			v, ok, err := s.envValueFrom(ctx, tr, e)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue // optional and missing: the variable is not set
			}
			value = v
		}
		set(e.Name, value)
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, n+"="+values[n])
	}
	return out, nil
}

func slicesDeleteName(env []corev1.EnvVar, name string) []corev1.EnvVar {
	out := env[:0]
	for _, e := range env {
		if e.Name != name {
			out = append(out, e)
		}
	}
	return out
}

func configError(format string, args ...any) error {
	return &runError{reason: reasonCreateConfigError, message: fmt.Sprintf(format, args...)}
}

func (s *StandIn) envValueFrom(ctx context.Context, tr *pipelinev1.TaskRun, e corev1.EnvVar) (string, bool, error) {
	from := e.ValueFrom
	switch {
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		var secret corev1.Secret
		err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: ref.Name}, &secret)
		if err != nil && !apierrors.IsNotFound(err) {
			return "", false, err
		}
		v, ok := secret.Data[ref.Key]
		if err != nil || !ok {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, configError("env %s: key %q of secret %s/%s not found", e.Name, ref.Key, tr.Namespace, ref.Name)
		}
		return string(v), true, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		var cm corev1.ConfigMap
		err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: ref.Name}, &cm)
		if err != nil && !apierrors.IsNotFound(err) {
			return "", false, err
		}
		v, ok := cm.Data[ref.Key]
		if err != nil || !ok {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, configError("env %s: key %q of config map %s/%s not found", e.Name, ref.Key, tr.Namespace, ref.Name)
		}
		return v, true, nil
	case from.FieldRef != nil:
		switch from.FieldRef.FieldPath {
		case "metadata.name":
			return tr.Status.PodName, true, nil
		case "metadata.namespace":
			return tr.Namespace, true, nil
		case "metadata.uid":
			return string(tr.UID), true, nil // the pod's own UID is not what a script could use here
		case "spec.serviceAccountName":
			return serviceAccountOf(tr), true, nil
		}
	}
	return "", false, unsupported("env %s's valueFrom", e.Name) // checkSupported lets none through
}

func (s *StandIn) envSource(ctx context.Context, namespace string, from corev1.EnvFromSource) (map[string]string, error) {
	out := map[string]string{}
	switch {
	case from.SecretRef != nil:
		var secret corev1.Secret
		err := s.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: from.SecretRef.Name}, &secret)
		if apierrors.IsNotFound(err) && isTrue(from.SecretRef.Optional) {
			return out, nil
		}
		if apierrors.IsNotFound(err) {
			return nil, configError("envFrom: secret %s/%s not found", namespace, from.SecretRef.Name)
		}
		if err != nil {
			return nil, err
		}
		for k, v := range secret.Data {
			out[k] = string(v)
		}
	case from.ConfigMapRef != nil:
		var cm corev1.ConfigMap
		err := s.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: from.ConfigMapRef.Name}, &cm)
		if apierrors.IsNotFound(err) && isTrue(from.ConfigMapRef.Optional) {
			return out, nil
		}
		if apierrors.IsNotFound(err) {
			return nil, configError("envFrom: config map %s/%s not found", namespace, from.ConfigMapRef.Name)
		}
		if err != nil {
			return nil, err
		}
		for k, v := range cm.Data {
			out[k] = v
		}
	}
	return out, nil
}

func envLookup(env []string) func(string) (string, bool) {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(n string) (string, bool) { v, ok := m[n]; return v, ok }
}

// expandEnv resolves the kubelet's $(NAME) references in an env value, command or arg:
// a defined variable is replaced, an undefined reference is kept as written, and $$ is a
// literal $ (so $$(NAME) stays $(NAME)).
func expandEnv(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// writeCredentials does what Tekton's credential initialisation does for registries: the
// docker credentials among the Secrets of the TaskRun's ServiceAccount (kubernetes.io/
// dockerconfigjson, kubernetes.io/dockercfg, and kubernetes.io/basic-auth annotated
// tekton.dev/docker-*) become one .docker/config.json under /tekton/creds, which every step
// finds copied into its $HOME. Git credentials are not implemented and fail the run.
func (s *StandIn) writeCredentials(ctx context.Context, tr *pipelinev1.TaskRun, dir string) error {
	var sa corev1.ServiceAccount
	if err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: serviceAccountOf(tr)}, &sa); err != nil {
		return fmt.Errorf("service account %s: %w", serviceAccountOf(tr), err)
	}
	auths := map[string]json.RawMessage{}
	basic := map[string]json.RawMessage{} // annotated basic-auth secrets win, as in Tekton
	for _, ref := range sa.Secrets {
		var secret corev1.Secret
		err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: ref.Name}, &secret)
		if apierrors.IsNotFound(err) {
			continue // Tekton warns and goes on
		}
		if err != nil {
			return err
		}
		for k := range secret.Annotations {
			if strings.HasPrefix(k, "tekton.dev/git-") {
				return unsupported("git credentials (secret %s of service account %s)", secret.Name, sa.Name)
			}
		}
		switch secret.Type {
		case corev1.SecretTypeDockerConfigJson:
			var cfg struct {
				Auths map[string]json.RawMessage `json:"auths"`
			}
			if err := json.Unmarshal(secret.Data[corev1.DockerConfigJsonKey], &cfg); err != nil {
				return fmt.Errorf("secret %s: %s: %w", secret.Name, corev1.DockerConfigJsonKey, err)
			}
			for k, v := range cfg.Auths {
				auths[k] = v
			}
		case corev1.SecretTypeDockercfg:
			var cfg map[string]json.RawMessage
			if err := json.Unmarshal(secret.Data[corev1.DockerConfigKey], &cfg); err != nil {
				return fmt.Errorf("secret %s: %s: %w", secret.Name, corev1.DockerConfigKey, err)
			}
			for k, v := range cfg {
				auths[k] = v
			}
		case corev1.SecretTypeBasicAuth:
			for k, registry := range secret.Annotations {
				if !strings.HasPrefix(k, "tekton.dev/docker-") {
					continue
				}
				user, pass := string(secret.Data[corev1.BasicAuthUsernameKey]), string(secret.Data[corev1.BasicAuthPasswordKey])
				entry, _ := json.Marshal(map[string]string{"username": user, "password": pass,
					"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))})
				basic[registry] = entry
			}
		}
	}
	for k, v := range basic {
		auths[k] = v
	}
	if len(auths) == 0 {
		return nil
	}
	data, err := json.Marshal(map[string]any{"auths": auths})
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, ".docker", "config.json"), data, 0o600)
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
