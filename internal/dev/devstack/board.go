package devstack

import (
	"context"
	"sort"
	"strconv"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// What the dev stack shows of each user TaskRun: where berth has it, from berth's record of it
// (an Allocation named by its UID) and its labels. A record goes once its task is cleaned up,
// so the board remembers the host and the wait it last saw.

// TaskRun states on the board.
const (
	StateWaiting      = "waiting"
	StateProvisioning = "provisioning"
	StateRunning      = "running"
	StateCleaning     = "cleaning"
	StateDone         = "done"
	StateError        = "error"
)

// LocalHost is what the board shows as the host of a task run on the cluster's own nodes.
const LocalHost = "local"

// NoWait is the Waited of a task that waits for no slot.
const NoWait time.Duration = -1

// TaskRunRow is one user TaskRun on the board.
type TaskRunRow struct {
	Namespace, Name string
	// Platform is the platform it asks for, "" if none (berth leaves it alone).
	Platform string
	State    string
	// Position of Waiters when berth tells a waiting task's place in line; 0 when it does not.
	Position, Waiters int
	// Host is the static host or VM it holds a slot of, LocalHost, or "".
	Host string
	// Waited is how long it waited for its slot, or has waited so far; NoWait for a task
	// that waits for none (run locally, or without a platform).
	Waited time.Duration
	// Message is the TaskRun's failure, for a task in StateError.
	Message string
}

// Key is namespace/name.
func (r TaskRunRow) Key() string { return r.Namespace + "/" + r.Name }

// Board reads the user TaskRuns of the stack as rows.
type Board struct {
	stack *Stack
	seen  map[string]TaskRunRow // by UID: what a record told while there was one
	// A TaskRun's creation time has whole seconds; when the board saw it appear, the time it
	// first saw it is closer (within a refresh) to when it began to wait.
	began     time.Time
	firstSeen map[string]time.Time
}

// Board returns a board of the stack's user TaskRuns.
func (s *Stack) Board() *Board {
	return &Board{stack: s, seen: map[string]TaskRunRow{}, firstSeen: map[string]time.Time{}}
}

// Rows reads every user TaskRun, oldest first.
func (b *Board) Rows(ctx context.Context) ([]TaskRunRow, error) {
	c := b.stack.ControlPlane.Client
	if b.began.IsZero() {
		b.began = time.Now()
	}
	var runs pipelinev1.TaskRunList
	if err := c.List(ctx, &runs); err != nil {
		return nil, err
	}
	var records berthv1.AllocationList
	if err := c.List(ctx, &records, client.InNamespace(Namespace)); err != nil {
		return nil, err
	}
	// A local task holds its host label only while it runs, which may be shorter than a
	// refresh: the config tells that its platform is local.
	cfg, err := hostconfig.Read(ctx, c, Namespace)
	if err != nil {
		return nil, err
	}
	// A record that holds a slot is not written again when its build user is handed over:
	// the task's secret naming that user tells.
	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.HasLabels{contract.SecretLabel}); err != nil {
		return nil, err
	}
	secretOf := map[string]*corev1.Secret{}
	for i := range secrets.Items {
		secretOf[secrets.Items[i].Namespace+"/"+secrets.Items[i].Name] = &secrets.Items[i]
	}
	recordOf := map[string]*berthv1.Allocation{}
	for i := range records.Items {
		recordOf[string(records.Items[i].Spec.TaskRun.UID)] = &records.Items[i]
	}
	sort.SliceStable(runs.Items, func(i, j int) bool {
		return runs.Items[i].CreationTimestamp.Before(&runs.Items[j].CreationTimestamp)
	})
	var rows []TaskRunRow
	waiting := map[string]int{}
	for i := range runs.Items {
		tr := &runs.Items[i]
		if tr.Namespace == Namespace || tr.Labels[contract.TaskTypeLabel] != "" {
			continue // berth's own TaskRuns
		}
		rec := recordOf[string(tr.UID)]
		handedOver := rec != nil && taskrun.HandedOver(secretOf[tr.Namespace+"/"+contract.SecretPrefix+tr.Name], rec)
		row := b.row(tr, rec, handedOver, isLocal(cfg, contract.Platform(tr)))
		if row.State == StateWaiting {
			waiting[row.Platform]++
		}
		rows = append(rows, row)
	}
	for i := range rows {
		if rows[i].Position > 0 {
			rows[i].Waiters = max(waiting[rows[i].Platform], rows[i].Position)
		}
	}
	return rows, nil
}

// isLocal tells a platform the config serves on the cluster's own nodes.
func isLocal(cfg *config.Config, platform string) bool {
	if cfg == nil || platform == "" {
		return false
	}
	strategy, known := cfg.Strategy(config.Platform(platform))
	return known && strategy == config.StrategyLocal
}

func (b *Board) row(tr *pipelinev1.TaskRun, rec *berthv1.Allocation, handedOver, local bool) TaskRunRow {
	uid := string(tr.UID)
	row := b.seen[uid]
	row.Namespace, row.Name, row.Platform = tr.Namespace, tr.Name, contract.Platform(tr)
	row.Position, row.Waiters = 0, 0
	host := tr.Labels[contract.AssignedHostLabel]
	if rec != nil && rec.Status.Login != nil {
		host = rec.Status.Login.Host
	}
	switch {
	case host == contract.Localhost || (host == "" && rec == nil && local):
		row.Host = LocalHost
	case host != "":
		row.Host = host
	}
	row.State, row.Message = stateOf(tr, rec, handedOver), ""
	start := b.start(tr)
	switch {
	case row.Host == LocalHost || row.Platform == "":
		row.Waited = NoWait
	case rec != nil && rec.Status.ReservedAt != nil:
		row.Waited = max(0, rec.Status.ReservedAt.Sub(start))
	case row.State == StateWaiting:
		row.Waited = max(0, time.Since(start))
	}
	if row.State == StateWaiting {
		row.Position, _ = strconv.Atoi(tr.Annotations[contract.QueuePositionAnnotation])
	}
	if row.State == StateError {
		row.Message = tr.Status.GetCondition("Succeeded").GetMessage()
	}
	b.seen[uid] = row
	return row
}

// start is when the task began to wait.
func (b *Board) start(tr *pipelinev1.TaskRun) time.Time {
	uid := string(tr.UID)
	if _, ok := b.firstSeen[uid]; !ok {
		b.firstSeen[uid] = time.Now()
	}
	created := tr.CreationTimestamp.Time
	if seen := b.firstSeen[uid]; created.Add(time.Second).After(b.began) && seen.After(created) {
		return seen
	}
	return created
}

// stateOf is where the task stands: berth's record says while there is one; a task berth
// has no record of is run locally, is not berth's (no platform), has not been seen yet, or
// has been cleaned up.
func stateOf(tr *pipelinev1.TaskRun, rec *berthv1.Allocation, handedOver bool) string {
	if tr.IsDone() {
		// A record outlives its task only while a build user is still to be removed.
		if rec != nil || len(tr.Finalizers) > 0 {
			return StateCleaning
		}
		if tr.IsSuccessful() {
			return StateDone
		}
		return StateError
	}
	if rec != nil {
		switch rec.Status.Phase {
		case berthv1.PhaseProvisioning, berthv1.PhaseReady:
			if handedOver || rec.Status.Phase == berthv1.PhaseReady {
				return StateRunning
			}
			return StateProvisioning
		case berthv1.PhaseCleaning:
			return StateCleaning
		default:
			return StateWaiting
		}
	}
	if tr.Labels[contract.AssignedHostLabel] == contract.Localhost || contract.Platform(tr) == "" {
		return StateRunning
	}
	return StateWaiting
}
