package hosts

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/incident"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
)

// trouble is a platform's launch failing. Its ref stays the same from the first failure
// until a launch succeeds or the config changes: the tenants of the platform quote it, and
// every operator-side Event and log line of the run carries it with the cloud's answer.
type trouble struct {
	kind  cloud.Kind
	ref   incident.Ref
	since time.Time
}

// troubles are the platforms' launches failing, and what their waiting tasks are told.
type troubles struct {
	namespace string
	config    *hostconfig.Store
	capacity  *capacity.Capacity
	now       func() time.Time

	mu         sync.Mutex
	byPlatform map[string]trouble // platform → last launch failure
}

// unservable is Owner.Unservable.
func (ts *troubles) unservable(platform string, waited time.Duration) (reason, message string, recheck time.Duration) {
	ts.mu.Lock()
	t, ok := ts.byPlatform[platform]
	ts.mu.Unlock()
	if !ok {
		return "", "", 0
	}
	// The cloud's own answer is not repeated here: it names the account, the principal and
	// the policy, and this text goes to tenants (see package incident).
	what, next := incident.Cloud(t.kind)
	if t.kind.Permanent() {
		return "CloudRefused", fmt.Sprintf("berth cannot launch VMs for platform %s: %s. %s; %s.",
			platform, what, upperFirst(next), t.ref.Where(ts.namespace)), 0
	}
	d := dynamic(ts.config, config.Platform(platform))
	if d == nil {
		return "", "", 0
	}
	if left := d.AllocationTimeout - waited; left > 0 {
		return "", "", left
	}
	return "NoCapacity", fmt.Sprintf("no VM for platform %s could be launched within its allocation timeout (%s): since %s, %s. %s; if it keeps happening, %s.",
		platform, d.AllocationTimeout, t.since.UTC().Format(time.RFC3339), what, upperFirst(next), t.ref.Where(ts.namespace)), 0
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// note remembers a failed launch; waiters of the platform are told, so that they can fail
// when the failure is for good. It returns the reference of the run of failures, for the
// caller's operator-side Event or log line that carries err itself.
func (ts *troubles) note(platform string, err error) incident.Ref {
	ts.mu.Lock()
	t, had := ts.byPlatform[platform]
	if !had {
		t.since, t.ref = ts.now(), incident.NewRef()
	}
	t.kind = cloud.KindOf(err)
	ts.byPlatform[platform] = t
	ts.mu.Unlock()
	launches.WithLabelValues(platform, t.kind.String()).Inc()
	konfluxmetrics.HostAllocationFailures(platform).Inc()
	ts.capacity.WakeWaiters(platform)
	return t.ref
}

// clear ends the platform's run of failures: a launch succeeded.
func (ts *troubles) clear(platform string) {
	ts.mu.Lock()
	delete(ts.byPlatform, platform)
	ts.mu.Unlock()
}

// reset forgets every platform's failures: new settings may cure them.
func (ts *troubles) reset() {
	ts.mu.Lock()
	clear(ts.byPlatform)
	ts.mu.Unlock()
}

// paused: the last launch of the platform was refused for good, less than a minute ago.
func (ts *troubles) paused(platform string) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.byPlatform[platform]
	return ok && t.kind.Permanent() && ts.now().Sub(t.since) < time.Minute
}
