package security_test

import (
	"context"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/dev/devstack"
)

// recordWatch follows berth's records in the order the apiserver wrote them, and keeps, at
// every change, how many tasks held each host: a running task's slot, and the slot an ended
// task's build user keeps until it is removed.
type recordWatch struct {
	mu    sync.Mutex
	holds map[string][]string // record → hosts whose slots it holds
	worst map[string]int
	phase map[string]*berthv1.Allocation // record → as last seen
	// reserved counts, per namespace, the tasks that have ever held a slot.
	reserved   map[string]int
	sawReserve map[string]bool // record → it held a slot once
	// onChange, if set, runs under mu after each change, with the record that changed.
	onChange func(*berthv1.Allocation)
}

func watchRecords(t *testing.T) *recordWatch {
	t.Helper()
	wc, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: admin().Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &berthv1.AllocationList{}, client.InNamespace(devstack.Namespace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(); cancel() })
	rw := &recordWatch{holds: map[string][]string{}, worst: map[string]int{}, phase: map[string]*berthv1.Allocation{},
		reserved: map[string]int{}, sawReserve: map[string]bool{}}
	go func() {
		for ev := range w.ResultChan() {
			rec, ok := ev.Object.(*berthv1.Allocation)
			if !ok {
				continue
			}
			rw.observe(rec, ev.Type == watch.Deleted)
		}
	}()
	return rw
}

func (rw *recordWatch) observe(rec *berthv1.Allocation, deleted bool) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	var hosts []string
	if !deleted {
		if rec.Status.Login != nil && (rec.Status.Phase == berthv1.PhaseProvisioning || rec.Status.Phase == berthv1.PhaseReady) {
			hosts = append(hosts, rec.Status.Login.Host)
			if !rw.sawReserve[rec.Name] {
				rw.sawReserve[rec.Name] = true
				rw.reserved[rec.Spec.TaskRun.Namespace]++
			}
		}
		for _, d := range rec.Status.Debts {
			if d.HoldsSlot {
				hosts = append(hosts, d.Host)
			}
		}
		rw.phase[rec.Name] = rec
	} else {
		delete(rw.phase, rec.Name)
	}
	rw.holds[rec.Name] = hosts
	count := map[string]int{}
	for _, hs := range rw.holds {
		for _, h := range hs {
			count[h]++
		}
	}
	for h, n := range count {
		rw.worst[h] = max(rw.worst[h], n)
	}
	if rw.onChange != nil {
		rw.onChange(rec)
	}
}

// verify: no host ever held more tasks than capacity, and some host held one at all.
func (rw *recordWatch) verify(t *testing.T, capacity int) {
	t.Helper()
	rw.mu.Lock()
	defer rw.mu.Unlock()
	for h, n := range rw.worst {
		if n > capacity {
			t.Errorf("host %s held %d tasks at once; its concurrency is %d", h, n, capacity)
		}
	}
	if len(rw.worst) == 0 {
		t.Error("no task ever held a host: the attack was not exercised")
	}
	t.Logf("most tasks held at once per host: %v", rw.worst)
}
