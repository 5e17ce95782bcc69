package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// floorRig is a floor whose writes run at once and are recorded in order.
type floorRig struct {
	*floor
	writes []string
}

func newFloorRig(hosts ...*config.StaticHost) *floorRig {
	r := &floorRig{floor: newFloor(hosts)}
	r.write = func(job floorJob) {
		// A worker runs the job without the floor's lock, as RunFloor's do.
		r.mu.Unlock()
		defer r.mu.Lock()
		r.run(job)
	}
	uidOf := func(job floorJob) {
		if want := types.UID("uid-" + job.task.Name); job.uid != want {
			r.writes = append(r.writes, fmt.Sprintf("%s with UID %q, want %q", job.task.Name, job.uid, want))
		}
	}
	r.hand = func(job floorJob) {
		uidOf(job)
		r.writes = append(r.writes, fmt.Sprintf("label %s=%q", job.task.Name, job.host.Name),
			fmt.Sprintf("secret %s %s@%s", job.task.Name, job.host.User, job.host.Address))
	}
	r.free = func(job floorJob) {
		uidOf(job)
		r.writes = append(r.writes, fmt.Sprintf("label %s=\"\"", job.task.Name))
	}
	return r
}

func (r *floorRig) take() []string {
	w := r.writes
	r.writes = nil
	return w
}

func floorTask(name string, done bool, labels map[string]string) *pipelinev1.TaskRun {
	tr := userTask(name)
	tr.UID = types.UID("uid-" + name) // the safe floor's records and build users are named by it
	tr.Labels = labels
	if done {
		tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue})
	}
	return tr
}

// The floor keeps each host's concurrency, serves in creation order, hands a freed slot to
// the next task in line, and writes only the label, the secret and the label's removal.
func TestFloorKeepsCapacityAndOrder(t *testing.T) {
	a := &config.StaticHost{Name: "a", Address: "10.0.0.1", User: "root", Concurrency: 1}
	b := &config.StaticHost{Name: "b", Address: "10.0.0.2", User: "root", Concurrency: 1}
	r := newFloorRig(a, b)
	for _, name := range []string{"t1", "t2", "t3", "t4"} {
		r.seen(floorTask(name, false, nil))
	}
	if got, want := r.take(), []string{`label t1="a"`, "secret t1 root@10.0.0.1", `label t2="b"`, "secret t2 root@10.0.0.2"}; !slices.Equal(got, want) {
		t.Fatalf("two free slots and four tasks: wrote %q, want %q", got, want)
	}
	// Seen again (the label landing, a resync): no task is served twice or queued twice.
	r.seen(floorTask("t1", false, map[string]string{contract.AssignedHostLabel: "a"}))
	r.seen(floorTask("t3", false, nil))
	if got := r.take(); len(got) != 0 {
		t.Fatalf("events of tasks served or in line wrote %q", got)
	}
	// t2 ends: b goes to t3, first in line.
	r.seen(floorTask("t2", true, map[string]string{contract.AssignedHostLabel: "b"}))
	if got, want := r.take(), []string{`label t2=""`, `label t3="b"`, "secret t3 root@10.0.0.2"}; !slices.Equal(got, want) {
		t.Fatalf("t2 ended: wrote %q, want %q", got, want)
	}
	// Its later events change nothing; neither do TaskRuns the floor does not serve.
	r.seen(floorTask("t2", true, nil))
	internal := floorTask("provision-1", false, map[string]string{contract.TaskTypeLabel: contract.TaskTypeProvision})
	r.seen(internal)
	other := floorTask("other", false, nil)
	other.Spec.Params = nil
	r.seen(other)
	if got := r.take(); len(got) != 0 {
		t.Fatalf("a finished task's later event and unrelated TaskRuns wrote %q", got)
	}
	// t1 ends: a goes to t4; then t3 and t4 end with nobody waiting.
	r.seen(floorTask("t1", true, nil))
	r.seen(floorTask("t3", true, nil))
	r.seen(floorTask("t4", true, nil))
	if got, want := r.take(), []string{`label t1=""`, `label t4="a"`, "secret t4 root@10.0.0.1", `label t3=""`, `label t4=""`}; !slices.Equal(got, want) {
		t.Fatalf("the rest: wrote %q, want %q", got, want)
	}
	if r.slots[a] != 1 || r.slots[b] != 1 || len(r.holding) != 0 || len(r.line) != 0 || len(r.uids) != 0 {
		t.Errorf("at the end: free a %d b %d, holding %v, line %v, UIDs %v; want every slot free", r.slots[a], r.slots[b], r.holding, r.line, r.uids)
	}
}

// At a pace, an assignment waits for its turn and a release does not: the floor's workers
// keep freeing slots while assignments queue behind the pace.
func TestAPacedFloorHoldsAssignmentsNotReleases(t *testing.T) {
	h := &config.StaticHost{Name: "a", Address: "10.0.0.1", User: "root", Concurrency: 3}
	f := newFloor([]*config.StaticHost{h})
	wrote := make(chan string, 10)
	f.hand = func(job floorJob) { wrote <- fmt.Sprintf("label %s=%q", job.task.Name, job.host.Name) }
	f.free = func(job floorJob) { wrote <- fmt.Sprintf("label %s=\"\"", job.task.Name) }
	f.write = func(floorJob) {} // a release serves nobody here: the line is empty
	jobs := workqueue.NewTyped[floorJob]()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// One turn at once, the next in about eleven days: the second assignment waits.
	turns := rate.NewLimiter(rate.Limit(1e-6), 1)
	done := make(chan struct{})
	for range 2 {
		go func() { f.work(ctx, jobs, turns); done <- struct{}{} }()
	}
	next := func() string {
		select {
		case w := <-wrote:
			return w
		case <-time.After(10 * time.Second):
			t.Fatal("no write")
			return ""
		}
	}
	task := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }
	jobs.Add(floorJob{task: task("first"), host: h})
	if w := next(); w != `label first="a"` {
		t.Fatalf("first write %s", w)
	}
	jobs.Add(floorJob{task: task("second"), host: h})
	jobs.Add(floorJob{task: task("ended"), host: h, release: true})
	if w := next(); w != `label ended=""` {
		t.Fatalf("the release waited behind the paced assignment: %s", w)
	}
	select {
	case w := <-wrote:
		t.Fatalf("an assignment went before its turn: %s", w)
	default:
	}
	cancel() // the waiting assignment gives up with ctx
	jobs.ShutDown()
	for range 2 {
		<-done
	}
}

// The safe floor serves a TaskRun only once Tekton has resolved it into a user task, as the
// contract says; the plain floor serves it at once.
func TestTheSafeFloorWaitsForTektonsResolve(t *testing.T) {
	h := &config.StaticHost{Name: "a", Address: "10.0.0.1", User: "root", Concurrency: 2}
	r := newFloorRig(h)
	r.resolvedOnly = true
	created := floorTask("t1", false, nil)
	r.seen(created)
	if got := r.take(); len(got) != 0 {
		t.Fatalf("an unresolved TaskRun was served: %q", got)
	}
	resolved := created.DeepCopy()
	resolved.Status.TaskSpec = created.Spec.TaskSpec.DeepCopy()
	r.seen(resolved)
	if got, want := r.take(), []string{`label t1="a"`, "secret t1 root@10.0.0.1"}; !slices.Equal(got, want) {
		t.Fatalf("resolved: wrote %q, want %q", got, want)
	}
	// A resolved spec that mounts no task secret is no user task.
	other := floorTask("t2", false, nil)
	other.Status.TaskSpec = &pipelinev1.TaskSpec{}
	r.seen(other)
	if got := r.take(); len(got) != 0 {
		t.Fatalf("a TaskRun mounting no task secret was served: %q", got)
	}
}

// The safe floor's labels keep the contract, on a real apiserver: the assigned host, the
// target platform and the finalizer go on together; at the end the assigned host and the
// finalizer come off and the target platform stays, as berth leaves it.
func TestTheSafeFloorLabelsAsTheContractSays(t *testing.T) {
	ctx := context.Background()
	if err := cp.EnsureNamespace(ctx, userNamespace); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cp.Config, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	tr := userTask("safe-floor-labels")
	if err := c.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	task := client.ObjectKeyFromObject(tr)
	check := func(when string, wantLabels map[string]string, wantFinalizers []string) {
		t.Helper()
		var got pipelinev1.TaskRun
		if err := c.Get(ctx, task, &got); err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got.Labels, wantLabels) || !slices.Equal(got.Finalizers, wantFinalizers) {
			t.Fatalf("%s: labels %v finalizers %v, want %v and %v", when, got.Labels, got.Finalizers, wantLabels, wantFinalizers)
		}
	}
	if err := labelTask(ctx, c, task, "host-1", "linux/s390x", true); err != nil {
		t.Fatal(err)
	}
	check("served", map[string]string{contract.AssignedHostLabel: "host-1", contract.TargetPlatformLabel: "linux-s390x"},
		[]string{contract.Finalizer})
	if err := labelTask(ctx, c, task, "", "", true); err != nil {
		t.Fatal(err)
	}
	check("freed", map[string]string{contract.TargetPlatformLabel: "linux-s390x"}, nil)
}
