package tektonstandin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// tektonResultsDir is where a real step writes its results.
const tektonResultsDir = "/tekton/results"

// StepCommand returns an Executor that runs an internal TaskRun's one step in this process, as
// its pod would run it: run gets the step's args with $(params…) (defaults included),
// $(workspaces.<name>.path) and /tekton/results substituted, the workspaces bound to secrets
// or config maps are written out, and the Task's declared results are read back afterwards.
// It is how tests and the dev stack execute berth's own Tasks with berth's own code.
func (s *StandIn) StepCommand(run func(ctx context.Context, args []string) error) Executor {
	return func(ctx context.Context, tr *pipelinev1.TaskRun) (map[string]string, error) {
		spec := tr.Status.TaskSpec
		if spec == nil || len(spec.Steps) != 1 {
			return nil, fmt.Errorf("TaskRun %s/%s: the in-process executor runs tasks of exactly one step", tr.Namespace, tr.Name)
		}
		dir, err := os.MkdirTemp(s.opts.WorkDir, "step-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		resultsDir, workspacesDir := filepath.Join(dir, "results"), filepath.Join(dir, "workspaces")
		subst, err := substitutions(tr, resultsDir, workspacesDir)
		if err != nil {
			return nil, err
		}
		if err := s.materialiseWorkspaces(ctx, tr, workspacesDir); err != nil {
			return nil, err
		}
		var args []string
		for _, a := range spec.Steps[0].Args {
			a = subst.Replace(a)
			args = append(args, strings.ReplaceAll(a, tektonResultsDir, resultsDir))
		}
		if err := run(ctx, args); err != nil {
			return nil, err
		}
		results := map[string]string{}
		for _, r := range spec.Results {
			if data, err := os.ReadFile(filepath.Join(resultsDir, r.Name)); err == nil {
				results[r.Name] = string(data)
			}
		}
		return results, nil
	}
}

// materialiseWorkspaces writes each workspace bound to a secret or config map into its
// directory, the way the kubelet would mount it.
func (s *StandIn) materialiseWorkspaces(ctx context.Context, tr *pipelinev1.TaskRun, dir string) error {
	for _, w := range tr.Spec.Workspaces {
		path := filepath.Join(dir, w.Name)
		if err := os.MkdirAll(path, 0o755); err != nil {
			return err
		}
		switch {
		case w.Secret != nil:
			var secret corev1.Secret
			if err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: w.Secret.SecretName}, &secret); err != nil {
				return fmt.Errorf("workspace %s: secret %s: %w", w.Name, w.Secret.SecretName, err)
			}
			mode := int32(0o600) // keys must not be readable by others, or ssh refuses them
			if w.Secret.DefaultMode != nil {
				mode = *w.Secret.DefaultMode
			}
			if err := writeKeys(path, secret.Data, w.Secret.Items, &mode); err != nil {
				return fmt.Errorf("workspace %s: %w", w.Name, err)
			}
		case w.ConfigMap != nil:
			var cm corev1.ConfigMap
			if err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: w.ConfigMap.Name}, &cm); err != nil {
				return fmt.Errorf("workspace %s: config map %s: %w", w.Name, w.ConfigMap.Name, err)
			}
			data := map[string][]byte{}
			for k, v := range cm.Data {
				data[k] = []byte(v)
			}
			if err := writeKeys(path, data, w.ConfigMap.Items, w.ConfigMap.DefaultMode); err != nil {
				return fmt.Errorf("workspace %s: %w", w.Name, err)
			}
		}
	}
	return nil
}
