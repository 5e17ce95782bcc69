package taskrun

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// Internal TaskRuns have names derived from what they are for, so a reconcile that runs again
// after a crash finds the one it created instead of creating a second.

func provisionName(user *pipelinev1.TaskRun, host string) string {
	return "provision-" + shortHash(user.Namespace, user.Name, string(user.UID), host)
}

func cleanName(user *pipelinev1.TaskRun, host string) string {
	return "clean-" + shortHash(user.Namespace, user.Name, string(user.UID), host)
}

func updateName(host string, at time.Time) string {
	return "update-" + shortHash(host, strconv.FormatInt(at.Unix(), 10))
}

func shortHash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func param(name, value string) pipelinev1.Param {
	return pipelinev1.Param{Name: name, Value: *pipelinev1.NewStructuredValues(value)}
}

// internalTaskRun is the skeleton of a provision, clean or update TaskRun in the controller's
// namespace, with the host's admin key mounted as the ssh workspace.
func (r *Reconciler) internalTaskRun(name, taskType, task string, host *config.StaticHost, user *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	labels := map[string]string{contract.TaskTypeLabel: taskType, contract.AssignedHostLabel: host.Name}
	if user != nil {
		labels[contract.UserTaskNameLabel] = user.Name
		labels[contract.UserTaskNamespaceLabel] = user.Namespace
	}
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Namespace, Labels: labels},
		Spec: pipelinev1.TaskRunSpec{
			TaskRef:            &pipelinev1.TaskRef{Name: task, Kind: pipelinev1.NamespacedTaskKind},
			ServiceAccountName: r.TaskServiceAccount,
			Workspaces: []pipelinev1.WorkspaceBinding{{
				Name: "ssh", Secret: &corev1.SecretVolumeSource{SecretName: host.Secret},
			}},
		},
	}
}

func (r *Reconciler) provisionTaskRun(user *pipelinev1.TaskRun, host *config.StaticHost, platform string, sudo string) *pipelinev1.TaskRun {
	tr := r.internalTaskRun(provisionName(user, host.Name), contract.TaskTypeProvision, r.ProvisionTask, host, user)
	tr.Spec.Params = pipelinev1.Params{
		param("SECRET_NAME", tasksecret.Name(user.Name)),
		param("TASKRUN_NAME", user.Name),
		param("NAMESPACE", user.Namespace),
		param("HOST", host.Address),
		param("USER", host.User),
		param("SUDO_COMMANDS", sudo),
		param("RAW_PLATFORM", platform),
		param("INSTANCE_TAG", ""),
		param("HOST_KEY", host.HostKey),
	}
	return tr
}

func (r *Reconciler) cleanTaskRun(user *pipelinev1.TaskRun, host *config.StaticHost, platform string) *pipelinev1.TaskRun {
	tr := r.internalTaskRun(cleanName(user, host.Name), contract.TaskTypeClean, r.CleanTask, host, user)
	tr.Spec.Params = pipelinev1.Params{
		param("TASKRUN_NAME", user.Name),
		param("NAMESPACE", user.Namespace),
		param("HOST", host.Address),
		param("USER", host.User),
		param("RAW_PLATFORM", platform),
		param("HOST_KEY", host.HostKey),
	}
	return tr
}

func (r *Reconciler) updateTaskRun(host *config.StaticHost, at time.Time) *pipelinev1.TaskRun {
	tr := r.internalTaskRun(updateName(host.Name, at), contract.TaskTypeUpdate, r.UpdateTask, host, nil)
	tr.Spec.Params = pipelinev1.Params{
		param("HOST", host.Address),
		param("USER", host.User),
		param("HOST_KEY", host.HostKey),
	}
	return tr
}
