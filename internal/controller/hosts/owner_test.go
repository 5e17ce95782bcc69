package hosts

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/fleet"
	"github.com/berth-ci/berth/internal/hostconfig"
)

type noDebts struct{}

func (noDebts) ForgetHost(context.Context, string) error { return nil }

func (noDebts) RetryCleans(context.Context, string) error { return nil }

// restoredCapacity is an empty ledger, as after a start that found no records.
func restoredCapacity() *capacity.Capacity {
	c := capacity.New()
	c.MarkRestored()
	return c
}

// TestARetiredVMIsTerminatedAfterARestart: a controller that restarts finds a VM retired
// before the crash (a single-use VM that served its task, a pool VM past max-age), its
// record ready. Once no task holds it, the planner terminates it, rather than taking it for
// one still booting and keeping it, and its slot of max-instances, for good.
func TestARetiredVMIsTerminatedAfterARestart(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		pooled bool
		// holder still holds the VM when the controller starts (its record says so).
		holder bool
	}{
		{name: "single-use, its task's record gone", pooled: false},
		{name: "single-use, its task's cleanup still owed", pooled: false, holder: true},
		{name: "pooled, its last task still running", pooled: true, holder: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &berthv1.BuildHost{
				ObjectMeta: metav1.ObjectMeta{Name: "vm-linux-s390x-abcde", Namespace: "berth-system"},
				Spec: berthv1.BuildHostSpec{Instance: &berthv1.InstanceSpec{Platform: "linux/s390x", Provider: "local-vm",
					Slots: 1, Pooled: tc.pooled, Attempt: 1, Retire: "retired before the crash"}},
				Status: berthv1.BuildHostStatus{Platform: "linux/s390x", Address: "198.18.1.2",
					Instance: &berthv1.InstanceStatus{Phase: berthv1.InstanceReady, ID: "vm-1", ReadyAt: &berthv1.MicroTime{MicroTime: metav1.MicroTime{Time: now.Add(-time.Minute)}}}},
			}
			if tc.pooled {
				rec.Spec.Instance.Slots = 4
			}
			ledger := capacity.New()
			ledger.MarkRestored()
			task := allocation.Task{Namespace: "ns", Name: "build"}
			if tc.holder {
				ledger.Restore(task, rec.Name, "linux/s390x") // the tasks' records are read first
			}
			f := &Owner{Config: hostconfig.NewStore(), Capacity: ledger, Debts: noDebts{}}
			f.init()
			f.readyVMs.open(rec) // the fleet's restore, or the VM loop's next pass over the ready record
			platform := fleet.Platform{MaxInstances: 2, SlotsPerVM: rec.Spec.Instance.Slots, Pooled: tc.pooled}
			if tc.holder {
				if d := fleet.Plan(platform, []fleet.VM{f.planner.snapshot(rec)}, now); len(d.Terminate) != 0 {
					t.Fatalf("terminating %v while a task holds it", d.Terminate)
				}
				ledger.Release(task)
			}
			d := fleet.Plan(platform, []fleet.VM{f.planner.snapshot(rec)}, now)
			if len(d.Terminate) != 1 || d.Terminate[0].Name != rec.Name {
				t.Errorf("the plan for the free retired VM: %+v; want it terminated", d)
			}
		})
	}
}

// TestNothingIsDecidedBeforeTheConfigIsRead: a restarted controller's VM loop may run before
// its config is loaded. It then waits, rather than taking every platform for unconfigured and
// giving up the launches under way as refused for good. (The fleet has no client here: any
// decision would fail the test by touching it.)
func TestNothingIsDecidedBeforeTheConfigIsRead(t *testing.T) {
	f := &Owner{Config: hostconfig.NewStore(), Capacity: restoredCapacity(), Debts: noDebts{}}
	f.init()
	res, err := f.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "berth-system", Name: "vm-linux-s390x-abcde"}})
	if err != nil || res.RequeueAfter <= 0 {
		t.Fatalf("before the config is read: %+v, %v; want a retry soon and no error", res, err)
	}
}

// TestOutdatedVMStaysClosed: once the platform's settings change, a ready VM launched with
// the old ones takes no new task, neither at the change nor when the VM loop opens it again
// before the planner has retired it in its record.
func TestOutdatedVMStaysClosed(t *testing.T) {
	settings := func(endpoint string) map[string]string {
		return map[string]string{
			"dynamic-pool-platforms": "linux/s390x", "dynamic.linux-s390x.type": "local-vm",
			"dynamic.linux-s390x.endpoint": endpoint, "dynamic.linux-s390x.secret": "cloud",
			"dynamic.linux-s390x.ssh-secret": "ssh", "dynamic.linux-s390x.max-instances": "2",
			"dynamic.linux-s390x.concurrency": "2", "dynamic.linux-s390x.max-age": "60",
		}
	}
	parse := func(endpoint string) *config.Config {
		cfg, _ := config.Parse(settings(endpoint))
		if !cfg.Usable("linux/s390x") {
			t.Fatalf("the test's platform is not usable: %v", cfg.Fatal())
		}
		return cfg
	}
	old := parse("http://127.0.0.1:1")
	store := hostconfig.NewStore()
	store.Apply(old)
	rec := &berthv1.BuildHost{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-linux-s390x-abcde", Namespace: "berth-system"},
		Spec: berthv1.BuildHostSpec{Instance: &berthv1.InstanceSpec{Platform: "linux/s390x", Provider: "local-vm",
			Settings: old.Dynamic["linux/s390x"].Settings, Slots: 2, Pooled: true, Attempt: 1}},
		Status: berthv1.BuildHostStatus{Platform: "linux/s390x", Address: "198.18.1.2",
			Instance: &berthv1.InstanceStatus{Phase: berthv1.InstanceReady, ID: "vm-1"}},
	}
	f := &Owner{Config: store, Capacity: restoredCapacity(), Debts: noDebts{}}
	f.init()
	f.readyVMs.open(rec)
	if occ := f.Capacity.HostOccupancy(rec.Name); !occ.Known || occ.Retired {
		t.Fatalf("a current VM: %+v; want it open", occ)
	}
	next := parse("http://127.0.0.1:2")
	store.Apply(next)
	f.configChanged(next)
	if occ := f.Capacity.HostOccupancy(rec.Name); !occ.Retired {
		t.Fatalf("after the settings changed: %+v; want it closed", occ)
	}
	f.readyVMs.open(rec) // the VM loop's next pass, before the planner wrote the retirement
	if occ := f.Capacity.HostOccupancy(rec.Name); !occ.Retired {
		t.Fatalf("opened again while outdated: %+v", occ)
	}
}
