package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/adminkeys"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/provision"
)

// The floor: a calibration controller that serves the static scenarios with the fewest
// writes the harness can see, so that a run of it tells what the machine, the apiserver and
// the simulation allow before any controller's own cost. Per task it writes the
// assigned-host label, the secret (host and a dummy key) and the label's removal once the
// task is done: no finalizer, record, Event or waiting label, no host reached over SSH, no
// restart safety. It keeps each host's concurrency and serves tasks in creation order, and
// it hands a freed slot straight to the next task in line. It is not a controller anyone
// should run: it keeps too little of the contract.
//
// The safe floor (FloorOptions.Safe) does, on the same bookkeeping, the work berth cannot
// leave out and nothing else. It serves a TaskRun only once Tekton has resolved it into a
// user task, as the contract says (the plain floor serves one at its creation). It writes a
// record of each assignment in the controller's namespace before the host is touched and
// deletes it after the build user is gone: what a restart needs to find every user it owes a
// host. It puts the contract's finalizer and target-platform label beside the assigned host,
// and leaves the target platform on at the end, as berth does. It makes the build user over
// SSH with a fresh key before the secret and removes it after the task, with berth's own host
// scripts through berth's connection pool. The secret is the contract's, owned by its TaskRun
// (tasksecret, as berth builds it). Its rate is what any controller doing that work
// can reach on the machine: no waiting label, Event, seal, check of a tenant's edit or
// recovery after a restart.

// floorWorkers is how many jobs the floor has under way at once. The safe floor's jobs also
// wait on SSH, so it has more: 42, enough that its line never grows under the burst (its
// tasks get their secret about 2 s after creation, the wait for Tekton's resolve).
const (
	floorWorkers     = 20
	safeFloorWorkers = 42
)

// FloorOptions choose which floor runs, and how fast.
type FloorOptions struct {
	// Pace, above 0, is at most how many assignments a second the floor makes: a floor as
	// slow as a given controller, to price the machine's work at that controller's pace (a
	// machine serving the same requests more slowly spends more on each; docs/task-cost.md).
	Pace float64
	// Safe runs the safe floor: records, the finalizer and build users over SSH besides.
	Safe bool
}

// RunFloor serves the static hosts of the config ConfigMap in namespace until ctx ends,
// telling log of each write that failed.
func RunFloor(ctx context.Context, cfg *rest.Config, namespace string, o FloorOptions, log io.Writer) error {
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
	workers := floorWorkers
	if o.Safe {
		w := &safeWrites{ctx: ctx, c: c, namespace: namespace, uids: parsed.BuildUIDs, pool: provision.NewConnections(), log: log}
		keys := &adminkeys.Keys{Versions: c, Secrets: c, Namespace: namespace}
		if err := w.reach(parsed.Hosts, keys); err != nil {
			return err
		}
		defer w.pool.Close()
		f.hand, f.free, f.resolvedOnly = w.hand, w.free, true
		workers = safeFloorWorkers
	} else {
		w := plainWrites{ctx: ctx, c: c, log: log}
		f.hand, f.free = w.hand, w.free
	}
	var turns *rate.Limiter
	if o.Pace > 0 {
		turns = rate.NewLimiter(rate.Limit(o.Pace), 1)
	}
	for range workers {
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
	uid     types.UID
	host    *config.StaticHost
	release bool
}

// floor is the floor's bookkeeping; its writes are functions so a test can see them.
type floor struct {
	mu      sync.Mutex
	hosts   []*config.StaticHost
	slots   map[*config.StaticHost]int // free slots of each host
	holding map[types.NamespacedName]*config.StaticHost
	uids    map[types.NamespacedName]types.UID // of the tasks in line or holding a slot
	inLine  map[types.NamespacedName]bool
	line    []types.NamespacedName

	// resolvedOnly serves a TaskRun only once Tekton has resolved it into a user task, as the
	// contract (and berth) must; the plain floor serves any with a PLATFORM param at once.
	resolvedOnly bool

	write func(job floorJob) // queues job for a worker, which runs it
	hand  func(job floorJob) // an assignment's writes, up to the secret
	free  func(job floorJob) // a release's writes, before its slot is free again
}

func newFloor(hosts []*config.StaticHost) *floor {
	f := &floor{hosts: hosts, slots: map[*config.StaticHost]int{}, holding: map[types.NamespacedName]*config.StaticHost{},
		uids: map[types.NamespacedName]types.UID{}, inLine: map[types.NamespacedName]bool{}}
	for _, h := range hosts {
		f.slots[h] = h.Concurrency
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
		f.write(floorJob{task: task, uid: f.uids[task], host: h, release: true})
		delete(f.uids, task)
	case !tr.IsDone() && !held && !f.inLine[task] && tr.Labels[contract.AssignedHostLabel] == "" &&
		(!f.resolvedOnly || contract.ResolvedUserTask(tr)):
		f.inLine[task] = true
		f.uids[task] = tr.UID
		f.line = append(f.line, task)
		f.serve(nil)
	}
}

// serve gives free slots to the tasks in line, first those of host freed. The caller holds mu.
func (f *floor) serve(freed *config.StaticHost) {
	for len(f.line) > 0 {
		h := freed
		if h == nil || f.slots[h] == 0 {
			h = nil
			for _, c := range f.hosts {
				if f.slots[c] > 0 {
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
		f.slots[h]--
		f.holding[task] = h
		f.write(floorJob{task: task, uid: f.uids[task], host: h})
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
		f.hand(job)
		return
	}
	f.free(job)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slots[job.host]++
	f.serve(job.host)
}
