package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/adminkeys"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/remote"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// plainWrites are the floor's: the label and a secret with a dummy key, the label's removal.
type plainWrites struct {
	ctx context.Context
	c   client.Client
	log io.Writer
}

func (w plainWrites) hand(job floorJob) {
	if err := labelTask(w.ctx, w.c, job.task, job.host.Name, "", false); err != nil {
		fmt.Fprintf(w.log, "floor: labelling %s: %v\n", job.task, err)
	}
	if err := createTaskSecret(w.ctx, w.c, job.task, job.host.User+"@"+job.host.Address, "floor", "/home/floor"); err != nil {
		fmt.Fprintf(w.log, "floor: the secret of %s: %v\n", job.task, err)
	}
}

func (w plainWrites) free(job floorJob) {
	if err := labelTask(w.ctx, w.c, job.task, "", "", false); err != nil {
		fmt.Fprintf(w.log, "floor: releasing %s: %v\n", job.task, err)
	}
}

// safeWrites are the safe floor's: records, the finalizer and build users besides.
type safeWrites struct {
	ctx       context.Context
	c         client.Client
	namespace string // the controller's: the records
	uids      config.UIDRange
	pool      *remote.Pool
	log       io.Writer
	// targets reach each host as its admin, from admin keys read once at the start.
	targets map[*config.StaticHost]remote.Target
}

// reach gets each host's admin key once (hosts sharing a key read it once): the safe floor
// measures the work of a task, and berth too holds its admin keys rather than reading them
// per task.
func (w *safeWrites) reach(hosts []*config.StaticHost, keys *adminkeys.Keys) error {
	w.targets = map[*config.StaticHost]remote.Target{}
	for _, h := range hosts {
		signer, err := keys.Signer(w.ctx, h.Secret)
		if err != nil {
			return fmt.Errorf("the admin key of host %s: %w", h.Name, err)
		}
		if h.HostKey == "" {
			return fmt.Errorf("the safe floor wants pinned host keys; host %s has none", h.Name)
		}
		pinned, err := remote.ParsePinned(h.HostKey)
		if err != nil {
			return err
		}
		w.targets[h] = remote.Target{Address: h.Address, User: h.User, Signer: signer, HostKeys: pinned, Pool: w.pool}
	}
	return nil
}

// hand writes the record, labels the task (assigned host and, as the contract has it, target
// platform) and puts the finalizer on it, makes the build user with a fresh key and hands the
// secret over in the contract's shape (tasksecret: owned by the TaskRun): berth's order, a
// record before the host.
func (w *safeWrites) hand(job floorJob) {
	ctx := w.ctx
	user := hostops.UserNameFor(string(job.host.Platform), string(job.uid), 0)
	rec := w.record(job, user)
	if err := w.c.Create(ctx, rec); err != nil {
		fmt.Fprintf(w.log, "safe floor: the record of %s: %v\n", job.task, err)
		return
	}
	if err := labelTask(ctx, w.c, job.task, job.host.Name, string(job.host.Platform), true); err != nil {
		fmt.Fprintf(w.log, "safe floor: labelling %s: %v\n", job.task, err)
		return
	}
	private, authorized, err := hostops.NewKey(config.DefaultKeyType, job.task.String())
	if err != nil {
		fmt.Fprintf(w.log, "safe floor: a key for %s: %v\n", job.task, err)
		return
	}
	dir, err := hostops.CreateUserOn(ctx, w.targets[job.host], string(job.host.Platform), hostops.NewUser{
		Name: user, AuthorizedKey: authorized, Owner: job.task.String() + " " + string(job.uid), UIDs: w.uids})
	if err != nil {
		fmt.Fprintf(w.log, "safe floor: the build user of %s: %v\n", job.task, err)
		return
	}
	owner := tasksecret.Owner{Name: job.task.Name, Namespace: job.task.Namespace, UID: job.uid}
	secret := tasksecret.ForHost(owner, tasksecret.Name(job.task.Name), user+"@"+job.host.Address, dir, private)
	if err := w.c.Create(ctx, secret); err != nil {
		fmt.Fprintf(w.log, "safe floor: the secret of %s: %v\n", job.task, err)
	}
}

// free removes the build user, takes the label and finalizer off, and deletes the record.
// A failed removal is logged and the rest goes on: the floor frees the slot after free in any
// case, and a label left on would count as an over-commit where there is none (berth instead
// keeps the record and owes the host the clean).
func (w *safeWrites) free(job floorJob) {
	ctx := w.ctx
	user := hostops.UserNameFor(string(job.host.Platform), string(job.uid), 0)
	if err := hostops.CleanOn(ctx, w.targets[job.host], string(job.host.Platform), user); err != nil {
		fmt.Fprintf(w.log, "safe floor: removing the build user of %s: %v\n", job.task, err)
	}
	if err := labelTask(ctx, w.c, job.task, "", "", true); err != nil {
		fmt.Fprintf(w.log, "safe floor: releasing %s: %v\n", job.task, err)
	}
	rec := &berthv1.Allocation{ObjectMeta: metav1.ObjectMeta{Namespace: w.namespace, Name: string(job.uid)}}
	if err := w.c.Delete(ctx, rec); err != nil {
		fmt.Fprintf(w.log, "safe floor: deleting the record of %s: %v\n", job.task, err)
	}
}

// record is an assignment's record, with what berth's holds while a user is made.
func (w *safeWrites) record(job floorJob, user string) *berthv1.Allocation {
	h := job.host
	return &berthv1.Allocation{
		ObjectMeta: metav1.ObjectMeta{Name: string(job.uid), Namespace: w.namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "berth"}},
		Spec: berthv1.AllocationSpec{
			TaskRun:  berthv1.TaskRunRef{Namespace: job.task.Namespace, Name: job.task.Name, UID: job.uid},
			Platform: string(h.Platform), Strategy: string(config.StrategyStatic), Queued: metav1.Now(),
		},
		Status: berthv1.AllocationStatus{
			Phase: berthv1.PhaseProvisioning, BuildUser: user,
			Login: &berthv1.HostLogin{Host: h.Name, Address: h.Address, AdminUser: h.User, AdminSecret: h.Secret,
				HostKey: h.HostKey, Platform: string(h.Platform)},
		},
	}
}

// labelTask sets the assigned-host label of a task, or takes it off (host ""); a platform
// puts the target-platform label on with it, which stays when the assigned host goes. With
// finalizer, the contract's finalizer goes on or off with the assigned host. A merge patch
// replaces the whole finalizer list: the bench's TaskRuns have no other finalizer.
func labelTask(ctx context.Context, c client.Client, task types.NamespacedName, host, platform string, finalizer bool) error {
	var label any      // null takes the label off
	var finalizers any // null takes them off
	if host != "" {
		label, finalizers = host, []string{contract.Finalizer}
	}
	labels := map[string]any{contract.AssignedHostLabel: label}
	if platform != "" {
		labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(platform)
	}
	meta := map[string]any{"labels": labels}
	if finalizer {
		meta["finalizers"] = finalizers
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: task.Namespace, Name: task.Name}}
	return c.Patch(ctx, tr, client.RawPatch(types.MergePatchType, patch))
}

// createTaskSecret hands a task the plain floor's secret: where to log in (user@address), a key
// and the user's directory, and no owner reference. The plain floor is the machine's
// calibration with the fewest bytes; the safe floor writes the contract's secret
// (tasksecret.ForHost), as berth does.
func createTaskSecret(ctx context.Context, c client.Client, task types.NamespacedName, login, key, dir string) error {
	return c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: contract.SecretPrefix + task.Name, Namespace: task.Namespace,
			Labels: map[string]string{contract.SecretLabel: "true"}},
		Data: map[string][]byte{"host": []byte(login), "id_rsa": []byte(key), "user-dir": []byte(dir)},
	})
}
