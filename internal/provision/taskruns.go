package provision

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
)

// TaskRuns does host work through internal TaskRuns in the controller's namespace, for
// clusters where only pods may reach hosts. The admin key reaches the step as the ssh workspace
// (a Secret volume the kubelet mounts); the step gets only the public key of the task and
// writes no Secret: the controller writes the tenant's secret itself.
type TaskRuns struct {
	// Client reads internal TaskRuns from the cache (they keep their status and results
	// there): the watch on them brings the news, and waiting costs the apiserver nothing.
	Client    client.Client
	Namespace string
	// Tasks run by the internal TaskRuns, and the ServiceAccount they run as.
	ProvisionTask, CleanTask, UpdateTask, ServiceAccount string
}

// resultUserDir is the provision Task's result naming the new user's build directory.
const resultUserDir = "user-dir"

func internalName(kind, id string) string {
	sum := sha256.Sum256([]byte(id))
	return kind + "-" + hex.EncodeToString(sum[:8])
}

// InternalOwner maps an internal TaskRun to the namespace/name of the user TaskRun it serves
// ("" for host checks): the controller wakes that TaskRun when it ends.
func InternalOwner(tr *pipelinev1.TaskRun) string {
	l := tr.Labels
	if l[contract.TaskTypeLabel] == "" || l[contract.UserTaskNameLabel] == "" {
		return ""
	}
	return l[contract.UserTaskNamespaceLabel] + "/" + l[contract.UserTaskNameLabel]
}

func param(name, value string) pipelinev1.Param {
	return pipelinev1.Param{Name: name, Value: *pipelinev1.NewStructuredValues(value)}
}

func (p *TaskRuns) taskRun(name, taskType, task string, login berthv1.HostLogin, wake string, params ...pipelinev1.Param) *pipelinev1.TaskRun {
	labels := map[string]string{contract.TaskTypeLabel: taskType, contract.AssignedHostLabel: login.Host}
	if ns, n, ok := strings.Cut(wake, "/"); ok {
		labels[contract.UserTaskNamespaceLabel], labels[contract.UserTaskNameLabel] = ns, n
	}
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.Namespace, Labels: labels},
		Spec: pipelinev1.TaskRunSpec{
			TaskRef:            &pipelinev1.TaskRef{Name: task, Kind: pipelinev1.NamespacedTaskKind},
			ServiceAccountName: p.ServiceAccount,
			Params: append(pipelinev1.Params{
				param("HOST", login.Address), param("USER", login.AdminUser),
				param("RAW_PLATFORM", login.Platform), param("HOST_KEY", login.HostKey),
			}, params...),
			Workspaces: []pipelinev1.WorkspaceBinding{{
				Name: "ssh", Secret: &corev1.SecretVolumeSource{SecretName: login.AdminSecret},
			}},
		},
	}
}

// run creates the TaskRun unless it exists, and reports how it stands.
func (p *TaskRuns) run(ctx context.Context, tr *pipelinev1.TaskRun) Outcome {
	var existing pipelinev1.TaskRun
	err := p.Client.Get(ctx, client.ObjectKeyFromObject(tr), &existing)
	if apierrors.IsNotFound(err) {
		if err := p.Client.Create(ctx, tr); err != nil && !apierrors.IsAlreadyExists(err) {
			return Outcome{Done: true, Err: fmt.Errorf("starting %s TaskRun %s: %w", tr.Labels[contract.TaskTypeLabel], tr.Name, err)}
		}
		return Outcome{}
	}
	if err != nil {
		return Outcome{Done: true, Err: err}
	}
	return outcomeOf(&existing)
}

func outcomeOf(tr *pipelinev1.TaskRun) Outcome {
	if !tr.IsDone() {
		return Outcome{}
	}
	if !tr.IsSuccessful() {
		msg := "the TaskRun failed without a message"
		for _, c := range tr.Status.Conditions {
			if c.Type == "Succeeded" && c.Message != "" {
				msg = c.Message
			}
		}
		return Outcome{Done: true, Err: fmt.Errorf("%s TaskRun %s/%s: %s", tr.Labels[contract.TaskTypeLabel], tr.Namespace, tr.Name, msg)}
	}
	for _, r := range tr.Status.Results {
		if r.Name == resultUserDir {
			return Outcome{Done: true, UserDir: strings.TrimSpace(r.Value.StringVal)}
		}
	}
	if tr.Labels[contract.TaskTypeLabel] == contract.TaskTypeProvision {
		return Outcome{Done: true, Err: fmt.Errorf("provision TaskRun %s/%s succeeded without a %s result", tr.Namespace, tr.Name, resultUserDir)}
	}
	return Outcome{Done: true}
}

// Provision runs the provision TaskRun of the job.
func (p *TaskRuns) Provision(ctx context.Context, job Job) Outcome {
	return p.run(ctx, p.taskRun(internalName(contract.TaskTypeProvision, job.ID), contract.TaskTypeProvision, p.ProvisionTask, job.Login, job.Wake,
		param("USER_NAME", job.User), param("AUTHORIZED_KEY", strings.TrimSpace(string(job.AuthorizedKey))),
		param("OWNER", job.Owner), param("SUDO_COMMANDS", strings.Join(job.SudoCommands, ",")), param("UID_RANGE", uidRange(job.UIDs)),
		param("LIMITS", limitsParam(job.Limits))))
}

// limitsParam is the LIMITS param: the limit keys (config.BuildLimits.String), empty for the
// defaults.
func limitsParam(l config.BuildLimits) string {
	if l == (config.BuildLimits{}) {
		return ""
	}
	return l.String()
}

// uidRange is the UID_RANGE param: empty (the default range) when the config sets none.
func uidRange(r config.UIDRange) string {
	if r == (config.UIDRange{}) {
		return ""
	}
	return r.String()
}

// Clean runs the clean TaskRun of the job, after its provision TaskRun has ended.
func (p *TaskRuns) Clean(ctx context.Context, job Job) Outcome {
	var prov pipelinev1.TaskRun
	err := p.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: internalName(contract.TaskTypeProvision, job.ID)}, &prov)
	if err == nil && !prov.IsDone() {
		// A clean now could run before the provision it must undo: stop that one first.
		if prov.Spec.Status != pipelinev1.TaskRunSpecStatusCancelled {
			patch := client.MergeFrom(prov.DeepCopy())
			prov.Spec.Status = pipelinev1.TaskRunSpecStatusCancelled
			if err := p.Client.Patch(ctx, &prov, patch); client.IgnoreNotFound(err) != nil {
				return Outcome{Done: true, Err: err}
			}
		}
		return Outcome{}
	}
	return p.run(ctx, p.taskRun(internalName(contract.TaskTypeClean, job.ID), contract.TaskTypeClean, p.CleanTask, job.Login, job.Wake,
		param("USER_NAME", job.User)))
}

// Check runs an update TaskRun for the host and waits for its answer.
func (p *TaskRuns) Check(ctx context.Context, login berthv1.HostLogin) Health {
	name := internalName(contract.TaskTypeUpdate, login.Host+"/"+time.Now().UTC().Format(time.RFC3339))
	tr := p.taskRun(name, contract.TaskTypeUpdate, p.UpdateTask, login, "")
	if err := p.Client.Create(ctx, tr); err != nil && !apierrors.IsAlreadyExists(err) {
		return Health{Reason: err.Error()}
	}
	defer p.delete(context.WithoutCancel(ctx), tr.Name)
	var got pipelinev1.TaskRun
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := p.Client.Get(ctx, client.ObjectKeyFromObject(tr), &got); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return got.IsDone(), nil
	})
	if err != nil {
		return Health{Reason: fmt.Sprintf("the update TaskRun %s gave no answer: %v", name, err)}
	}
	if o := outcomeOf(&got); o.Err != nil {
		return Health{Reason: o.Err.Error()}
	}
	health := Health{Reason: "the update TaskRun reported no result"}
	for _, r := range got.Status.Results {
		switch r.Name {
		case "healthy":
			health.Healthy = strings.TrimSpace(r.Value.StringVal) == "true"
		case "reason":
			health.Reason = r.Value.StringVal
		case "warning":
			health.Warning = strings.TrimSpace(r.Value.StringVal)
		}
	}
	if health.Healthy {
		health.Reason = ""
	}
	return health
}

// Forget deletes the job's internal TaskRuns.
func (p *TaskRuns) Forget(id string) {
	ctx := context.Background()
	p.delete(ctx, internalName(contract.TaskTypeProvision, id))
	p.delete(ctx, internalName(contract.TaskTypeClean, id))
}

func (p *TaskRuns) delete(ctx context.Context, name string) {
	// Best effort: a TaskRun left behind is retried by the next Forget of the job, and is
	// harmless meanwhile (it holds no key but the task's public one).
	tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: name}}
	_ = p.Client.Delete(ctx, tr)
}
