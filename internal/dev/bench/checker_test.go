package bench

import (
	"context"
	"sync/atomic"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// brittleWatches ends every watch after its first event, as an apiserver under load may.
type brittleWatches struct {
	client.WithWatch
	broken atomic.Int32
}

func (b *brittleWatches) Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
	w, err := b.WithWatch.Watch(ctx, list, opts...)
	if err != nil {
		return nil, err
	}
	out := make(chan watch.Event)
	proxy := watch.NewProxyWatcher(out)
	go func() {
		defer close(out)
		defer w.Stop()
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			select {
			case out <- ev:
				b.broken.Add(1)
			case <-proxy.StopChan():
			}
		case <-proxy.StopChan():
		}
	}()
	return proxy, nil
}

// A slot handed from one task to another while the checker's watch breaks at every event is
// seen in the order it happened: no over-commit. An informer would list again after a break
// and could replay the task that took the slot (named first) before the one that left it.
func TestHostCheckerFollowsEveryVersionAcrossBrokenWatches(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cp.EnsureNamespace(ctx, userNamespace); err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cp.Config, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	const host = "checker-host"
	var h *hostChecker
	holder := func(task string) func() bool {
		return func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.hostOf[task] == host }
	}
	label := func(tr *pipelinev1.TaskRun, on bool) {
		t.Helper()
		before := tr.DeepCopy()
		if on {
			tr.Labels = map[string]string{contract.AssignedHostLabel: host}
		} else {
			delete(tr.Labels, contract.AssignedHostLabel)
		}
		if err := c.Patch(ctx, tr, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
	// The task that leaves sorts after the one that takes its slot, as a list would replay them.
	leaving, taking := userTask("checker-z"), userTask("checker-a")
	leaving.Labels = map[string]string{contract.AssignedHostLabel: host}
	for _, tr := range []*pipelinev1.TaskRun{leaving, taking} {
		if err := c.Create(ctx, tr); err != nil {
			t.Fatal(err)
		}
	}
	// Started after the creates, so that its list, not its watch, brings them: RetryWatcher
	// waits a second before it resumes a broken watch, and the test breaks it at every event.
	brittle := &brittleWatches{WithWatch: c}
	if h, err = watchHosts(ctx, brittle, 1, func() int { return 1 }); err != nil {
		t.Fatal(err)
	}
	if !holder(leaving.Name)() {
		t.Fatal("the checker's list does not show the first holder")
	}
	label(leaving, false)
	label(taking, true)
	eventually(t, "the checker sees the slot handed over", holder(taking.Name))
	if n := brittle.broken.Load(); n < 2 {
		t.Fatalf("the watch broke %d times; the test means it to break after each change", n)
	}
	if _, violations := h.result(); violations != 0 {
		t.Fatalf("%d over-commits counted for a slot that was only ever handed over", violations)
	}
	if lost := h.lostWatch(); lost != "" {
		t.Fatalf("the checker lost its watch: %s", lost)
	}
	// A second holder at once is an over-commit, and is counted.
	label(leaving, true)
	eventually(t, "the checker sees two holders", holder(leaving.Name))
	if _, violations := h.result(); violations != 1 {
		t.Fatalf("%d over-commits counted for two tasks holding one slot; want 1", violations)
	}
}
