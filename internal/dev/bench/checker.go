package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
)

// hostChecker sees, from a watch, how many tasks hold each host, how long a freed slot stays
// empty while tasks wait, and which tasks ever carried the waiting-for-platform label (a watch
// delivers every version of an object, resuming where it broke off; only a watch too far
// behind to resume re-lists, and could miss a label that came and went meanwhile).
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
}

func watchHosts(ctx context.Context, cfg *rest.Config, c client.Client, capacity int, waiting func() int) (*hostChecker, error) {
	informers, err := cache.New(cfg, cache.Options{Scheme: c.Scheme(), DefaultNamespaces: map[string]cache.Config{userNamespace: {}}})
	if err != nil {
		return nil, err
	}
	inf, err := informers.GetInformer(ctx, &pipelinev1.TaskRun{})
	if err != nil {
		return nil, err
	}
	h := newHostChecker(capacity)
	seen := func(obj any) {
		if tr, ok := obj.(*pipelinev1.TaskRun); ok {
			h.observe(tr.Name, tr.Labels[contract.AssignedHostLabel], waiting())
			if tr.Labels[contract.WaitingForPlatformLabel] != "" {
				h.sawWaiting(tr.Name)
			}
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(obj any) {
			if tr, ok := obj.(*pipelinev1.TaskRun); ok {
				h.observe(tr.Name, "", waiting())
			}
		},
	})
	if err != nil {
		return nil, err
	}
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the checker's informer did not sync")
	}
	return h, nil
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
