package hosts

// A launch or terminate the cloud failed is asked again only when its backoff is over, however
// often the record comes back before: its own status write brings it back at once, as does any
// other event of it.

import (
	"context"
	"errors"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
)

// backedOff reconciles name n times back to back, the clock standing still, and checks that
// the cloud was asked op no more than calls times in all and that each pass asked to come back
// when the retry is due.
func (w *vmWorld) backedOff(o *Owner, name, op string, n, calls int, left time.Duration) {
	w.t.Helper()
	var requeues []time.Duration
	for range n {
		requeues = append(requeues, w.mustReconcile(o, name).RequeueAfter)
	}
	if got := w.cloud.Calls(op); got != calls {
		w.t.Fatalf("%d passes before the retry was due: the cloud was asked to %s %d times in all, want %d", n, op, got, calls)
	}
	for i, r := range requeues {
		if r != left {
			w.t.Fatalf("pass %d before the retry was due asked to come back in %s, want %s", i+1, r, left)
		}
	}
}

// retryAt is the record's RetryAt, zero when unset.
func retryAt(rec *berthv1.BuildHost) time.Time {
	if rec == nil || rec.Status.Instance == nil || rec.Status.Instance.RetryAt == nil {
		return time.Time{}
	}
	return rec.Status.Instance.RetryAt.Time
}

// TestAFailedLaunchWaitsOutItsBackoff: a launch the cloud failed is asked again only at the time
// its record holds, however often the record comes back meanwhile, also after a restart; a
// launch that passes clears the wait.
func TestAFailedLaunchWaitsOutItsBackoff(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	name := w.plan(o).Name
	// The cloud keeps failing until it recovers below: as many failures as passes.
	for range 50 {
		w.cloud.FailNext("launch", cloud.Errorf(cloud.Capacity, "launch", "InsufficientInstanceCapacity in us-east-1a"))
	}
	start := w.clock.Now()

	// The failing pass, then 20 more before its retry is due: one call.
	w.backedOff(o, name, "launch", 21, 1, time.Second)
	rec := w.record(name)
	if st := rec.Status.Instance; st.Failures != 1 || !retryAt(rec).Equal(start.Add(time.Second)) {
		t.Fatalf("after one failed launch: %+v; want 1 failure, retry at %s", st, start.Add(time.Second))
	}
	// Half-way, it waits for the rest.
	w.clock.advance(500 * time.Millisecond)
	w.backedOff(o, name, "launch", 1, 1, 500*time.Millisecond)
	// Due: asked again, and failing again it waits twice as long.
	w.clock.advance(500 * time.Millisecond)
	if res := w.mustReconcile(o, name); res.RequeueAfter != 2*time.Second || w.cloud.Calls("launch") != 2 {
		t.Fatalf("the due retry: back in %s, %d launch calls; want 2s and 2", res.RequeueAfter, w.cloud.Calls("launch"))
	}

	// A restarted berth goes by the record.
	restarted := w.owner(w.api)
	w.backedOff(restarted, name, "launch", 20, 2, 2*time.Second)
	w.clock.advance(2 * time.Second)
	if res := w.mustReconcile(restarted, name); res.RequeueAfter != 4*time.Second || w.cloud.Calls("launch") != 3 {
		t.Fatalf("the due retry after a restart: back in %s, %d launch calls; want 4s and 3", res.RequeueAfter, w.cloud.Calls("launch"))
	}

	// The cloud has room again: the launch passes and nothing of the wait is left.
	w.cloud.Recover("launch")
	w.clock.advance(4 * time.Second)
	w.mustReconcile(restarted, name)
	rec = w.record(name)
	if phaseOf(rec) != berthv1.InstanceReady || rec.Status.Instance.Failures != 0 || rec.Status.Instance.RetryAt != nil || w.cloud.Calls("launch") != 4 {
		t.Fatalf("after the launch passed: %+v, %d launch calls; want ready, no failures, no retry time, 4 calls", rec.Status.Instance, w.cloud.Calls("launch"))
	}
}

// TestAFailedTerminateWaitsOutItsBackoff: a terminate the cloud failed is asked again only at
// the time its record holds, however often the record comes back meanwhile, also after a
// restart.
func TestAFailedTerminateWaitsOutItsBackoff(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	rec := w.readyVM(o)
	name, id := rec.Name, rec.Status.Instance.ID
	for range 50 {
		w.cloud.FailNext("terminate", &cloud.Error{Kind: cloud.Throttled, Op: "terminate", Err: errors.New("RequestLimitExceeded")})
	}
	w.cloud.Stop(id) // berth terminates a VM someone stopped

	// The pass that finds it stopped and fails to terminate it, then 20 more: one call.
	w.backedOff(o, name, "terminate", 21, 1, time.Second)
	rec = w.record(name)
	if st := rec.Status.Instance; phaseOf(rec) != berthv1.InstanceTerminating || st.Failures != 1 || !retryAt(rec).Equal(w.clock.Now().Add(time.Second)) {
		t.Fatalf("after one failed terminate: %+v; want terminating, 1 failure, retry in 1s", st)
	}
	w.clock.advance(time.Second)
	if res := w.mustReconcile(o, name); res.RequeueAfter != 2*time.Second || w.cloud.Calls("terminate") != 2 {
		t.Fatalf("the due retry: back in %s, %d terminate calls; want 2s and 2", res.RequeueAfter, w.cloud.Calls("terminate"))
	}

	restarted := w.owner(w.api)
	w.backedOff(restarted, name, "terminate", 20, 2, 2*time.Second)
	w.cloud.Recover("terminate")
	w.clock.advance(2 * time.Second)
	w.mustReconcile(restarted, name)
	if got := w.cloud.Calls("terminate"); got != 3 {
		t.Errorf("%d terminate calls, want 3", got)
	}
	w.terminated(restarted, name, "was stopped while it was ready")
}

// TestARetiredVMIsNotHeldByItsLaunchsBackoff: a launching VM retired after a failed launch
// goes at once, not at the launch's retry time: the wait is for the cloud's launch call alone.
func TestARetiredVMIsNotHeldByItsLaunchsBackoff(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	name := w.plan(o).Name
	w.cloud.FailNext("launch", cloud.Errorf(cloud.Transient, "launch", "the API timed out"))
	if res := w.mustReconcile(o, name); res.RequeueAfter != time.Second {
		t.Fatalf("a failed launch is retried in %s, want 1s", res.RequeueAfter)
	}
	rec := w.record(name)
	if err := o.vm.retire(w.ctx, rec, "no task waits for it"); err != nil {
		t.Fatal(err)
	}
	w.mustReconcile(o, name)
	if rec := w.record(name); rec != nil {
		t.Fatalf("a retired VM that never launched is kept until its launch's retry: %+v", rec.Status.Instance)
	}
}

// TestAStaleCopyOfAVMRecordAsksTheCloudNothingEarly: a pass that reads the record from before
// the failure's own status write (the cache is behind it) does not ask the cloud again at once.
func TestAStaleCopyOfAVMRecordAsksTheCloudNothingEarly(t *testing.T) {
	w := newVMWorld(t, false)
	var stale *berthv1.BuildHost // what the cache shows of it, when set
	lagging := interceptor.NewClient(w.api, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if bh, ok := obj.(*berthv1.BuildHost); ok && stale != nil && key.Name == stale.Name {
				stale.DeepCopyInto(bh)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	o := w.owner(lagging)
	name := w.plan(o).Name
	for range 2 {
		w.cloud.FailNext("launch", cloud.Errorf(cloud.Transient, "launch", "the API timed out"))
	}
	stale = w.record(name)
	w.mustReconcile(o, name)
	if rec := w.record(name); rec.Status.Instance == nil || rec.Status.Instance.Failures != 1 {
		t.Fatalf("the failed launch is not recorded: %+v", rec.Status.Instance)
	}

	res, err := w.reconcile(o, name)
	if got := w.cloud.Calls("launch"); got != 1 || err != nil || res.RequeueAfter != time.Second {
		t.Fatalf("a pass on the copy from before the failure: %d launch calls, %+v, %v; want 1, back in 1s, no error", got, res, err)
	}
}
