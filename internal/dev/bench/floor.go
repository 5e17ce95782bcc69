package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// The floor: a calibration controller that serves the static scenarios with the fewest
// writes the harness can see, so that a run of it tells what the machine, the apiserver and
// the simulation allow before any controller's own cost. Per task it writes the
// assigned-host label, the secret (host and a dummy key) and the label's removal once the
// task is done: no finalizer, record, Event or waiting label, no host reached over SSH, no
// restart safety. It keeps each host's concurrency and serves tasks in creation order, and
// it hands a freed slot straight to the next task in line. It is not a controller anyone
// should run: it keeps too little of the contract.

// floorWorkers is how many writes the floor has under way at once.
const floorWorkers = 20

// RunFloor serves the static hosts of the config ConfigMap in namespace until ctx ends,
// telling log of each write that failed. With a pace above 0 it makes at most that many
// assignments a second: a floor as slow as a given controller, to price the machine's work
// at that controller's pace (a machine serving the same requests more slowly spends more on
// each; docs/task-cost.md).
func RunFloor(ctx context.Context, cfg *rest.Config, namespace string, pace float64, log io.Writer) error {
	c, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		return err
	}
	var cms corev1.ConfigMapList
	if err := c.List(ctx, &cms, client.InNamespace(namespace), client.HasLabels{contract.ConfigLabel}); err != nil {
		return err
	}
	if len(cms.Items) != 1 {
		return fmt.Errorf("the floor wants one config ConfigMap in %s, found %d", namespace, len(cms.Items))
	}
	parsed, problems := config.Parse(cms.Items[0].Data)
	if len(parsed.Dynamic) > 0 || len(parsed.Hosts) == 0 {
		return errors.New("the floor serves static hosts only: run it on static, idle-cluster or large")
	}
	if len(problems) > 0 {
		return fmt.Errorf("the config: %v", problems)
	}
	f := newFloor(parsed.Hosts)
	jobs := workqueue.NewTyped[floorJob]() // first in, first out; adding never blocks
	go func() {
		<-ctx.Done()
		jobs.ShutDown()
	}()
	f.write = jobs.Add
	f.label = func(task types.NamespacedName, host string) {
		value := "null"
		if host != "" {
			value = strconv.Quote(host)
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, contract.AssignedHostLabel, value)
		tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: task.Namespace, Name: task.Name}}
		if err := c.Patch(ctx, tr, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			fmt.Fprintf(log, "floor: labelling %s: %v\n", task, err)
		}
	}
	f.secret = func(task types.NamespacedName, h *config.StaticHost) {
		err := c.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: contract.SecretPrefix + task.Name, Namespace: task.Namespace,
				Labels: map[string]string{contract.SecretLabel: "true"}},
			Data: map[string][]byte{"host": []byte(h.User + "@" + h.Address), "id_rsa": []byte("floor"), "user-dir": []byte("/home/floor")},
		})
		if err != nil {
			fmt.Fprintf(log, "floor: the secret of %s: %v\n", task, err)
		}
	}
	var turns *rate.Limiter
	if pace > 0 {
		turns = rate.NewLimiter(rate.Limit(pace), 1)
	}
	for range floorWorkers {
		go f.work(ctx, jobs, turns)
	}
	informers, err := cache.New(cfg, cache.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		return err
	}
	if err := onAddOrUpdate(ctx, informers, &pipelinev1.TaskRun{}, f.seen); err != nil {
		return err
	}
	return informers.Start(ctx)
}

// floorJob is a write of the floor: a task's label and secret, or (release) taking its label
// off and freeing its slot.
type floorJob struct {
	task    types.NamespacedName
	host    *config.StaticHost
	release bool
}

// floor is the floor's bookkeeping; its writes are functions so a test can see them.
type floor struct {
	mu      sync.Mutex
	hosts   []*config.StaticHost
	free    map[*config.StaticHost]int
	holding map[types.NamespacedName]*config.StaticHost
	inLine  map[types.NamespacedName]bool
	line    []types.NamespacedName

	write  func(job floorJob) // queues job for a worker, which runs it
	label  func(task types.NamespacedName, host string)
	secret func(task types.NamespacedName, host *config.StaticHost)
}

func newFloor(hosts []*config.StaticHost) *floor {
	f := &floor{hosts: hosts, free: map[*config.StaticHost]int{}, holding: map[types.NamespacedName]*config.StaticHost{},
		inLine: map[types.NamespacedName]bool{}}
	for _, h := range hosts {
		f.free[h] = h.Concurrency
	}
	return f
}

// seen takes a user TaskRun into line, or frees its slot once it is done.
func (f *floor) seen(tr *pipelinev1.TaskRun) {
	if contract.Platform(tr) == "" || tr.Labels[contract.TaskTypeLabel] != "" {
		return
	}
	task := types.NamespacedName{Namespace: tr.Namespace, Name: tr.Name}
	f.mu.Lock()
	defer f.mu.Unlock()
	h, held := f.holding[task]
	switch {
	case tr.IsDone() && held:
		delete(f.holding, task)
		f.write(floorJob{task: task, host: h, release: true})
	case !tr.IsDone() && !held && !f.inLine[task] && tr.Labels[contract.AssignedHostLabel] == "":
		f.inLine[task] = true
		f.line = append(f.line, task)
		f.serve(nil)
	}
}

// serve gives free slots to the tasks in line, first those of host freed. The caller holds mu.
func (f *floor) serve(freed *config.StaticHost) {
	for len(f.line) > 0 {
		h := freed
		if h == nil || f.free[h] == 0 {
			h = nil
			for _, c := range f.hosts {
				if f.free[c] > 0 {
					h = c
					break
				}
			}
		}
		if h == nil {
			return
		}
		task := f.line[0]
		f.line = f.line[1:]
		delete(f.inLine, task)
		f.free[h]--
		f.holding[task] = h
		f.write(floorJob{task: task, host: h})
	}
}

// work runs jobs until they shut down or ctx ends. With turns (a pace), each assignment waits
// its turn first; a release never waits, so that a slot freed is served as soon as the pace
// allows.
func (f *floor) work(ctx context.Context, jobs workqueue.TypedInterface[floorJob], turns *rate.Limiter) {
	for {
		job, shut := jobs.Get()
		if shut {
			return
		}
		if turns != nil && !job.release && turns.Wait(ctx) != nil {
			jobs.Done(job)
			return
		}
		f.run(job)
		jobs.Done(job)
	}
}

// run makes a job's writes; a release then frees the slot and serves the line.
func (f *floor) run(job floorJob) {
	if !job.release {
		f.label(job.task, job.host.Name)
		f.secret(job.task, job.host)
		return
	}
	f.label(job.task, "")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.free[job.host]++
	f.serve(job.host)
}
