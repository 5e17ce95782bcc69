package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
)

// hostChecker sees, from a watch, how many tasks hold each host, how long a freed slot stays
// empty while tasks wait, and which tasks ever carried the waiting-for-platform label.
//
// It must see every version of every TaskRun, in the order the apiserver wrote them. An
// informer does not promise that: when its watch ends with an error (a watch the apiserver
// closes at once, under load), it lists again and replays the list in name order, so a task
// that took a freed slot may come before the task that left it, and the host looks held by
// one task too many for a moment. Such a replay counted over-commits where the controller's
// own bookkeeping had none. So the checker lists once and then watches from that list's
// resourceVersion, and a watch that ends is resumed from the last version it delivered
// (client-go's RetryWatcher). If the apiserver no longer has that version, the checker has
// lost what happened in between: it says so (lost), and the run's count is not to be trusted.
type hostChecker struct {
	mu         sync.Mutex
	capacity   int
	hostOf     map[string]string
	count      map[string]int
	freed      map[string][]time.Time
	handOvers  []time.Duration
	violations int
	// tasksOn lists the tasks each host was ever assigned, in order, each once.
	tasksOn map[string][]string
	waited  map[string]bool
	// lost says why the watch ended before the run did; "" while it follows every change.
	lost string
}

func watchHosts(ctx context.Context, c client.WithWatch, capacity int, waiting func() int) (*hostChecker, error) {
	var initial pipelinev1.TaskRunList
	if err := c.List(ctx, &initial, client.InNamespace(userNamespace)); err != nil {
		return nil, err
	}
	h := newHostChecker(capacity)
	for i := range initial.Items {
		h.see(&initial.Items[i], waiting())
	}
	resume := &toolscache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		return c.Watch(ctx, &pipelinev1.TaskRunList{}, client.InNamespace(userNamespace), &client.ListOptions{Raw: &opts})
	}}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, initial.ResourceVersion, resume)
	if err != nil {
		return nil, err
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			switch tr, _ := ev.Object.(*pipelinev1.TaskRun); {
			case ev.Type == watch.Error:
				h.lose(fmt.Sprintf("the watch of TaskRuns failed: %v", apierrors.FromObject(ev.Object)))
				return
			case tr == nil || ev.Type == watch.Bookmark:
			case ev.Type == watch.Deleted:
				h.observe(tr.Name, "", waiting())
			default:
				h.see(tr, waiting())
			}
		}
		if ctx.Err() == nil {
			h.lose("the watch of TaskRuns ended")
		}
	}()
	return h, nil
}

// see takes in a version of a TaskRun.
func (h *hostChecker) see(tr *pipelinev1.TaskRun, waiting int) {
	h.observe(tr.Name, tr.Labels[contract.AssignedHostLabel], waiting)
	if tr.Labels[contract.WaitingForPlatformLabel] != "" {
		h.sawWaiting(tr.Name)
	}
}

// lose records, once, why the checker stopped following the TaskRuns.
func (h *hostChecker) lose(why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost == "" {
		h.lost = why
	}
}

// lostWatch says why the checker stopped following the TaskRuns, "" if it never did.
func (h *hostChecker) lostWatch() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

func newHostChecker(capacity int) *hostChecker {
	return &hostChecker{capacity: capacity, hostOf: map[string]string{}, count: map[string]int{}, freed: map[string][]time.Time{},
		tasksOn: map[string][]string{}, waited: map[string]bool{}}
}

func (h *hostChecker) sawWaiting(task string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waited[task] = true
}

// waitedTasks is a copy of the set of tasks that ever waited.
func (h *hostChecker) waitedTasks() map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.waited)
}

func (h *hostChecker) observe(task, host string, waiting int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	prev := h.hostOf[task]
	if prev == host {
		return
	}
	now := time.Now()
	if prev != "" {
		h.count[prev]--
		if waiting > 0 {
			h.freed[prev] = append(h.freed[prev], now)
		}
	}
	h.hostOf[task] = host
	if host != "" {
		h.count[host]++
		if !slices.Contains(h.tasksOn[host], task) {
			h.tasksOn[host] = append(h.tasksOn[host], task)
		}
		if h.count[host] > h.capacity {
			h.violations++
		}
		if q := h.freed[host]; len(q) > 0 {
			h.handOvers = append(h.handOvers, now.Sub(q[0]))
			h.freed[host] = q[1:]
		}
	}
}

// assignments is a copy of the tasks each host was assigned.
func (h *hostChecker) assignments() map[string][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string][]string, len(h.tasksOn))
	for host, tasks := range h.tasksOn {
		out[host] = slices.Clone(tasks)
	}
	return out
}

func (h *hostChecker) result() (Percentiles, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return percentiles(append([]time.Duration(nil), h.handOvers...)), h.violations
}
