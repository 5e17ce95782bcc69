// Package vms is berth's loop over the VMs it launches for dynamic and dynamic-pool platforms.
// Each VM has a BuildHost record with an instance section, written before the cloud is asked
// for it, so that a crash at any instant neither launches twice nor loses a VM. The VM
// reconciler walks one record through its phases (launching, booting, ready, terminating); the
// planner decides, one platform at a time, how many VMs to launch, retire and terminate; the
// sweeper terminates instances carrying this installation's tag that no record accounts for.
package vms

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/incident"
	"github.com/berth-ci/berth/internal/warning"
)

// Debts are the build users still to be removed from hosts, which the task records hold
// (package taskrun keeps them): a VM berth terminates takes its users with it.
type Debts interface {
	// ForgetHost drops every build user owed to a host that is gone.
	ForgetHost(ctx context.Context, host string) error
}

// Prober logs in to a VM for the first time and returns the host key it presented (or checks
// the configured one).
type Prober interface {
	FirstContact(ctx context.Context, login berthv1.HostLogin) (hostKey string, err error)
}

// Fleet launches, watches and ends the VMs of every dynamic platform.
type Fleet struct {
	Client    client.Client
	APIReader client.Reader
	Namespace string
	Config    *hostconfig.Store
	// Capacity is the ledger and its wake-ups, shared with the task controller.
	Capacity *capacity.Capacity
	Recorder events.EventRecorder
	Debts    Debts
	Prober   Prober
	// Secret reads a Secret of the controller's namespace (cloud credentials), on demand.
	Secret cloud.SecretReader
	// PlanInterval is the longest the planner waits between two passes when nothing kicks it.
	PlanInterval time.Duration
	// SweepInterval is how often the sweeper lists the clouds; LeakGrace how old an instance
	// without a record must be before it is terminated as a leak.
	SweepInterval, LeakGrace time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	kick chan struct{}

	mu     sync.Mutex
	logins map[string]berthv1.HostLogin // ready VMs by record name
	// specs are the ready VMs' instance specs, to close at once those a config change
	// makes outdated.
	specs   map[string]*berthv1.InstanceSpec
	trouble map[string]trouble // platform → last launch failure
	// built holds providers by platform, type and settings (see providerSpec); lastSpec is
	// each platform's spec from the config, kept after the platform leaves it.
	built        map[string]cloud.Provider
	lastSpec     map[string]providerSpec
	installation string
}

// trouble is a platform's launch failing. Its ref stays the same from the first failure
// until a launch succeeds or the config changes: the tenants of the platform quote it, and
// every operator-side Event and log line of the run carries it with the cloud's answer.
type trouble struct {
	kind  cloud.Kind
	ref   incident.Ref
	since time.Time
}

func (f *Fleet) now() time.Time {
	if f.Now != nil {
		return f.Now()
	}
	return time.Now()
}

func (f *Fleet) init() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kick == nil {
		f.kick = make(chan struct{}, 1)
		f.logins = map[string]berthv1.HostLogin{}
		f.specs = map[string]*berthv1.InstanceSpec{}
		f.trouble = map[string]trouble{}
		f.built = map[string]cloud.Provider{}
		f.lastSpec = map[string]providerSpec{}
	}
}

// Kick asks the planner for a pass soon; kicks coalesce.
func (f *Fleet) Kick() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Login is how berth reaches a ready VM as its admin.
func (f *Fleet) Login(host string) (berthv1.HostLogin, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	login, ok := f.logins[host]
	return login, ok
}

// Gone tells whether a VM named host has no record any more (its instance is terminated).
func (f *Fleet) Gone(ctx context.Context, host string) (bool, error) {
	var bh berthv1.BuildHost
	err := f.Client.Get(ctx, client.ObjectKey{Namespace: f.Namespace, Name: host}, &bh)
	if err == nil {
		return false, nil
	}
	return client.IgnoreNotFound(err) == nil, client.IgnoreNotFound(err)
}

// Unservable tells whether a task waiting since queued on platform should get an error now:
// the cloud refused the platform's launches for good, or has had no capacity for longer than
// the platform's allocation timeout. recheck is when to ask again.
func (f *Fleet) Unservable(platform string, waited time.Duration) (reason, message string, recheck time.Duration) {
	f.mu.Lock()
	t, ok := f.trouble[platform]
	f.mu.Unlock()
	if !ok {
		return "", "", 0
	}
	// The cloud's own answer is not repeated here: it names the account, the principal and
	// the policy, and this text goes to tenants (see package incident).
	what, next := incident.Cloud(t.kind)
	if t.kind.Permanent() {
		return "CloudRefused", fmt.Sprintf("berth cannot launch VMs for platform %s: %s. %s; %s.",
			platform, what, upperFirst(next), t.ref.Where(f.Namespace)), 0
	}
	d := f.dynamic(config.Platform(platform))
	if d == nil {
		return "", "", 0
	}
	if left := d.AllocationTimeout - waited; left > 0 {
		return "", "", left
	}
	return "NoCapacity", fmt.Sprintf("no VM for platform %s could be launched within its allocation timeout (%s): since %s, %s. %s; if it keeps happening, %s.",
		platform, d.AllocationTimeout, t.since.UTC().Format(time.RFC3339), what, upperFirst(next), t.ref.Where(f.Namespace)), 0
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func (f *Fleet) dynamic(p config.Platform) *config.DynamicPlatform {
	if cfg := f.Config.Config(); cfg != nil {
		return cfg.Dynamic[p]
	}
	return nil
}

// noteTrouble remembers a failed launch; waiters of the platform are told, so that they can
// fail when the failure is for good. It returns the reference of the run of failures, for the
// caller's operator-side Event or log line that carries err itself.
func (f *Fleet) noteTrouble(platform string, err error) incident.Ref {
	f.mu.Lock()
	t, had := f.trouble[platform]
	if !had {
		t.since, t.ref = f.now(), incident.NewRef()
	}
	t.kind = cloud.KindOf(err)
	f.trouble[platform] = t
	f.mu.Unlock()
	launches.WithLabelValues(platform, t.kind.String()).Inc()
	f.Capacity.WakeWaiters(platform)
	return t.ref
}

func (f *Fleet) clearTrouble(platform string) {
	f.mu.Lock()
	delete(f.trouble, platform)
	f.mu.Unlock()
}

// paused: the last launch of the platform was refused for good, less than a minute ago.
func (f *Fleet) paused(platform string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.trouble[platform]
	return ok && t.kind.Permanent() && f.now().Sub(t.since) < time.Minute
}

func (f *Fleet) setLogin(rec *berthv1.BuildHost) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logins[rec.Name] = loginOf(rec)
	f.specs[rec.Name] = rec.Spec.Instance.DeepCopy()
}

func (f *Fleet) dropLogin(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.logins, name)
	delete(f.specs, name)
}

// configChanged takes a new config in: new settings may cure a refused platform, so it may
// launch again; and VMs launched with settings their platform no longer has are closed
// before a task can take one (the planner writes why into their records).
func (f *Fleet) configChanged(cfg *config.Config) {
	f.mu.Lock()
	clear(f.trouble)
	var stale []string
	for name, in := range f.specs {
		if d := cfg.Dynamic[config.Platform(in.Platform)]; d != nil && outdated(in, d) {
			stale = append(stale, name)
		}
	}
	f.mu.Unlock()
	for _, name := range stale {
		f.Capacity.RetireHost(name)
	}
	f.Kick()
}

func loginOf(rec *berthv1.BuildHost) berthv1.HostLogin {
	in := rec.Spec.Instance
	return berthv1.HostLogin{Host: rec.Name, Address: rec.Status.Address, AdminUser: in.AdminUser, AdminSecret: in.AdminSecret,
		HostKey: rec.Status.Instance.HostKey, Platform: in.Platform, Instance: rec.Status.Instance.ID}
}

// open puts a ready VM into the ledger (a retired one closed) and wakes its waiters.
func (f *Fleet) open(rec *berthv1.BuildHost) {
	f.setLogin(rec)
	in := rec.Spec.Instance
	host := allocation.Host{Name: rec.Name, Platform: in.Platform, Capacity: in.Slots, SingleUse: !in.Pooled}
	if d := f.dynamic(config.Platform(in.Platform)); in.Retire != "" || (d != nil && outdated(in, d)) {
		// Known to the ledger, closed: the planner terminates a retired VM once the ledger
		// sees it free, and after a restart nothing else may put it there (a single-use VM
		// whose task's record went just before the crash), so it would stay up for good. A VM
		// launched with settings the platform no longer has stays closed too, from the config
		// change until the planner retires it in its record.
		f.Capacity.PutRetiredHost(host)
		return
	}
	f.Capacity.PutHost(host)
	// A drained or quarantined VM stays out of service.
	f.Capacity.Quarantine(rec.Name, rec.Spec.Drained || rec.Status.Quarantined)
}

// Released is told that a task's last hold on host is going: a single-use VM is retired in
// its record first, so no restart can hand it to a second task.
func (f *Fleet) Released(ctx context.Context, host string) error {
	var rec berthv1.BuildHost
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: f.Namespace, Name: host}, &rec); err != nil {
		return client.IgnoreNotFound(err)
	}
	if rec.Spec.Instance == nil || rec.Spec.Instance.Pooled {
		return nil
	}
	return f.retire(ctx, &rec, "it served its task")
}

// event tells the operator of a VM's step: an Event on its BuildHost and a log line with the
// VM, its platform and instance (a warning line for a Warning; see package warning).
func (f *Fleet) event(rec *berthv1.BuildHost, eventType, reason, format string, args ...any) {
	f.Recorder.Eventf(rec, nil, eventType, reason, reason, "%s", incident.Note(fmt.Sprintf(format, args...)))
	log := vmLog.WithValues("host", rec.Name, "platform", rec.Spec.Instance.Platform, "reason", reason)
	if st := rec.Status.Instance; st != nil && st.ID != "" {
		log = log.WithValues("instance", st.ID)
	}
	if eventType == corev1.EventTypeWarning {
		warning.Log(log, fmt.Sprintf(format, args...))
		return
	}
	log.Info(fmt.Sprintf(format, args...))
}

var vmLog = ctrl.Log.WithName("vm")

func (f *Fleet) warn(rec *berthv1.BuildHost, reason, format string, args ...any) {
	f.event(rec, corev1.EventTypeWarning, reason, format, args...)
}
