package keyserver_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// A TaskRun that Tekton retries mounts the same secret, and so the same token, in every
// attempt's pod: each attempt redeems the key once, and the last leaves nothing kept.
func TestRetriedTaskRedeemsOncePerAttempt(t *testing.T) {
	store := newStore(t)
	dir, ca := certDir(t)
	s := serve(t, store, dir, ca, nil)
	ctx := context.Background()
	k := newRetriedTask(t, 2)
	startAttempt(t, k, 1, time.Now())
	key := privateKey(t)
	tok, err := store.Put(ctx, key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		if attempt > 1 {
			startAttempt(t, k, attempt, time.Now())
		}
		if status, body := s.post(t, "/otp", tok.String()); status != http.StatusOK || body != string(key) {
			t.Fatalf("attempt %d: %d %q; want the key", attempt, status, body)
		}
		if status, body := s.post(t, "/otp", tok.String()); status != http.StatusNotFound || body != keyserver.ErrUnknown.Error() {
			t.Fatalf("attempt %d, asked again: %d %q; want %d %q", attempt, status, body, http.StatusNotFound, keyserver.ErrUnknown)
		}
		last := attempt == 3
		if kept := isKept(t, tok.Name()); kept == last {
			t.Fatalf("after attempt %d redeemed it, the key is kept: %v, want %v", attempt, kept, !last)
		}
		// The controller, writing the task's secret again, keeps the token while a later
		// attempt can still redeem it, however long after the key was stored.
		afterTTL := &keyserver.Store{Client: store.Client, Namespace: namespace, Now: func() time.Time { return time.Now().Add(time.Hour) }}
		if held, err := afterTTL.Holds(ctx, tok.String(), *k.binding(), key); err != nil || held == last {
			t.Errorf("after attempt %d, Holds past the stored TTL: %v, %v; want %v", attempt, held, err, !last)
		}
	}
}

// Many redemptions of one token in one attempt: exactly one gets the key, in an attempt that
// keeps it for the next as in the last, which deletes it.
func TestConcurrentRedeemersGetTheKeyOncePerAttempt(t *testing.T) {
	store := newStore(t)
	dir, ca := certDir(t)
	s := serve(t, store, dir, ca, nil)
	k := newRetriedTask(t, 1)
	startAttempt(t, k, 1, time.Now())
	key := privateKey(t)
	tok, err := store.Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	const redeemers = 20
	for attempt := 1; attempt <= 2; attempt++ {
		if attempt > 1 {
			startAttempt(t, k, attempt, time.Now())
		}
		got, refused := race(t, s, tok.String(), key, redeemers, fmt.Sprintf("attempt %d, ", attempt))
		if got != 1 || refused != redeemers-1 {
			t.Fatalf("attempt %d: %d redeemers got the key and %d were refused; want 1 and %d", attempt, got, refused, redeemers-1)
		}
		if kept, want := isKept(t, tok.Name()), attempt == 1; kept != want {
			t.Fatalf("after attempt %d, the key is kept: %v, want %v", attempt, kept, want)
		}
	}
}

// An attempt after the first may redeem the key within a TTL of its own start, however long
// after the key was stored; past that it is told the token expired, and the key stays kept
// for an attempt that may still follow.
func TestLaterAttemptRedeemsWithinATTLOfItsStart(t *testing.T) {
	var clock atomic.Int64 // the store's now, in Unix nanoseconds
	at := func(d time.Duration) time.Time { return time.Unix(0, clock.Load()).Add(d) }
	t0 := time.Now()
	clock.Store(t0.UnixNano())
	store := &keyserver.Store{Client: asController(t), Namespace: namespace, TTL: 30 * time.Minute, Now: func() time.Time { return at(0) }}
	dir, ca := certDir(t)
	s := serve(t, store, dir, ca, nil)
	k := newRetriedTask(t, 3)
	startAttempt(t, k, 1, t0)
	key := privateKey(t)
	tok, err := store.Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	redeem := func(what string, wantStatus int, want string, kept bool) {
		t.Helper()
		if status, body := s.post(t, "/otp", tok.String()); status != wantStatus || body != want {
			t.Fatalf("%s: %d %q; want %d %q", what, status, body, wantStatus, want)
		}
		if got := isKept(t, tok.Name()); got != kept {
			t.Fatalf("%s: the key is kept: %v, want %v", what, got, kept)
		}
	}
	redeem("attempt 1", http.StatusOK, string(key), true)

	startAttempt(t, k, 2, t0.Add(45*time.Minute)) // past the TTL the key was stored with
	clock.Store(t0.Add(46 * time.Minute).UnixNano())
	redeem("attempt 2, a minute after it started", http.StatusOK, string(key), true)

	startAttempt(t, k, 3, t0.Add(50*time.Minute))
	clock.Store(t0.Add(81 * time.Minute).UnixNano())
	redeem("attempt 3, 31 minutes after it started", http.StatusGone, keyserver.ErrExpired.Error(), true)

	startAttempt(t, k, 4, t0.Add(90*time.Minute))
	clock.Store(t0.Add(91 * time.Minute).UnixNano())
	redeem("attempt 4, the last, a minute after it started", http.StatusOK, string(key), false)
}

// The sweep leaves a key that an attempt redeemed, past the TTL it was stored with, for the
// TaskRun's next attempt, and deletes it when the TaskRun ends; a key no attempt redeemed goes
// at its TTL, as ever.
func TestSweepKeepsAKeyForTheNextAttempt(t *testing.T) {
	store := newStore(t)
	ctx := context.Background()
	k := newRetriedTask(t, 2)
	startAttempt(t, k, 1, time.Now())
	redeemedTok, unredeemedTok := put(t, store, k), put(t, store, newRetriedTask(t, 2))
	if _, err := store.Redeem(ctx, redeemedTok); err != nil {
		t.Fatal(err)
	}
	afterTTL := &keyserver.Store{Client: store.Client, Namespace: namespace, Now: func() time.Time { return time.Now().Add(time.Hour) }}
	if _, err := afterTTL.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if !isKept(t, mustParse(t, redeemedTok).Name()) {
		t.Error("the sweep deleted a key kept for the next attempt of a live TaskRun")
	}
	if isKept(t, mustParse(t, unredeemedTok).Name()) {
		t.Error("the sweep left a key no attempt redeemed past its TTL")
	}

	// The TaskRun's second attempt fails too; a third is not made yet: only its end is left.
	startAttempt(t, k, 2, time.Now())
	k.tr.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionSucceeded, Status: corev1.ConditionFalse, Reason: "Failed"}}
	if err := cp.Client.Status().Update(ctx, k.tr); err != nil {
		t.Fatal(err)
	}
	if _, err := afterTTL.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if isKept(t, mustParse(t, redeemedTok).Name()) {
		t.Error("the sweep left the key of a TaskRun that ended")
	}
}

// startAttempt writes the status Tekton gives a TaskRun whose attempt (1, 2, …) started at
// started: each earlier attempt failed and archived in retriesStatus, this one running.
func startAttempt(t *testing.T, k task, attempt int, started time.Time) {
	t.Helper()
	failed := pipelinev1.TaskRunStatus{Status: duckv1.Status{Conditions: duckv1.Conditions{
		{Type: apis.ConditionSucceeded, Status: corev1.ConditionFalse, Reason: "Failed"},
	}}}
	failed.StartTime, failed.CompletionTime = &metav1.Time{Time: started.Add(-time.Minute)}, &metav1.Time{Time: started}
	k.tr.Status.RetriesStatus = nil
	for range attempt - 1 {
		k.tr.Status.RetriesStatus = append(k.tr.Status.RetriesStatus, failed)
	}
	k.tr.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionSucceeded, Status: corev1.ConditionUnknown, Reason: "Running"}}
	k.tr.Status.StartTime = &metav1.Time{Time: started}
	if err := cp.Client.Status().Update(context.Background(), k.tr); err != nil {
		t.Fatal(err)
	}
}

// A pod of a retried task (spec.retries: 2) replays its token, redeemed already in the attempt
// the TaskRun is in, from several goroutines while another tenant's task redeems its own: every
// replay is refused, the other redemption succeeds, and no replay costs a request to the
// apiserver, since the key server knows from memory which attempt redeemed the key and,
// from the controller's cache, which attempt runs. The next attempt still redeems it once.
func TestReplaysOfARedeemedTokenCostTheAPIServerNothing(t *testing.T) {
	dir, ca := certDir(t)
	ks := newIndexed(t, keyserver.DefaultUnsureReads, keyserver.DefaultUnsureBurst, true)
	ks.store.Attempts = controllerCache(t)
	s := serveHandler(t, &keyserver.Handler{Store: ks.store, Log: logr.Discard()}, dir, ca)
	ctx := context.Background()
	k := newRetriedTask(t, 2)
	startAttempt(t, k, 1, time.Now())
	key := privateKey(t)
	tok, err := ks.store.Put(ctx, key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	const replays, sources = 100, 4
	for attempt := 1; attempt <= 2; attempt++ {
		if attempt > 1 {
			startAttempt(t, k, attempt, time.Now())
		}
		// The controller's cache has listed the records and TaskRuns long before (it serves
		// the task); here it starts with the test, so the test waits for it to show the task.
		waitFor(t, fmt.Sprintf("the controller's cache shows attempt %d", attempt), func() bool {
			n, ok := ks.store.Attempts.Attempt(ctx, k.rec.Name)
			return ok && n == attempt
		})
		if status, body := s.post(t, "/otp", tok.String()); status != http.StatusOK || body != string(key) {
			t.Fatalf("attempt %d: %d %q; want the key", attempt, status, body)
		}
		// Another tenant's task redeems its own token in the middle of the replays: that
		// redemption (three reads and a delete, its task not retried) is all the apiserver sees.
		other := newTask(t)
		otherKey := privateKey(t)
		otherTok, err := ks.store.Put(ctx, otherKey, other.binding(), "")
		if err != nil {
			t.Fatal(err)
		}
		const otherCost = 4
		before := ks.calls.n.Load()
		var wg sync.WaitGroup
		var wrong atomic.Int32
		wg.Go(func() {
			if status, body := s.post(t, "/otp", otherTok.String()); status != http.StatusOK || body != string(otherKey) {
				t.Errorf("attempt %d: the other tenant's redemption got %d %q; want its key", attempt, status, body)
			}
		})
		for range sources {
			wg.Go(func() {
				for range replays / sources {
					if status, body := s.post(t, "/otp", tok.String()); status != http.StatusNotFound || body != keyserver.ErrUnknown.Error() {
						wrong.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if n := wrong.Load(); n > 0 {
			t.Fatalf("attempt %d: %d of %d replays were not refused as already used", attempt, n, replays)
		}
		if n := ks.calls.n.Load() - before - otherCost; n != 0 {
			t.Fatalf("attempt %d: %d replays of the redeemed token cost %d apiserver requests besides the other tenant's redemption, want none", attempt, replays, n)
		}
	}
}

// controllerCache is what the controller's manager holds (its cache, cut down as berth cuts
// it) as the key server in its process reads it: the attempt a record's TaskRun is in.
func controllerCache(t *testing.T) keyserver.Attempts {
	t.Helper()
	o := taskrun.CacheOptions(namespace)
	o.Scheme = cp.Client.Scheme()
	c, err := cache.New(cp.ConfigFor(namespace, controller), o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return taskrun.CachedAttempts{Cache: c, Namespace: namespace}
}
