//go:build stack

package taskrun

import (
	"context"
	"encoding/json"
	"slices"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// MetadataPatch is metadataPatch as the bytes berth sends, for the tests on the apiserver.
func MetadataPatch(before, after *metav1.ObjectMeta) ([]byte, error) {
	return json.Marshal(metadataPatch(before, after))
}

// TestFailed is testFailed.
var TestFailed = testFailed

// MaxCleanBackoff is the longest wait between two tries of a failing clean.
const MaxCleanBackoff = maxCleanBackoff

// RestoredLine is the line of a platform that a controller starting now, with config cfg, finds
// from the cluster before its first decision: the records in namespace and the TaskRuns that
// wait without one (restoreRecord and restoreQueue on a new ledger).
func RestoredLine(ctx context.Context, c client.Client, namespace string, cfg *config.Config, platform string) ([]allocation.Task, error) {
	store := hostconfig.NewStore()
	store.Apply(cfg)
	r := &Reconciler{Client: c, APIReader: c, Namespace: namespace, Config: store, Capacity: capacity.New()}
	r.init()
	r.line.client = userTaskIndex{Client: c, gate: r.gate}
	var records berthv1.AllocationList
	if err := c.List(ctx, &records, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	for i := range records.Items {
		r.line.restoreRecord(&records.Items[i], false)
	}
	if err := r.line.restoreQueue(ctx, records.Items); err != nil {
		return nil, err
	}
	return r.Capacity.Queue(platform), nil
}

// userTaskIndex answers a list through the cache's user-task index (userTasks) as the cache
// does, for a client that reads the apiserver itself, which knows no such field.
type userTaskIndex struct {
	client.Client
	gate gate
}

func (u userTaskIndex) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	var o client.ListOptions
	o.ApplyOptions(opts)
	trs, ok := list.(*pipelinev1.TaskRunList)
	if !ok || o.FieldSelector == nil || o.FieldSelector.String() != fields.OneTermEqualSelector(userTaskField, "true").String() {
		return u.Client.List(ctx, list, opts...)
	}
	o.FieldSelector = nil
	if err := u.Client.List(ctx, trs, &o); err != nil {
		return err
	}
	trs.Items = slices.DeleteFunc(trs.Items, func(tr pipelinev1.TaskRun) bool { return len(u.gate.indexUserTasks(&tr)) == 0 })
	return nil
}

// EchoFilter is a client that notes its writes, and the predicate that holds back their
// echoes (echoes), as the task controller has them.
func EchoFilter(c client.Client) (client.Client, predicate.Predicate) {
	e := &echoes{}
	return e.noting(c), e.notEchoes()
}
