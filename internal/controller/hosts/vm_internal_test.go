package hosts

// The life of a VM (launching, booting, ready, terminating), driven through the VM loop and the
// planner alone, with controller-runtime's fake client standing in for the apiserver, the
// in-memory cloud of package cloudfake, a fake first login, a fixed clock, and the real
// ledger. No root, no apiserver, no cloud, no sshd: milliseconds each.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/cloud/cloudfake"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/kubescheme"
)

const (
	vmNS       = "berth-system"
	vmPlatform = "linux/arm64"
	// fakeCloudType is the provider type of the tests' platforms: no real provider has it,
	// so providers.build can only reach the fakes below.
	fakeCloudType = "vm-internal-test-cloud"
	vmAddress     = "198.18.7.1"
	vmHostKey     = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBerthTestHostKey"
	// allocationTimeout and checkInterval are the tests' platform timing (seconds).
	allocationTimeout = 600 * time.Second
	checkInterval     = 5 * time.Second
)

// fakeClouds are the in-memory clouds by the endpoint setting of the platform that reaches them:
// each test has its own, and a second Owner built from the same config reaches the same one, as a
// restarted berth reaches the same cloud account.
var fakeClouds = struct {
	once sync.Once
	mu   sync.Mutex
	by   map[string]*cloudfake.Provider
}{by: map[string]*cloudfake.Provider{}}

// newFakeCloud makes the cloud of one test, reached through the endpoint it returns. The
// provider type is registered once per test binary: a second Register panics.
func newFakeCloud(t *testing.T) (*cloudfake.Provider, string) {
	t.Helper()
	fakeClouds.once.Do(func() {
		cloud.Register(fakeCloudType, func(s cloud.Settings) (cloud.Provider, error) {
			fakeClouds.mu.Lock()
			defer fakeClouds.mu.Unlock()
			if p, ok := fakeClouds.by[s.Values["endpoint"]]; ok {
				return p, nil
			}
			return nil, cloud.Errorf(cloud.BadConfig, "setup", "no fake cloud at %q", s.Values["endpoint"])
		})
	})
	endpoint := "http://cloud.invalid/" + t.Name()
	p := cloudfake.New(vmAddress)
	p.User = "builder"
	fakeClouds.mu.Lock()
	fakeClouds.by[endpoint] = p
	fakeClouds.mu.Unlock()
	t.Cleanup(func() {
		fakeClouds.mu.Lock()
		delete(fakeClouds.by, endpoint)
		fakeClouds.mu.Unlock()
	})
	return p, endpoint
}

// fixedClock is the tests' time: it moves only when a test moves it.
type fixedClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fixedClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// forgottenHosts are Debts that record which hosts berth said were gone.
type forgottenHosts struct {
	mu    sync.Mutex
	hosts []string
}

func (d *forgottenHosts) ForgetHost(_ context.Context, host string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hosts = append(d.hosts, host)
	return nil
}

// RetryCleans: VMs are never checked back into service with cleans owed.
func (d *forgottenHosts) RetryCleans(context.Context, string) error { return nil }

func (d *forgottenHosts) forgotten() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.hosts)
}

// scriptedProber is the first login to a VM: it presents vmHostKey, or fails with fail.
type scriptedProber struct {
	mu     sync.Mutex
	fail   error
	logins []berthv1.HostLogin
}

func (p *scriptedProber) FirstContact(_ context.Context, login berthv1.HostLogin) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logins = append(p.logins, login)
	if p.fail != nil {
		return "", p.fail
	}
	return vmHostKey, nil
}

func (p *scriptedProber) tries() []berthv1.HostLogin {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.logins)
}

// vmEvent is one Event berth recorded on a record.
type vmEvent struct{ name, eventType, reason, note string }

type vmEventLog struct {
	mu     sync.Mutex
	events []vmEvent
}

func (l *vmEventLog) Eventf(regarding, _ runtime.Object, eventType, reason, _, note string, args ...any) {
	e := vmEvent{eventType: eventType, reason: reason, note: fmt.Sprintf(note, args...)}
	if a, err := meta.Accessor(regarding); err == nil {
		e.name = a.GetName()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// on lists the Events of one reason on the record name.
func (l *vmEventLog) on(name, reason string) []vmEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []vmEvent
	for _, e := range l.events {
		if e.name == name && e.reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// vmWorld is what outlives one berth process: the apiserver, the cloud, the config, the clock,
// and the task side's debts. A test builds Owners on it, as many as berth restarts.
type vmWorld struct {
	t      *testing.T
	ctx    context.Context
	api    client.WithWatch
	cloud  *cloudfake.Provider
	store  *hostconfig.Store
	clock  *fixedClock
	debts  *forgottenHosts
	prober *scriptedProber
	events *vmEventLog
	// task waits on the platform for a VM.
	task allocation.Task
}

// newVMWorld sets up one platform of type fakeCloudType: a dynamic one (a VM per task), or a
// pool of VMs taking three tasks each.
func newVMWorld(t *testing.T, pooled bool) *vmWorld {
	t.Helper()
	fc, endpoint := newFakeCloud(t)
	label := strings.ReplaceAll(vmPlatform, "/", "-")
	data := map[string]string{
		"dynamic." + label + ".type":               "local-vm", // a type config knows; swapped below
		"dynamic." + label + ".endpoint":           endpoint,
		"dynamic." + label + ".secret":             "cloud-credentials",
		"dynamic." + label + ".ssh-secret":         "vm-admin-key",
		"dynamic." + label + ".max-instances":      "2",
		"dynamic." + label + ".allocation-timeout": fmt.Sprint(int(allocationTimeout.Seconds())),
		"dynamic." + label + ".check-interval":     fmt.Sprint(int(checkInterval.Seconds())),
	}
	if pooled {
		data["dynamic-pool-platforms"] = vmPlatform
		data["dynamic."+label+".concurrency"] = "3"
		data["dynamic."+label+".max-age"] = "60"
	} else {
		data["dynamic-platforms"] = vmPlatform
	}
	cfg, problems := config.Parse(data)
	if !cfg.Usable(vmPlatform) {
		t.Fatalf("the test's platform is not usable: %v", problems)
	}
	// config knows only the real providers' types; the platform's VMs go to the fake cloud.
	cfg.Dynamic[vmPlatform].Type = fakeCloudType
	store := hostconfig.NewStore()
	store.Apply(cfg)
	store.MarkSynced()

	clock := &fixedClock{now: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)}
	// A tracker without managed fields, as the task controller's tests have it: berth never
	// applies, and the fake client's own tracker costs a tenth of a second to set up.
	scheme := kubescheme.New()
	tracker := fake.NewClientBuilder().WithScheme(scheme).
		WithObjectTracker(clienttesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())).
		WithStatusSubresource(&berthv1.BuildHost{}).Build()
	// The apiserver gives every object a UID and a creation time; the fake client gives
	// neither, and the VM loop needs both (the launch token, the allocation timeout).
	api := interceptor.NewClient(tracker, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			obj.SetUID(uuid.NewUUID())
			obj.SetCreationTimestamp(metav1.NewTime(clock.Now()))
			return c.Create(ctx, obj, opts...)
		},
	})
	return &vmWorld{t: t, ctx: context.Background(), api: api, cloud: fc, store: store, clock: clock,
		debts: &forgottenHosts{}, prober: &scriptedProber{}, events: &vmEventLog{},
		task: allocation.Task{Namespace: "tenant", Name: "build-1"}}
}

// owner starts a berth on the world with a fresh, restored ledger, through c (the apiserver,
// or a view of it that fails as a test needs), and puts the world's task in line, as the task
// controller does at every start.
func (w *vmWorld) owner(c client.Client) *Owner {
	ledger := capacity.New()
	ledger.MarkRestored()
	o := &Owner{Client: c, APIReader: w.api, Namespace: vmNS, Config: w.store, Capacity: ledger,
		Recorder: w.events, Debts: w.debts, Prober: w.prober, Now: w.clock.Now}
	o.init()
	ledger.Join(allocation.Request{Task: w.task, Platform: vmPlatform, Created: w.clock.Now()})
	return o
}

// records lists the VM records in the apiserver.
func (w *vmWorld) records() []berthv1.BuildHost {
	w.t.Helper()
	var list berthv1.BuildHostList
	if err := w.api.List(w.ctx, &list, client.InNamespace(vmNS)); err != nil {
		w.t.Fatal(err)
	}
	return list.Items
}

// plan runs one planner pass and returns the one VM record there is after it.
func (w *vmWorld) plan(o *Owner) berthv1.BuildHost {
	w.t.Helper()
	if err := o.planner.planAll(w.ctx); err != nil {
		w.t.Fatalf("planning: %v", err)
	}
	recs := w.records()
	if len(recs) != 1 {
		w.t.Fatalf("%d VM records after the planner's pass, want 1: %v", len(recs), recordNames(recs))
	}
	return recs[0]
}

// reconcile runs the owner once over the record name, as a watch event of it does.
func (w *vmWorld) reconcile(o *Owner, name string) (reconcile.Result, error) {
	return o.Reconcile(w.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: vmNS, Name: name}})
}

// mustReconcile is reconcile for a pass that must not fail.
func (w *vmWorld) mustReconcile(o *Owner, name string) reconcile.Result {
	w.t.Helper()
	res, err := w.reconcile(o, name)
	if err != nil {
		w.t.Fatalf("reconciling %s: %v", name, err)
	}
	return res
}

// record reads the record name; nil once it is gone.
func (w *vmWorld) record(name string) *berthv1.BuildHost {
	w.t.Helper()
	var rec berthv1.BuildHost
	err := w.api.Get(w.ctx, types.NamespacedName{Namespace: vmNS, Name: name}, &rec)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return &rec
}

// readyVM takes a VM from the queue's demand to ready: a record, a launch, a first login.
func (w *vmWorld) readyVM(o *Owner) *berthv1.BuildHost {
	w.t.Helper()
	name := w.plan(o).Name
	w.mustReconcile(o, name)
	rec := w.record(name)
	if rec == nil || rec.Status.Instance == nil || rec.Status.Instance.Phase != berthv1.InstanceReady {
		w.t.Fatalf("the VM is not ready after its launch: %+v", rec)
	}
	return rec
}

// terminated asserts that the VM name is gone for good: no record, no instance alive, the
// cleans owed to it forgotten once, out of the ledger, no login kept, and one Terminated
// Event, which says why when why is not empty.
func (w *vmWorld) terminated(o *Owner, name, why string) {
	w.t.Helper()
	if rec := w.record(name); rec != nil {
		w.t.Fatalf("the terminated VM's record stays: %+v, %+v", rec.Spec.Instance, rec.Status.Instance)
	}
	if alive := w.cloud.Alive(); len(alive) != 0 {
		w.t.Errorf("instances still running: %+v", alive)
	}
	if got := w.debts.forgotten(); !slices.Equal(got, []string{name}) {
		w.t.Errorf("hosts forgotten: %v, want [%s]", got, name)
	}
	if occ := o.Capacity.HostOccupancy(name); occ.Known {
		w.t.Errorf("the ledger still knows the VM: %+v", occ)
	}
	if _, ok := o.Login(name); ok {
		w.t.Error("berth still has a login for the terminated VM")
	}
	if ev := w.events.on(name, "Terminated"); len(ev) != 1 || !strings.Contains(ev[0].note, why) {
		w.t.Errorf("Terminated events: %+v, want one saying %q", ev, why)
	}
}

func recordNames(recs []berthv1.BuildHost) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Name)
	}
	return out
}

func phaseOf(rec *berthv1.BuildHost) berthv1.InstancePhase {
	if rec == nil || rec.Status.Instance == nil {
		return ""
	}
	return rec.Status.Instance.Phase
}

// readyCondition is the record's Ready condition, as kubectl shows it.
func readyCondition(t *testing.T, rec *berthv1.BuildHost) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(rec.Status.Conditions, berthv1.HostReady)
	if c == nil {
		t.Fatalf("record %s has no Ready condition: %+v", rec.Name, rec.Status.Conditions)
	}
	return c
}

// TestAWaitingTaskGetsAVMThatIsLaunchedBootedAndReady: a task waiting on a dynamic platform
// makes berth record one VM, launch it once, wait for it to boot, log in to it and pin its host
// key; the VM then takes the task, with the platform's slots, and its record says Ready.
func TestAWaitingTaskGetsAVMThatIsLaunchedBootedAndReady(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pooled bool
		slots  int
	}{
		{name: "dynamic", slots: 1},
		{name: "dynamic-pool", pooled: true, slots: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newVMWorld(t, tc.pooled)
			w.cloud.Pending = true // the VM boots until the test starts it
			o := w.owner(w.api)

			rec := w.plan(o)
			in := rec.Spec.Instance
			if in.Platform != vmPlatform || in.Provider != fakeCloudType || in.Slots != tc.slots || in.Pooled != tc.pooled ||
				in.Attempt != 1 || in.AdminUser != "builder" || in.AdminSecret != "vm-admin-key" {
				t.Fatalf("the planner recorded %+v", in)
			}
			if rec.Status.Instance != nil || w.cloud.Launches() != 0 {
				t.Fatalf("the planner launched before the VM loop: status %+v, %d launches", rec.Status.Instance, w.cloud.Launches())
			}

			// Launched, not yet running: booting, and nobody is let in.
			res := w.mustReconcile(o, rec.Name)
			if w.cloud.Launches() != 1 {
				t.Fatalf("%d launches, want 1", w.cloud.Launches())
			}
			booting := w.record(rec.Name)
			if phaseOf(booting) != berthv1.InstanceBooting || booting.Status.Instance.ID == "" {
				t.Fatalf("after the launch: %+v, want booting with the instance id", booting.Status.Instance)
			}
			if c := readyCondition(t, booting); c.Status != metav1.ConditionFalse || c.Reason != string(berthv1.InstanceBooting) {
				t.Errorf("a booting VM's Ready condition: %+v", c)
			}
			if res.RequeueAfter != checkInterval {
				t.Errorf("a booting VM is looked at again in %s, want the check interval %s", res.RequeueAfter, checkInterval)
			}
			if n := len(w.prober.tries()); n != 0 {
				t.Errorf("berth tried to log in %d times to a VM with no address", n)
			}
			if occ := o.Capacity.HostOccupancy(rec.Name); occ.Known {
				t.Errorf("a booting VM is in the ledger: %+v", occ)
			}
			// The booting VM answers for the waiting task: no second launch.
			if again := w.plan(o); again.Name != rec.Name {
				t.Fatalf("the planner recorded %s besides the booting %s", again.Name, rec.Name)
			}

			w.cloud.Start()
			w.clock.advance(42 * time.Second)
			w.mustReconcile(o, rec.Name)
			ready := w.record(rec.Name)
			st := ready.Status.Instance
			if st.Phase != berthv1.InstanceReady || st.HostKey != vmHostKey || ready.Status.Address != vmAddress ||
				st.ID != booting.Status.Instance.ID || st.ReadyAt == nil || !st.ReadyAt.Time.Equal(w.clock.Now()) {
				t.Fatalf("after the first login: address %q, %+v", ready.Status.Address, st)
			}
			if ready.Status.Platform != vmPlatform {
				t.Errorf("status.platform %q", ready.Status.Platform)
			}
			if c := readyCondition(t, ready); c.Status != metav1.ConditionTrue || c.Reason != "TakesTasks" {
				t.Errorf("a ready VM's Ready condition: %+v", c)
			}
			tries := w.prober.tries()
			if len(tries) != 1 || tries[0].Address != vmAddress || tries[0].AdminUser != "builder" || tries[0].AdminSecret != "vm-admin-key" || tries[0].HostKey != "" {
				t.Errorf("first logins: %+v; want one, to the VM as its admin, no key pinned yet", tries)
			}
			if w.cloud.Launches() != 1 || len(w.cloud.Alive()) != 1 {
				t.Errorf("%d launches, %d instances alive; want 1 and 1", w.cloud.Launches(), len(w.cloud.Alive()))
			}
			if len(w.events.on(rec.Name, "Launched")) != 1 || len(w.events.on(rec.Name, "Ready")) != 1 {
				t.Errorf("events: %+v; want one Launched and one Ready", w.events.events)
			}

			// In the ledger with its slots, and the waiting task gets it.
			if occ := o.Capacity.HostOccupancy(rec.Name); !occ.Known || !occ.Open || occ.Used != 0 {
				t.Fatalf("the ready VM in the ledger: %+v; want it open and free", occ)
			}
			if free := o.Capacity.FreeSlots(vmPlatform); free != tc.slots {
				t.Errorf("%d free slots on the platform, want %d", free, tc.slots)
			}
			login, ok := o.Login(rec.Name)
			if !ok || login.Address != vmAddress || login.HostKey != vmHostKey || login.Instance != st.ID {
				t.Errorf("the VM's login: %+v, %v", login, ok)
			}
			if g := o.Capacity.Acquire(allocation.Request{Task: w.task, Platform: vmPlatform}); g.Host != rec.Name {
				t.Errorf("the waiting task got %+v, want VM %s", g, rec.Name)
			}
		})
	}
}

// TestAVMIsLaunchedOnceEvenIfBerthRestartsMidLaunch: berth stops after it wrote a VM's record,
// or after the cloud made the instance but before its id was saved. The berth that starts next
// asks the cloud again with the same token and gets the same instance: one VM, never two, and
// the planner does not record another for the same task.
func TestAVMIsLaunchedOnceEvenIfBerthRestartsMidLaunch(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stop is the first berth's last act.
		stop func(w *vmWorld, first *Owner, name string)
		// launched is how many instances the cloud made before the restart.
		launched int
	}{
		{name: "after the record was written", launched: 0,
			stop: func(*vmWorld, *Owner, string) {}},
		{name: "after the cloud answered, before the answer was saved", launched: 1,
			stop: func(w *vmWorld, first *Owner, name string) {
				if _, err := w.reconcile(first, name); err == nil {
					w.t.Fatal("the launch went on though its status write failed")
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newVMWorld(t, false)
			// The first berth's status writes never land: it stops before each one.
			stopped := interceptor.NewClient(w.api, interceptor.Funcs{
				SubResourceUpdate: func(context.Context, client.Client, string, client.Object, ...client.SubResourceUpdateOption) error {
					return errors.New("berth stopped before it wrote the status")
				},
			})
			first := w.owner(stopped)
			name := w.plan(first).Name
			tc.stop(w, first, name)
			if got := w.cloud.Launches(); got != tc.launched {
				t.Fatalf("%d launches before the restart, want %d", got, tc.launched)
			}
			if rec := w.record(name); rec == nil || phaseOf(rec) != "" {
				t.Fatalf("the record before the restart: %+v; want it launching, no status", rec)
			}

			second := w.owner(w.api)
			if again := w.plan(second); again.Name != name {
				t.Fatalf("the restarted planner recorded %s besides %s", again.Name, name)
			}
			w.mustReconcile(second, name)
			rec := w.record(name)
			alive := w.cloud.Alive()
			if w.cloud.Launches() != 1 || len(alive) != 1 {
				t.Fatalf("%d launches, %d instances alive after the restart; want 1 and 1", w.cloud.Launches(), len(alive))
			}
			if phaseOf(rec) != berthv1.InstanceReady || rec.Status.Instance.ID != alive[0].ID || alive[0].Token != Token(rec) {
				t.Fatalf("the record holds %+v, the cloud %+v; want the one instance, ready, under the record's token", rec.Status.Instance, alive[0])
			}
		})
	}
}

// TestACloudRefusalEndsTheRecordAndTellsTheWaitingTask: a launch the cloud refuses for good
// (credentials, settings) is not retried: its record goes, no instance is left behind, the
// waiting task is told why without the cloud's own words, and the platform launches nothing
// more for a minute.
func TestACloudRefusalEndsTheRecordAndTellsTheWaitingTask(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	name := w.plan(o).Name
	refusal := &cloud.Error{Kind: cloud.Auth, Op: "launch", Err: errors.New(
		"EC2 answered UnauthorizedOperation: User: arn:aws:iam::123456789012:user/berth-launcher is not authorized to perform: ec2:RunInstances")}
	w.cloud.FailNext("launch", refusal)

	res := w.mustReconcile(o, name)
	if res.RequeueAfter != 0 {
		t.Errorf("a refused launch is retried in %s", res.RequeueAfter)
	}
	if rec := w.record(name); rec != nil {
		t.Fatalf("the refused VM's record stays: %+v", rec.Status.Instance)
	}
	if w.cloud.Launches() != 0 || len(w.cloud.Alive()) != 0 {
		t.Errorf("%d launches, %d instances alive after a refusal", w.cloud.Launches(), len(w.cloud.Alive()))
	}
	// The operator reads the cloud's answer on the record's Event.
	if ev := w.events.on(name, "LaunchFailed"); len(ev) != 1 || !strings.Contains(ev[0].note, "UnauthorizedOperation") {
		t.Errorf("LaunchFailed events: %+v", ev)
	}

	reason, msg, recheck := o.Unservable(vmPlatform, 0)
	if reason != "CloudRefused" || recheck != 0 {
		t.Fatalf("the waiting task is told %q (%q), recheck %s; want CloudRefused at once", reason, msg, recheck)
	}
	if !strings.Contains(msg, vmPlatform) || !strings.Contains(msg, cloud.Auth.String()) {
		t.Errorf("the task's message names neither the platform nor the kind: %s", msg)
	}
	for _, leak := range []string{"arn:aws", "123456789012", "UnauthorizedOperation"} {
		if strings.Contains(msg, leak) {
			t.Errorf("the task's message carries %q of the cloud's answer: %s", leak, msg)
		}
	}

	// The task still waits, but the platform is paused: no launch loop against a refusal.
	if err := o.planner.planAll(w.ctx); err != nil {
		t.Fatal(err)
	}
	if recs := w.records(); len(recs) != 0 {
		t.Fatalf("the planner recorded %v within a minute of a refusal", recordNames(recs))
	}
	// A minute on, it tries again; a launch that passes ends the trouble.
	w.clock.advance(time.Minute + time.Second)
	w.readyVM(o)
	if reason, msg, _ := o.Unservable(vmPlatform, 0); reason != "" {
		t.Errorf("after a launch passed the task is still told %q: %s", reason, msg)
	}
}

// TestALaunchWithoutCapacityIsRetriedUntilTheAllocationTimeout: a cloud out of capacity is
// asked again with growing backoff; the record stays and the waiting task is not failed
// before the allocation timeout. Past it, the record goes and the task learns the cloud had no
// capacity.
func TestALaunchWithoutCapacityIsRetriedUntilTheAllocationTimeout(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	name := w.plan(o).Name
	shortage := func() error {
		return &cloud.Error{Kind: cloud.Capacity, Op: "launch", Err: errors.New("InsufficientInstanceCapacity in us-east-1a")}
	}

	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		w.cloud.FailNext("launch", shortage())
		res := w.mustReconcile(o, name)
		rec := w.record(name)
		if rec == nil {
			t.Fatalf("failure %d: the record went before the allocation timeout", i+1)
		}
		if res.RequeueAfter != want || rec.Status.Instance.Failures != i+1 || (phaseOf(rec) != "" && phaseOf(rec) != berthv1.InstanceLaunching) {
			t.Fatalf("failure %d: retry in %s, status %+v; want %s, %d failures, still launching", i+1, res.RequeueAfter, rec.Status.Instance, want, i+1)
		}
		if c := readyCondition(t, rec); c.Status != metav1.ConditionFalse || c.Reason != string(berthv1.InstanceLaunching) || !strings.Contains(c.Message, "InsufficientInstanceCapacity") {
			t.Errorf("failure %d: the Ready condition does not say why: %+v", i+1, c)
		}
		w.clock.advance(res.RequeueAfter) // the retry is due
	}
	if reason, _, recheck := o.Unservable(vmPlatform, time.Minute); reason != "" || recheck != allocationTimeout-time.Minute {
		t.Errorf("a task that waited a minute is told %q, recheck %s; want nothing yet, recheck in %s", reason, recheck, allocationTimeout-time.Minute)
	}

	// Exactly at the timeout the launch is still tried; at its next retry, past it, it is
	// given up.
	w.clock.advance(w.record(name).CreationTimestamp.Add(allocationTimeout).Sub(w.clock.Now()))
	w.cloud.FailNext("launch", shortage())
	res := w.mustReconcile(o, name)
	if w.record(name) == nil {
		t.Fatal("the record went at the allocation timeout, not past it")
	}
	w.clock.advance(res.RequeueAfter)
	w.cloud.FailNext("launch", shortage())
	w.mustReconcile(o, name)
	if rec := w.record(name); rec != nil {
		t.Fatalf("the record stays past the allocation timeout: %+v", rec.Status.Instance)
	}
	if w.cloud.Launches() != 0 || w.cloud.Calls("launch") != 5 {
		t.Errorf("%d launches of %d calls; want none of 5 (3 backed off, at the timeout, past it)", w.cloud.Launches(), w.cloud.Calls("launch"))
	}
	if reason, msg, _ := o.Unservable(vmPlatform, allocationTimeout+time.Second); reason != "NoCapacity" {
		t.Errorf("a task that waited past the timeout is told %q: %s; want NoCapacity", reason, msg)
	}
}

// TestAVMBerthCannotLogInToIsTerminatedAfterTheAllocationTimeout: a VM that runs but never
// lets berth in stays booting (its record says why) until the allocation timeout from its
// launch; then it is terminated in the cloud, what was owed to it is forgotten, its record
// goes, and the planner launches another for the task still waiting.
func TestAVMBerthCannotLogInToIsTerminatedAfterTheAllocationTimeout(t *testing.T) {
	w := newVMWorld(t, false)
	w.prober.fail = errors.New("ssh: handshake failed: connection refused")
	o := w.owner(w.api)
	name := w.plan(o).Name

	res := w.mustReconcile(o, name)
	rec := w.record(name)
	if phaseOf(rec) != berthv1.InstanceBooting || !strings.Contains(rec.Status.Instance.Message, "waiting for SSH: ssh: handshake failed") {
		t.Fatalf("a VM that refuses SSH: %+v; want booting, saying it waits for SSH", rec.Status.Instance)
	}
	if c := readyCondition(t, rec); c.Status != metav1.ConditionFalse || c.Reason != string(berthv1.InstanceBooting) || !strings.Contains(c.Message, "waiting for SSH") {
		t.Errorf("its Ready condition: %+v", c)
	}
	if res.RequeueAfter != checkInterval {
		t.Errorf("looked at again in %s, want %s", res.RequeueAfter, checkInterval)
	}

	// Up to the allocation timeout from the launch, berth keeps trying.
	w.clock.advance(allocationTimeout)
	w.mustReconcile(o, name)
	if rec := w.record(name); phaseOf(rec) != berthv1.InstanceBooting {
		t.Fatalf("at the allocation timeout: %+v; want still booting", rec)
	}
	if len(w.cloud.Alive()) != 1 || len(w.debts.forgotten()) != 0 {
		t.Fatalf("at the allocation timeout: %d instances alive, hosts forgotten %v", len(w.cloud.Alive()), w.debts.forgotten())
	}

	w.clock.advance(time.Second)
	w.mustReconcile(o, name)
	if n := len(w.prober.tries()); n != 3 {
		t.Errorf("%d logins tried, want 3 (one per pass)", n)
	}
	w.terminated(o, name, "could not log in within the allocation timeout")

	if again := w.plan(o); again.Name == name {
		t.Errorf("no new VM for the task still waiting")
	}
}

// TestAServedVMIsTerminatedOnceItsTaskLetsGo: a single-use VM that served its task is retired
// in its record and kept while the task still holds it (its cleanup may still run there); once
// the task lets go, the planner terminates it, forgets what was owed to it, and drops it from
// the ledger and the records.
func TestAServedVMIsTerminatedOnceItsTaskLetsGo(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	name := w.readyVM(o).Name
	if g := o.Capacity.Acquire(allocation.Request{Task: w.task, Platform: vmPlatform}); g.Host != name {
		t.Fatalf("the task got %+v, want %s", g, name)
	}

	if err := o.Released(w.ctx, name); err != nil {
		t.Fatal(err)
	}
	rec := w.record(name)
	if rec.Spec.Instance.Retire == "" {
		t.Fatalf("the served VM is not retired in its record: %+v", rec.Spec.Instance)
	}
	// The ready VM's next pass brings its conditions in line with the retirement.
	w.mustReconcile(o, name)
	if c := readyCondition(t, w.record(name)); c.Status != metav1.ConditionFalse || c.Reason != "Retired" {
		t.Errorf("a retired VM's Ready condition: %+v", c)
	}

	// Held: kept.
	if err := o.planner.planAll(w.ctx); err != nil {
		t.Fatal(err)
	}
	if rec := w.record(name); phaseOf(rec) != berthv1.InstanceReady || len(w.cloud.Alive()) != 1 {
		t.Fatalf("a VM its task still holds: %+v, %d instances alive; want it kept", rec, len(w.cloud.Alive()))
	}

	o.Capacity.Release(w.task)
	if err := o.planner.planAll(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.terminated(o, name, "")
	// Nobody waits: nothing is launched in its place.
	if err := o.planner.planAll(w.ctx); err != nil {
		t.Fatal(err)
	}
	if recs := w.records(); len(recs) != 0 {
		t.Errorf("records after the termination: %v", recordNames(recs))
	}
}

// TestAVMLostWhileBootingIsLaunchedAgainUnderANewToken: an instance the cloud loses before it
// is ready is replaced under the record's next attempt, so the token never returns the lost
// one; after maxLaunchAttempts the record is given up.
func TestAVMLostWhileBootingIsLaunchedAgainUnderANewToken(t *testing.T) {
	w := newVMWorld(t, false)
	w.cloud.Pending = true
	o := w.owner(w.api)
	name := w.plan(o).Name
	w.mustReconcile(o, name)

	for attempt := 2; attempt <= maxLaunchAttempts; attempt++ {
		lost := w.record(name).Status.Instance.ID
		w.cloud.Vanish(lost)
		w.mustReconcile(o, name)
		rec := w.record(name)
		if rec.Spec.Instance.Attempt != attempt || phaseOf(rec) != berthv1.InstanceBooting || rec.Status.Instance.ID == lost {
			t.Fatalf("after instance %s was lost: attempt %d, %+v; want attempt %d booting a new instance", lost, rec.Spec.Instance.Attempt, rec.Status.Instance, attempt)
		}
		if w.cloud.Launches() != attempt {
			t.Fatalf("%d launches, want %d", w.cloud.Launches(), attempt)
		}
		if alive := w.cloud.Alive(); len(alive) != 1 || alive[0].Token != Token(rec) {
			t.Fatalf("instances alive: %+v; want the one of token %s", alive, Token(rec))
		}
	}

	w.cloud.Vanish(w.record(name).Status.Instance.ID)
	w.mustReconcile(o, name)
	if rec := w.record(name); rec != nil {
		t.Fatalf("after %d lost instances the record stays: %+v", maxLaunchAttempts, rec.Status.Instance)
	}
	if w.cloud.Launches() != maxLaunchAttempts {
		t.Errorf("%d launches, want %d", w.cloud.Launches(), maxLaunchAttempts)
	}
	if got := len(w.events.on(name, "InstanceLost")); got != maxLaunchAttempts {
		t.Errorf("%d InstanceLost events, want %d", got, maxLaunchAttempts)
	}
}

// TestAVMWhoseStateTheCloudNeverTellsIsTerminatedAfterTheAllocationTimeout: while the VM boots,
// the cloud answers every question about it with an error that may pass. Berth keeps asking
// up to the allocation timeout, then ends the VM, so that it holds no place under
// max-instances for good.
func TestAVMWhoseStateTheCloudNeverTellsIsTerminatedAfterTheAllocationTimeout(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	name := w.plan(o).Name
	for range 3 {
		w.cloud.FailNext("get", cloud.Errorf(cloud.Throttled, "get", "RequestLimitExceeded"))
	}
	w.mustReconcile(o, name) // launches; its first look at the instance fails
	if rec := w.record(name); phaseOf(rec) != berthv1.InstanceBooting {
		t.Fatalf("after the launch: %+v; want booting", rec.Status.Instance)
	}
	w.clock.advance(allocationTimeout)
	w.mustReconcile(o, name)
	if rec := w.record(name); phaseOf(rec) != berthv1.InstanceBooting {
		t.Fatalf("at the allocation timeout: %+v; want still booting", rec.Status.Instance)
	}
	w.clock.advance(time.Second)
	w.mustReconcile(o, name)
	w.terminated(o, name, "did not tell its state within the allocation timeout")
}

// TestABootingRecordWithoutALaunchTimeCountsFromItsCreation: a booting record whose status
// lost its launch time (an edit by hand, a record of an older berth) is timed from the
// record's creation, rather than stopping the VM loop.
func TestABootingRecordWithoutALaunchTimeCountsFromItsCreation(t *testing.T) {
	w := newVMWorld(t, false)
	w.prober.fail = errors.New("ssh: connect: connection refused")
	o := w.owner(w.api)
	name := w.plan(o).Name
	w.mustReconcile(o, name)
	rec := w.record(name)
	rec.Status.Instance.LaunchedAt = nil
	if err := w.api.Status().Update(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	w.mustReconcile(o, name)
	if rec := w.record(name); phaseOf(rec) != berthv1.InstanceBooting {
		t.Fatalf("a record without its launch time: %+v; want still booting", rec.Status.Instance)
	}
	w.clock.advance(allocationTimeout + time.Second)
	w.mustReconcile(o, name)
	if rec := w.record(name); rec != nil {
		t.Errorf("past the allocation timeout from its creation the record stays: %+v", rec.Status.Instance)
	}
}

// TestAVMSomeoneStoppedIsTerminatedAndCountedLost: a ready VM stopped in the console serves
// no task and is still billed. Berth takes it out of service, terminates it (retrying a
// refused Terminate from the record), counts it lost, and keeps nothing of it.
func TestAVMSomeoneStoppedIsTerminatedAndCountedLost(t *testing.T) {
	w := newVMWorld(t, false)
	o := w.owner(w.api)
	rec := w.readyVM(o)
	name, id := rec.Name, rec.Status.Instance.ID
	if g := o.Capacity.Acquire(allocation.Request{Task: w.task, Platform: vmPlatform}); g.Host != name {
		t.Fatalf("the task got %+v, want %s", g, name)
	}
	lostBefore := testutil.ToFloat64(lost.WithLabelValues(vmPlatform))

	w.cloud.Stop(id)
	w.cloud.FailNext("terminate", cloud.Errorf(cloud.Transient, "terminate", "the API timed out"))
	res := w.mustReconcile(o, name)
	rec = w.record(name)
	if rec == nil || phaseOf(rec) != berthv1.InstanceTerminating || !strings.Contains(rec.Spec.Instance.Retire, "stopped") {
		t.Fatalf("after a refused Terminate of the stopped VM: %+v; want it terminating, the reason in its spec", rec)
	}
	if res.RequeueAfter <= 0 {
		t.Errorf("a refused Terminate is not retried: %+v", res)
	}
	if alive := w.cloud.Alive(); len(alive) != 1 || alive[0].State != cloud.StateStopped {
		t.Fatalf("instances: %+v; want the stopped one, still there", alive)
	}
	other := allocation.Task{Namespace: "tenant", Name: "build-2"}
	if g := o.Capacity.Acquire(allocation.Request{Task: other, Platform: vmPlatform}); g.Host == name {
		t.Fatalf("a new task was given the stopped VM: %+v", g)
	}

	w.clock.advance(res.RequeueAfter)
	w.mustReconcile(o, name)
	w.terminated(o, name, "was stopped while it was ready")
	if ev := w.events.on(name, "InstanceStopped"); len(ev) != 1 || !strings.Contains(ev[0].note, id) {
		t.Errorf("InstanceStopped events: %+v; want one naming %s", ev, id)
	}
	if got := testutil.ToFloat64(lost.WithLabelValues(vmPlatform)) - lostBefore; got != 1 {
		t.Errorf("lost counted %v times, want once", got)
	}
}

// TestAVMStoppedWhileBootingIsTerminatedAndItsTaskGetsAnother: the stopped instance is ended,
// and the planner launches a new one for the task still waiting.
func TestAVMStoppedWhileBootingIsTerminatedAndItsTaskGetsAnother(t *testing.T) {
	w := newVMWorld(t, false)
	w.cloud.Pending = true
	o := w.owner(w.api)
	first := w.plan(o).Name
	w.mustReconcile(o, first)
	stoppedID := w.record(first).Status.Instance.ID
	w.cloud.Stop(stoppedID)

	w.mustReconcile(o, first)
	w.terminated(o, first, "was stopped while it booted")
	next := w.plan(o)
	if next.Name == first {
		t.Fatalf("the stopped VM's record %s came back", first)
	}
	w.cloud.Pending = false
	w.mustReconcile(o, next.Name)
	if rec := w.record(next.Name); phaseOf(rec) != berthv1.InstanceReady || rec.Status.Instance.ID == stoppedID {
		t.Fatalf("the new VM: %+v; want a ready one other than %s", rec.Status.Instance, stoppedID)
	}
	if g := o.Capacity.Acquire(allocation.Request{Task: w.task, Platform: vmPlatform}); g.Host != next.Name {
		t.Fatalf("the waiting task got %+v, want %s", g, next.Name)
	}
}

// TestMaxAgeSparesAVMWithinItsHardwaresMinimumLife: a pooled VM whose hardware is billed for a
// minimum time (an EC2 Mac's dedicated host: 24 hours) is not retired at max-age before then,
// which would only pay for another host and another long boot; after it, max-age holds.
func TestMaxAgeSparesAVMWithinItsHardwaresMinimumLife(t *testing.T) {
	w := newVMWorld(t, true) // max-age 60 minutes
	w.cloud.MinLife = 24 * time.Hour
	o := w.owner(w.api)
	name := w.readyVM(o).Name

	w.clock.advance(2 * time.Hour)
	if err := o.planner.planAll(w.ctx); err != nil {
		t.Fatal(err)
	}
	if rec := w.record(name); rec == nil || rec.Spec.Instance.Retire != "" || phaseOf(rec) != berthv1.InstanceReady {
		t.Fatalf("two hours in, past max-age but within its minimum life: %+v; want it kept", rec)
	}

	w.clock.advance(23 * time.Hour)
	if err := o.planner.planAll(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.terminated(o, name, "older than max-age")
}

// TestACapacityErrorOnTheFirstTypeIsServedByTheFallbackType: the platform lists a fallback
// instance type; the first type has no capacity, so the launch moves to the fallback at once,
// under a token of its own, the record says which type served, and an Event says why the
// first was skipped. When every type is out, the launch waits out the backoff from the first.
func TestACapacityErrorOnTheFirstTypeIsServedByTheFallbackType(t *testing.T) {
	w := newVMWorld(t, false)
	w.cloud.Types = []string{"mac2.metal", "mac2-m2.metal"}
	o := w.owner(w.api)
	noRoom := cloud.Errorf(cloud.Capacity, "launch", "InsufficientInstanceCapacity: no mac2.metal in us-east-1a")
	w.cloud.FailNext("launch", noRoom)
	name := w.plan(o).Name
	w.mustReconcile(o, name)

	rec := w.record(name)
	if rec.Spec.Instance.Fallback != 1 || phaseOf(rec) != berthv1.InstanceReady || rec.Status.Instance.InstanceType != "mac2-m2.metal" {
		t.Fatalf("after no capacity for the first type: fallback %d, %+v; want the fallback type ready", rec.Spec.Instance.Fallback, rec.Status.Instance)
	}
	if got := w.cloud.TypeOf(rec.Status.Instance.ID); got != "mac2-m2.metal" {
		t.Errorf("the cloud launched %q", got)
	}
	if !strings.HasSuffix(Token(rec), "-f1") || w.cloud.Launches() != 1 {
		t.Errorf("token %s, %d launches; want a token of the fallback's own and one launch", Token(rec), w.cloud.Launches())
	}
	if ev := w.events.on(name, "LaunchFallback"); len(ev) != 1 || !strings.Contains(ev[0].note, "mac2.metal had no capacity") || !strings.Contains(ev[0].note, "launching mac2-m2.metal") {
		t.Errorf("LaunchFallback events: %+v", ev)
	}

	// Both types out: back to the first, after the backoff.
	t.Run("every type out", func(t *testing.T) {
		w2 := newVMWorld(t, false)
		w2.cloud.Types = []string{"mac2.metal", "mac2-m2.metal"}
		o2 := w2.owner(w2.api)
		w2.cloud.FailNext("launch", noRoom)
		w2.cloud.FailNext("launch", noRoom)
		name2 := w2.plan(o2).Name
		res := w2.mustReconcile(o2, name2)
		rec2 := w2.record(name2)
		if rec2.Spec.Instance.Fallback != 0 || phaseOf(rec2) != berthv1.InstanceLaunching || res.RequeueAfter <= 0 || w2.cloud.Launches() != 0 {
			t.Fatalf("with no capacity for either type: fallback %d, %+v, %+v; want a retry of the first type after a backoff", rec2.Spec.Instance.Fallback, rec2.Status.Instance, res)
		}
		w2.clock.advance(res.RequeueAfter)
		w2.mustReconcile(o2, name2)
		if rec2 = w2.record(name2); phaseOf(rec2) != berthv1.InstanceReady || rec2.Status.Instance.InstanceType != "mac2.metal" {
			t.Fatalf("the retry: %+v; want the first type ready", rec2.Status.Instance)
		}
	})
}

// TestWithoutVMPlatformsThePlannerListsOnlyWhileVMsAreLeft: the planner reads the VM records
// from the apiserver at each pass (every 5 s), so that it counts its own last writes. When the
// config has no VM platform it launches nothing: it reads them only while records are left to
// retire, a VM of a platform gone from the config going as before.
func TestWithoutVMPlatformsThePlannerListsOnlyWhileVMsAreLeft(t *testing.T) {
	w := newVMWorld(t, false)
	lists := 0
	counted := interceptor.NewClient(w.api, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*berthv1.BuildHostList); ok {
				lists++
			}
			return c.List(ctx, list, opts...)
		},
	})
	ledger := capacity.New()
	ledger.MarkRestored()
	o := &Owner{Client: w.api, APIReader: counted, Namespace: vmNS, Config: w.store, Capacity: ledger,
		Recorder: w.events, Debts: w.debts, Prober: w.prober, Now: w.clock.Now}
	o.init()
	ledger.Join(allocation.Request{Task: w.task, Platform: vmPlatform, Created: w.clock.Now()})
	launched := w.plan(o)

	// The platform leaves the config: its VM goes.
	static, problems := config.Parse(map[string]string{"local-platforms": "linux/amd64"})
	if len(static.Fatal()) > 0 {
		t.Fatalf("a config of a local platform: %v", problems)
	}
	w.store.Apply(static)
	before := lists
	if err := o.planner.planAll(w.ctx); err != nil {
		t.Fatal(err)
	}
	if lists == before {
		t.Fatal("a VM record is left, and the planner did not read the records")
	}
	// Still launching, it goes with its record at once; a VM further on is retired first.
	if rec := w.record(launched.Name); rec != nil {
		if rec.Spec.Instance.Retire == "" && phaseOf(rec) != berthv1.InstanceTerminating {
			t.Fatalf("the VM of a platform gone from the config is kept: %+v", rec)
		}
		if err := w.api.Delete(w.ctx, rec); err != nil { // as the VM loop does once it is gone
			t.Fatal(err)
		}
	}

	// No VM record is left: passes list nothing.
	before = lists
	for range 3 {
		if err := o.planner.planAll(w.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if lists != before {
		t.Fatalf("no VM platform and no VM record, and three passes listed the records %d times", lists-before)
	}
}
