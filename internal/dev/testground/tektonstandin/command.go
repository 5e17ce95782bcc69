package tektonstandin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
)

// StepCommand returns an Executor that runs an internal TaskRun's one step in this process, as
// its pod would run it: run gets the step's args with Tekton's variables substituted (params
// with their defaults, $(workspaces.<name>.path), $(results.<name>.path) and /tekton/results
// pointing at directories of this machine), the workspaces bound to secrets or config maps
// are written out, and the Task's declared results are read back afterwards. It is how tests
// and the dev stack execute berth's own Tasks with berth's own code.
func (s *StandIn) StepCommand(run func(ctx context.Context, args []string) error) Executor {
	return func(ctx context.Context, tr *pipelinev1.TaskRun) (map[string]string, error) {
		if spec := tr.Status.TaskSpec; spec == nil || len(spec.Steps) != 1 {
			return nil, fmt.Errorf("TaskRun %s/%s: the in-process executor runs tasks of exactly one step", tr.Namespace, tr.Name)
		}
		dir, err := os.MkdirTemp(s.opts.WorkDir, "step-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		resultsDir := filepath.Join(dir, "results")
		if err := os.MkdirAll(resultsDir, 0o777); err != nil {
			return nil, err
		}
		// A key in a secret workspace is read by this process, not by a pod's ssh; still, it
		// is kept from other users of the machine.
		tr = tr.DeepCopy()
		for i := range tr.Spec.Workspaces {
			if sec := tr.Spec.Workspaces[i].Secret; sec != nil && sec.DefaultMode == nil {
				sec.DefaultMode = ptr(int32(0o600))
			}
		}
		rs, err := buildRunSpec(tr, layout{
			results:   resultsDir,
			workspace: func(w pipelinev1.WorkspaceDeclaration) string { return filepath.Join(dir, "workspaces", w.Name) },
		})
		if err != nil {
			return nil, err
		}
		pod, err := s.podOf(ctx, tr)
		if err != nil {
			return nil, err
		}
		if _, _, err := s.materialise(ctx, tr, pod, rs, dir); err != nil {
			return nil, err
		}
		var args []string
		for _, a := range rs.steps[0].Args {
			args = append(args, strings.ReplaceAll(a, tektonResultsDir, resultsDir))
		}
		if err := run(ctx, args); err != nil {
			return nil, err
		}
		results := map[string]string{}
		for _, r := range rs.results {
			if data, err := os.ReadFile(filepath.Join(resultsDir, r.Name)); err == nil {
				results[r.Name] = string(data)
			}
		}
		return results, nil
	}
}
