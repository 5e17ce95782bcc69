package taskrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"sort"
	"sync"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/provision"
)

// taskRunKeyField indexes Allocations by the namespace/name of their TaskRun.
const taskRunKeyField = "spec.taskRun.key"

func indexTaskRunKey(o client.Object) []string {
	return []string{o.(*berthv1.Allocation).Spec.TaskRun.Key()}
}

// recordStore reads and writes berth's Allocation records, in the controller's namespace.
type recordStore struct {
	client    client.Client
	namespace string
	// dropped holds the records berth deleted (recordID) while the cache may still show them: a
	// pass reading such an older copy would act on a record that is gone, and remove its
	// build user from the host once more and delete it again. The watch's delete event of
	// each takes it out (seenGone).
	dropped sync.Map
}

// of lists the records of every TaskRun that had this name, oldest first.
func (rs *recordStore) of(ctx context.Context, key types.NamespacedName) ([]*berthv1.Allocation, error) {
	var list berthv1.AllocationList
	if err := rs.client.List(ctx, &list, client.InNamespace(rs.namespace),
		client.MatchingFields{taskRunKeyField: key.Namespace + "/" + key.Name}); err != nil {
		return nil, err
	}
	out := make([]*berthv1.Allocation, 0, len(list.Items))
	for i := range list.Items {
		if _, gone := rs.dropped.Load(idOf(&list.Items[i])); !gone {
			out = append(out, &list.Items[i])
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp) })
	return out, nil
}

// forTask is the record of a TaskRun about to hold or wait for a slot.
func (rs *recordStore) forTask(tr *pipelinev1.TaskRun, strategy config.Strategy) *berthv1.Allocation {
	return &berthv1.Allocation{
		ObjectMeta: metav1.ObjectMeta{
			Name: string(tr.UID), Namespace: rs.namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "berth"},
		},
		Spec: berthv1.AllocationSpec{
			TaskRun:  berthv1.TaskRunRef{Namespace: tr.Namespace, Name: tr.Name, UID: tr.UID},
			Platform: contract.Platform(tr), Strategy: string(strategy), Queued: tr.CreationTimestamp,
		},
	}
}

// save writes a record: created when new, else replaced under optimistic locking, so a write
// based on a stale copy fails instead of undoing a newer one.
func (rs *recordStore) save(ctx context.Context, rec *berthv1.Allocation) error {
	if rec.ResourceVersion == "" {
		return rs.client.Create(ctx, rec)
	}
	return rs.client.Update(ctx, rec)
}

// drop deletes a record, only the exact version this decision was made on. From then on the
// record is gone to of, whatever the cache shows, until the watch's delete event tells the
// cache so too. It is marked before the request, so that event, which can only come after,
// always finds the mark; a delete that fails takes off the mark it made.
func (rs *recordStore) drop(ctx context.Context, rec *berthv1.Allocation) error {
	id := idOf(rec)
	_, marked := rs.dropped.LoadOrStore(id, struct{}{})
	err := rs.client.Delete(ctx, rec, client.Preconditions{UID: &rec.UID, ResourceVersion: &rec.ResourceVersion})
	if err != nil && !marked {
		// Refused, or gone already (whose delete event may have passed): nothing to wait for.
		rs.dropped.Delete(id)
	}
	return client.IgnoreNotFound(err)
}

// seenGone is the watch's word that a record is gone from the cache.
func (rs *recordStore) seenGone(o client.Object) { rs.dropped.Delete(idOf(o)) }

// recordID names one record object: its name (its TaskRun's UID) and its own UID.
type recordID struct {
	name string
	uid  types.UID
}

func idOf(o client.Object) recordID { return recordID{o.GetName(), o.GetUID()} }

func taskOfRecord(rec *berthv1.Allocation) allocation.Task {
	return allocation.Task{Namespace: rec.Spec.TaskRun.Namespace, Name: rec.Spec.TaskRun.Name}
}

// debtTask is the ledger's name for a slot held by a cleanup berth still owes a host. It is in
// the TaskRun's namespace, so that it counts against max-tasks-per-namespace until the host is
// clean; the "/" in its name keeps it apart from every TaskRun.
func debtTask(rec *berthv1.Allocation, user string) allocation.Task {
	return allocation.Task{Namespace: rec.Spec.TaskRun.Namespace, Name: capacity.DebtPrefix + string(rec.Spec.TaskRun.UID) + "/" + user}
}

// job is the host work for one build user of the record.
func job(rec *berthv1.Allocation, login berthv1.HostLogin, user string) provision.Job {
	ref := rec.Spec.TaskRun
	return provision.Job{
		ID: string(ref.UID) + "/" + user, Login: login, User: user,
		Owner: ref.Namespace + "/" + ref.Name + " " + string(ref.UID),
		Wake:  ref.Namespace + "/" + ref.Name,
	}
}

// digest fingerprints a secret's data, to notice someone else's edit.
func digest(data map[string][]byte) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(data)) {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write(data[k])
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}
