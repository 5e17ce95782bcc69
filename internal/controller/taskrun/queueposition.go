package taskrun

import (
	"context"
	"slices"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"k8s.io/apimachinery/pkg/types"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
)

// A waiting TaskRun shows its place in line in the annotation berth.dev/queue-position, a mirror
// like the labels: the ledger's position, written by mirror. A hand-over moves every waiter
// behind it without reconciling any of them, so a leader-only loop (PositionRefresh) wakes the
// waiters whose place moved. Two bounds keep a long queue from turning into a write storm: one
// TaskRun's annotation is rewritten at most once per PositionInterval, and only when its place
// moved; and the loop wakes at most positionWritesPerInterval TaskRuns per interval, the front
// of the queues first.

// DefaultPositionInterval is the least time between two writes of one TaskRun's position. A
// task that waits less than that is shown its place once, with the waiting label, in the same
// write: a burst of short waits costs no rewrites at all.
const DefaultPositionInterval = time.Minute

// positionWritesPerInterval bounds the position refreshes of all TaskRuns in one interval.
const positionWritesPerInterval = 50

// refreshesPerInterval is how often the refresh loop looks, per interval: a place that moved is
// shown at most an interval and a fifth after the last write.
const refreshesPerInterval = 5

// unshownPerLook bounds the waiters the refresh loop puts first, per look, because they have not
// been shown that they wait (see unshownWaiters).
const unshownPerLook = 50

// positionMark is the position last written on a TaskRun, and when.
type positionMark struct {
	uid      types.UID
	position int
	at       time.Time
}

// queuePosition is the position the TaskRun's annotation should show now (0: none). A place
// not shown yet is shown as it is; a place shown already is rewritten only when the refresh
// loop has made it due (see movedPositions), so that the loop's budget bounds every rewrite of
// every waiter, however often hand-overs reconcile them.
func (m *taskMirror) queuePosition(tr *pipelinev1.TaskRun, rec *berthv1.Allocation) int {
	if rec == nil || (rec.Status.Phase != berthv1.PhaseWaiting && rec.Status.Phase != "") {
		return 0
	}
	mark, marked := m.positionMark(tr)
	now := m.capacity.Position(rec.Spec.Platform, taskOf(tr))
	switch {
	case now == 0:
		// Not queued in the ledger at this instant (between a release and the next Acquire):
		// the place last shown stands.
		return mark.position
	case !marked || mark.position == now:
		return now
	}
	if _, due := m.refreshDue.LoadAndDelete(taskOf(tr)); due {
		return now
	}
	return mark.position
}

func (m *taskMirror) positionMark(tr *pipelinev1.TaskRun) (positionMark, bool) {
	v, ok := m.positions.Load(taskOf(tr))
	if !ok || v.(positionMark).uid != tr.UID {
		return positionMark{}, false
	}
	return v.(positionMark), true
}

// notePosition records the position the TaskRun's metadata now shows.
func (m *taskMirror) notePosition(tr *pipelinev1.TaskRun, position int) {
	if position == 0 {
		m.positions.Delete(taskOf(tr))
		return
	}
	if mark, ok := m.positionMark(tr); ok && mark.position == position {
		return
	}
	m.positions.Store(taskOf(tr), positionMark{uid: tr.UID, position: position, at: m.now()})
}

// PositionRefresh wakes the waiting TaskRuns whose place in line moved since their annotation
// was written. It runs on the leader only, like the reconciles that write.
type PositionRefresh struct{ mirror *taskMirror }

// NeedLeaderElection: only the leader's ledger serves.
func (p PositionRefresh) NeedLeaderElection() bool { return true }

// Start looks refreshesPerInterval times per PositionInterval until ctx ends.
func (p PositionRefresh) Start(ctx context.Context) error {
	m := p.mirror
	ticker := time.NewTicker(m.positionInterval / refreshesPerInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			waiters := m.waiterPlaces()
			for _, task := range m.movedPositions(waiters, positionWritesPerInterval/refreshesPerInterval) {
				m.refreshDue.Store(task, struct{}{})
				send(m.refreshes, task.Namespace, task.Name)
			}
			for _, task := range m.unshownWaiters(waiters, unshownPerLook) {
				m.capacity.Wake(task)
			}
		}
	}
}

// unshownWaiters returns up to budget of waiters that were not yet shown that they wait (no
// waiting label and place written) at this look and at the one before, back of the queues
// first. An arrival is labelled by its own reconcile, which goes after every hand-over (see
// handOverPriority): while hand-overs keep every worker busy, as under a long overload, it
// would never be labelled. So one that is still unlabelled a look later (PositionInterval /
// refreshesPerInterval, 12 s by default) is woken first, a bounded number per look. Those
// with the most tasks ahead go first: they have the longest wait left to explain, while the
// front of a busy line is served before its label would be read. Only the refresh loop calls
// it.
func (m *taskMirror) unshownWaiters(waiters []placed, budget int) []allocation.Task {
	var starved []placed
	now := map[allocation.Task]bool{}
	for _, w := range waiters {
		if _, shown := m.positions.Load(w.task); shown {
			continue
		}
		now[w.task] = true
		if m.unshown[w.task] {
			starved = append(starved, w)
		}
	}
	m.unshown = now
	return firstPlaced(starved, budget, func(a, b placed) int { return b.position - a.position })
}

// placed is a waiter and its place in line (1 = next).
type placed struct {
	task     allocation.Task
	position int
}

// waiterPlaces is every task waiting in the ledger, with its place in its platform's line:
// what one look of the refresh loop reads, once for both of its picks.
func (m *taskMirror) waiterPlaces() []placed {
	var out []placed
	for platform := range m.capacity.Waiting() {
		for i, task := range m.capacity.Queue(platform) {
			out = append(out, placed{task, i + 1})
		}
	}
	return out
}

// firstPlaced is the tasks of the first budget of ps in the order of cmp.
func firstPlaced(ps []placed, budget int, cmp func(a, b placed) int) []allocation.Task {
	slices.SortFunc(ps, cmp)
	var out []allocation.Task
	for _, p := range ps[:min(budget, len(ps))] {
		out = append(out, p.task)
	}
	return out
}

// movedPositions returns up to budget of waiters whose place moved and whose annotation may be
// rewritten, front of the queues first; and forgets the marks of tasks that wait no more.
func (m *taskMirror) movedPositions(waiters []placed, budget int) []allocation.Task {
	var candidates []placed
	waiting := map[allocation.Task]bool{}
	now := m.now()
	for _, w := range waiters {
		waiting[w.task] = true
		v, ok := m.positions.Load(w.task)
		if !ok {
			continue // never shown yet: its own reconcile writes it, or unshownWaiters wakes it
		}
		if mark := v.(positionMark); mark.position != w.position && now.Sub(mark.at) >= m.positionInterval {
			candidates = append(candidates, w)
		}
	}
	m.positions.Range(func(k, v any) bool {
		// A mark written since the queues were read may be of a task that waits now.
		if !waiting[k.(allocation.Task)] && v.(positionMark).at.Before(now) {
			m.positions.Delete(k)
			m.refreshDue.Delete(k)
		}
		return true
	})
	return firstPlaced(candidates, budget, func(a, b placed) int { return a.position - b.position })
}
