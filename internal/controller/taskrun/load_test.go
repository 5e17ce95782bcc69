//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
)

// checker watches a namespace's TaskRuns and keeps, from the apiserver's own history of
// their labels, how many are assigned to each host at every moment.
type checker struct {
	mu         sync.Mutex
	capacity   int
	hostOf     map[string]string          // task → host it holds now
	onHost     map[string]map[string]bool // host → tasks
	peak       map[string]int
	violations []string
	order      []string // tasks in the order they were first assigned a host
	assignedAt map[string]time.Time
	waited     map[string]bool
	created    map[string]time.Time
}

func watchAssignments(t *testing.T, ns string, capacity int) *checker {
	t.Helper()
	wc, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: stack.ControlPlane.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &pipelinev1.TaskRunList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(); cancel() })
	ch := &checker{capacity: capacity, hostOf: map[string]string{}, onHost: map[string]map[string]bool{},
		peak: map[string]int{}, waited: map[string]bool{}, created: map[string]time.Time{}, assignedAt: map[string]time.Time{}}
	go func() {
		for ev := range w.ResultChan() {
			tr, ok := ev.Object.(*pipelinev1.TaskRun)
			if !ok {
				continue
			}
			host := tr.Labels[contract.AssignedHostLabel]
			if ev.Type == watch.Deleted {
				host = ""
			}
			ch.observe(tr.Name, host, tr.Labels[contract.WaitingForPlatformLabel] != "", tr.CreationTimestamp.Time)
		}
	}()
	return ch
}

func (c *checker) observe(task, host string, waiting bool, created time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.created[task] = created
	if waiting {
		c.waited[task] = true
	}
	if prev := c.hostOf[task]; prev != host {
		if prev != "" {
			delete(c.onHost[prev], task)
		}
		delete(c.hostOf, task)
		if host != "" {
			c.hostOf[task] = host
			if c.onHost[host] == nil {
				c.onHost[host] = map[string]bool{}
			}
			c.onHost[host][task] = true
			c.peak[host] = max(c.peak[host], len(c.onHost[host]))
			if n := len(c.onHost[host]); n > c.capacity {
				var on []string
				for t := range c.onHost[host] {
					on = append(on, t)
				}
				slices.Sort(on)
				c.violations = append(c.violations, fmt.Sprintf("%s holds %d tasks %v (capacity %d) when %s arrived", host, n, on, c.capacity, task))
			}
			if !slices.Contains(c.order, task) {
				c.order = append(c.order, task)
				c.assignedAt[task] = time.Now()
			}
		}
	}
}

func (c *checker) assigned() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.order)
}

// verify: no over-commit ever; every task served; and first come, first served: no task got a
// host more than a second before a waiting task created more than a second earlier. Creation
// times have one-second resolution, so tasks created within the same second are ties; and each
// TaskRun's host label is patched by its own reconcile, so two hand-overs made moments apart
// may reach the watch in either order.
func (c *checker) verify(t *testing.T, tasks int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.violations {
		t.Error("over-commit: " + v)
	}
	if len(c.order) != tasks {
		t.Errorf("%d of %d tasks got a host", len(c.order), tasks)
	}
	waiters := 0
	for i, early := range c.order {
		if c.waited[early] {
			waiters++
		}
		for _, late := range c.order[i+1:] {
			if c.waited[late] && c.created[early].Sub(c.created[late]) > time.Second && c.assignedAt[late].Sub(c.assignedAt[early]) > time.Second {
				t.Errorf("%s (created %s) got a host before %s, which was waiting since %s",
					early, c.created[early].Format(time.TimeOnly), late, c.created[late].Format(time.TimeOnly))
			}
		}
	}
	if waiters == 0 {
		t.Error("no task ever waited: the test exercised no queue")
	}
	full := 0
	for _, p := range c.peak {
		if p == c.capacity {
			full++
		}
	}
	if full == 0 {
		t.Errorf("no host ever reached its capacity (peaks %v): the test exercised no contention", c.peak)
	}
	t.Logf("peaks per host %v; %d of %d tasks waited", c.peak, waiters, tasks)
}

// finishAtRandom ends each task a random 50–400 ms after its host secret appears, as builds of
// different lengths would.
func finishAtRandom(t *testing.T, ns string) {
	finishAfter(t, ns, 50*time.Millisecond, 400*time.Millisecond)
}

// finishAfter ends each task between min and max after its host secret appears.
func finishAfter(t *testing.T, ns string, min, max time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		finishing := map[string]bool{}
		for ctx.Err() == nil {
			var secrets corev1.SecretList
			if err := c().List(ctx, &secrets, client.InNamespace(ns), client.HasLabels{contract.SecretLabel}); err == nil {
				for _, s := range secrets.Items {
					name := s.Name[len(contract.SecretPrefix):]
					if finishing[name] || len(s.Data["host"]) == 0 {
						continue
					}
					finishing[name] = true
					go func() {
						time.Sleep(min + rand.N(max-min))
						key := keyOf(&pipelinev1.TaskRun{})
						key.Namespace, key.Name = ns, name
						_ = stack.StandIn.Finish(context.Background(), key, nil)
					}()
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
}

func createBurst(t *testing.T, ns string, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		create(t, userTaskRun(ns, fmt.Sprintf("task-%02d", i), platform, ""))
	}
}

func allDone(t *testing.T, ns string, n int) {
	t.Helper()
	eventually(t, "every task finished", func() (bool, error) {
		var list pipelinev1.TaskRunList
		if err := c().List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		done := 0
		for _, tr := range list.Items {
			if tr.IsDone() {
				done++
			}
		}
		return done == n, fmt.Errorf("%d of %d done", done, n)
	})
}

func TestNoOvercommitAndFirstComeFirstServed(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	chk := watchAssignments(t, ns, 2)
	finishAtRandom(t, ns)
	createBurst(t, ns, 0, 30)
	allDone(t, ns, 30)
	settled(t, ns)
	chk.verify(t, 30)
	noBuildUsersLeft(t)
}

// Three waves, each created more than a second after the one before, while builds of about
// two seconds keep every slot taken: each wave must be served wholly before the next.
func TestWavesAreServedInOrderOfCreation(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	chk := watchAssignments(t, ns, 2)
	finishAfter(t, ns, 1500*time.Millisecond, 2500*time.Millisecond)
	for wave := range 3 {
		createBurst(t, ns, wave*10, 10)
		time.Sleep(1200 * time.Millisecond)
	}
	allDone(t, ns, 30)
	settled(t, ns)
	chk.verify(t, 30)
}

func TestRestartMidRunForgetsNothing(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	chk := watchAssignments(t, ns, 2)
	finishAtRandom(t, ns)
	createBurst(t, ns, 0, 30)
	eventually(t, "a third of the tasks got a host", func() (bool, error) { return chk.assigned() >= 10, nil })
	restartController(t, controllerOptions())
	allDone(t, ns, 30)
	settled(t, ns)
	chk.verify(t, 30)
	noBuildUsersLeft(t)
}
