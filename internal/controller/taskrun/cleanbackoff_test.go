//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// TestAFailingCleanIsRetriedNoFasterThanItsBackoff: a clean that fails on a real host (what the
// build user left, a mount of its own, cannot go) is retried after the backoff the record
// announces (1s, 2s, 4s, ...), not at every event that brings the task back: here its tenant
// edits the ended TaskRun ten times a second, as any tenant may. From the first failure, a
// window of cleanWindow holds the retries due at 1s and 3s and no more. Before the fix each
// event started the next attempt at once, a login to the host per event.
func TestAFailingCleanIsRetriedNoFasterThanItsBackoff(t *testing.T) {
	applyConfig(t, 1, nil)
	ns := namespace(t)
	ctx := context.Background()
	tr := create(t, userTaskRun(ns, "clean-fails", platform, ""))
	rec := ready(t, tr)
	host, user := hostOf(t, rec.Status.Login), rec.Status.BuildUser
	_, unmount := leaveAMount(t, host, user)
	defer unmount()
	finish(t, tr)

	stacktest.EventuallyWithin(t, stacktest.Patience, 10*time.Millisecond, "the clean of "+user+" failed", func() (bool, error) {
		r := recordOf(t, tr)
		return r.Status.CleanFailures >= 1, fmt.Errorf("clean failures %d, message %q", r.Status.CleanFailures, r.Status.Message)
	})
	start := recordOf(t, tr).Status.CleanFailures
	const cleanWindow = 5 * time.Second
	edits := 0
	for deadline := time.Now().Add(cleanWindow); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"labels":{"tenant-edit":"%d"}}}`, edits)))
		if err := c().Patch(ctx, get(t, tr), patch); err != nil {
			t.Fatal(err)
		}
		edits++
	}
	end := recordOf(t, tr).Status.CleanFailures
	t.Logf("clean failures: %d, then %d after %s and %d edits of the TaskRun", start, end, cleanWindow, edits)
	if end-start > 2 {
		t.Errorf("%d clean attempts failed within %s of the first failure; its backoff (1s, 2s, 4s) allows 2", end-start, cleanWindow)
	}

	unmount()
	stacktest.EventuallyWithin(t, stacktest.Patience+taskrun.MaxCleanBackoff, 250*time.Millisecond, "the retried clean removed "+user, func() (bool, error) {
		return !userExists(t, host, user), fmt.Errorf("%s is still on %s", user, host.Name)
	})
	settled(t, ns)
}
