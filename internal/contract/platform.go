package contract

import (
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
)

// Platform is the value of a TaskRun's PLATFORM param, "" if it has none.
func Platform(tr *pipelinev1.TaskRun) string {
	for _, p := range tr.Spec.Params {
		if p.Name == PlatformParam {
			return p.Value.StringVal
		}
	}
	return ""
}

// Attempt is the attempt a TaskRun is in: Tekton retries a failed attempt in place, moving its
// status into status.retriesStatus before it makes the next attempt's pod, so the first
// attempt is 1 and each retry adds one. Only Tekton writes the status a tenant's TaskRun has.
func Attempt(tr *pipelinev1.TaskRun) int { return len(tr.Status.RetriesStatus) + 1 }

// ResolvedUserTask says whether a TaskRun has a PLATFORM param and its task spec, as Tekton
// resolved it (status.taskSpec), has a volume of a secret named SecretPrefix...: a user task,
// unless it carries TaskTypeLabel. Before Tekton has resolved it, no TaskRun is one.
func ResolvedUserTask(tr *pipelinev1.TaskRun) bool {
	if Platform(tr) == "" || tr.Status.TaskSpec == nil {
		return false
	}
	for _, v := range tr.Status.TaskSpec.Volumes {
		if v.Secret != nil && strings.HasPrefix(v.Secret.SecretName, SecretPrefix) {
			return true
		}
	}
	return false
}
