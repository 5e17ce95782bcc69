package taskrun

import (
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/provision/provisionfake"
	"github.com/berth-ci/berth/internal/remote"
)

// testClock is a clock only the test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

// newTestClock starts at a whole second, as records keep times to the microsecond.
func newTestClock() *testClock { return &testClock{t: time.Now().Truncate(time.Second)} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// cleansFail makes every clean fail as a userdel refused by the host would, and every
// provision pass.
func cleansFail(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
	if kind == provisionfake.Clean {
		return provision.Outcome{Err: &remote.RemoteError{Host: j.Login.Host, Command: "removing user " + j.User, ExitCode: 1, Stderr: "userdel: user is currently used by process 4242"}}, true
	}
	return provision.Outcome{}, true
}

// cleansOf counts the cleans of user this process started.
func (h *harness) cleansOf(user string) int {
	n := 0
	for _, s := range h.prov.Started() {
		if s.Kind == provisionfake.Clean && s.Job.User == user {
			n++
		}
	}
	return n
}

// TestAFailedCleanWaitsOutItsBackoff: a clean that failed is tried again only once the backoff
// its record announces has passed, however often the task is reconciled before: each event of
// the record (the echo of the failure's own write, an edit of the TaskRun, a wake-up) used to
// start the next attempt at once, a login to the host many times a second. The reconcile asks
// to come back when the retry is due, and a restarted controller keeps the wait.
func TestAFailedCleanWaitsOutItsBackoff(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, hostsConfig(1, "h1"), func(r *Reconciler) { r.now = clock.now })
	tr := h.create(userTaskRun("ended", s390x))
	h.settle()
	user, _ := h.handedOver(tr)
	h.prov.Rule = cleansFail
	h.finish("ended")
	h.settle()
	key := types.NamespacedName{Namespace: tenantNS, Name: "ended"}

	// Events of the record and the TaskRun before the retry is due, many more than the
	// backoffs below allow attempts.
	const events = 20
	reconcileOften := func() {
		for range events {
			h.enqueue("ended")
			h.settle()
		}
	}
	reconcileOften()
	if n := h.cleansOf(user); n != 1 {
		t.Fatalf("%d cleans of %s were started before its first retry was due (1s after the failure), want 1", n, user)
	}
	rec := h.record(tr)
	if rec == nil || len(rec.Status.Debts) != 1 || rec.Status.CleanFailures != 1 || rec.Status.Debts[0].RetryAt == nil ||
		!rec.Status.Debts[0].RetryAt.Time.Equal(clock.now().Add(time.Second)) {
		t.Fatalf("record after one failed clean: %+v, want %s owed, retried at %s", rec, user, clock.now().Add(time.Second))
	}
	if after := h.requeues[key]; after != time.Second {
		t.Errorf("the reconcile comes back in %s, want when the retry is due, 1s", after)
	}

	// Half the wait passes: still too early, and the reconcile comes back for the rest.
	clock.advance(500 * time.Millisecond)
	reconcileOften()
	if n := h.cleansOf(user); n != 1 {
		t.Errorf("%d cleans of %s started half way through its backoff, want 1", n, user)
	}
	if after := h.requeues[key]; after != 500*time.Millisecond {
		t.Errorf("the reconcile comes back in %s, want the rest of the wait, 500ms", after)
	}

	// Due: one attempt, which fails again and doubles the wait.
	clock.advance(500 * time.Millisecond)
	reconcileOften()
	if n := h.cleansOf(user); n != 2 {
		t.Fatalf("%d cleans of %s once its retry was due, want 2", n, user)
	}
	if rec := h.record(tr); rec.Status.CleanFailures != 2 || !rec.Status.Debts[0].RetryAt.Time.Equal(clock.now().Add(2*time.Second)) {
		t.Errorf("after the second failure: %d failures, retry at %v; want 2, %s", rec.Status.CleanFailures, rec.Status.Debts[0].RetryAt, clock.now().Add(2*time.Second))
	}

	// A restart forgets nothing of the wait: the record holds it.
	h.start()
	h.prov.Rule = cleansFail
	h.enqueue("ended")
	h.settle()
	reconcileOften()
	if n := h.cleansOf(user); n != 0 {
		t.Errorf("the restarted controller started %d cleans of %s before its retry was due", n, user)
	}
	clock.advance(2 * time.Second)
	h.prov.Rule = nil
	h.enqueue("ended")
	h.settle()
	if h.record(tr) != nil {
		t.Errorf("the record outlived its debt once the retry passed: %+v", h.record(tr))
	}
}

// TestAStaleCopyOfTheRecordStartsNoEarlyClean: in one reconcile a phase pays the record's
// debts on the copy it saved (here a failed provision on h2), and reconcileUser then pays on
// the copy it started from, which does not show the failure just recorded: the clean that
// failed in the first must not start again in the second.
func TestAStaleCopyOfTheRecordStartsNoEarlyClean(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, hostsConfig(1, "h1", "h2"), func(r *Reconciler) { r.now = clock.now })
	// The first provision (h1) fails and leaves a debt; cleans and the provision on h2 run
	// until the test ends them.
	h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		if kind == provisionfake.Provision && j.Login.Host == "h1" {
			return provision.Outcome{Err: &remote.RemoteError{Host: "h1", Command: "creating user " + j.User, ExitCode: 1, Stderr: "useradd: cannot lock /etc/passwd"}}, true
		}
		return provision.Outcome{}, false
	}
	tr := h.create(userTaskRun("stale", s390x))
	h.settle()
	rec := h.record(tr)
	if rec == nil || len(rec.Status.Debts) != 1 || rec.Status.Login == nil || rec.Status.Login.Host != "h2" {
		t.Fatalf("record after the failed provision on h1: %+v, want one debt and h2 held", rec)
	}
	owed, second := rec.Status.Debts[0].BuildUser, rec.Status.BuildUser
	failed := provision.Outcome{Err: &remote.RemoteError{Host: "h1", Command: "removing user " + owed, ExitCode: 1, Stderr: "userdel: user is currently used by process 4242"}}
	if err := h.prov.End(provisionfake.Clean, owed, failed); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if n := h.cleansOf(owed); n != 1 {
		t.Fatalf("%d cleans of %s, want 1", n, owed)
	}

	// The retry comes due and starts; it fails in the same pass in which h2's provision fails.
	clock.advance(time.Second)
	h.enqueue("stale")
	h.settle()
	if n := h.cleansOf(owed); n != 2 {
		t.Fatalf("%d cleans of %s once its retry was due, want 2", n, owed)
	}
	if err := h.prov.End(provisionfake.Clean, owed, failed); err != nil {
		t.Fatal(err)
	}
	if err := h.prov.End(provisionfake.Provision, second, provision.Outcome{Err: &remote.RemoteError{Host: "h2", Command: "creating user " + second, ExitCode: 1, Stderr: "useradd: cannot lock /etc/passwd"}}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if n := h.cleansOf(owed); n != 2 {
		t.Errorf("%d cleans of %s after its second failure, want 2: a copy of the record older than that failure started another", n, owed)
	}
	if rec := h.record(tr); rec == nil || rec.Status.CleanFailures != 2 {
		t.Errorf("record after the second failure: %+v, want 2 clean failures", rec)
	}
}
