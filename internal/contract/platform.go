package contract

import pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"

// Platform is the value of a TaskRun's PLATFORM param, "" if it has none.
func Platform(tr *pipelinev1.TaskRun) string {
	for _, p := range tr.Spec.Params {
		if p.Name == PlatformParam {
			return p.Value.StringVal
		}
	}
	return ""
}
