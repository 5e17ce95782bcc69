package vms

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/fleet"
	"github.com/berth-ci/berth/internal/warning"
)

// NeedLeaderElection: one planner per cluster, or two would launch for the same queue.
func (f *Fleet) NeedLeaderElection() bool { return true }

// Start runs the planner and the sweeper until ctx ends. Decisions are taken in this one
// goroutine, one platform at a time, counting every record read from the apiserver: launches
// never race each other, and max-instances holds across restarts.
func (f *Fleet) Start(ctx context.Context) error {
	f.init()
	log := logr.FromContextOrDiscard(ctx).WithName("vms")
	interval, sweepEvery := f.PlanInterval, f.SweepInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	if sweepEvery <= 0 {
		sweepEvery = time.Minute
	}
	// Decide nothing before the ledger knows who holds and who waits for what.
	for !f.Capacity.Restored() {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := f.restore(ctx); err != nil && ctx.Err() == nil {
		log.Error(err, "restoring VMs")
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	lastSweep := time.Time{}
	for {
		if err := f.planAll(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "planning VMs")
		}
		if time.Since(lastSweep) >= sweepEvery {
			lastSweep = time.Now()
			if err := f.Sweep(ctx); err != nil && ctx.Err() == nil {
				log.Error(err, "sweeping for leaked instances")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-f.kick:
		case <-tick.C:
		}
	}
}

// restore puts the ready VMs of the records into the ledger.
func (f *Fleet) restore(ctx context.Context) error {
	records, err := f.records(ctx)
	if err != nil {
		return err
	}
	for _, rec := range records {
		if rec.Status.Instance != nil && rec.Status.Instance.Phase == berthv1.InstanceReady {
			f.open(rec)
		}
	}
	return nil
}

// records lists every VM record, from the apiserver: the planner must count its own last
// writes, which the cache may not show yet.
func (f *Fleet) records(ctx context.Context) ([]*berthv1.BuildHost, error) {
	var list berthv1.BuildHostList
	if err := f.APIReader.List(ctx, &list, client.InNamespace(f.Namespace), client.HasLabels{LabelVM}); err != nil {
		return nil, err
	}
	out := make([]*berthv1.BuildHost, 0, len(list.Items))
	for i := range list.Items {
		if list.Items[i].Spec.Instance != nil {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// LabelVM marks VM records, so they can be listed apart from static hosts' records.
const LabelVM = "berth.dev/vm-platform"

// planAll plans every dynamic platform, and retires VMs of platforms no longer configured.
func (f *Fleet) planAll(ctx context.Context) error {
	cfg := f.Config.Config()
	if cfg == nil {
		return nil
	}
	records, err := f.records(ctx)
	if err != nil {
		return err
	}
	byPlatform := map[string][]*berthv1.BuildHost{}
	for _, rec := range records {
		byPlatform[rec.Spec.Instance.Platform] = append(byPlatform[rec.Spec.Instance.Platform], rec)
	}
	var firstErr error
	note := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, p := range slices.Sorted(maps.Keys(cfg.Dynamic)) {
		d := cfg.Dynamic[p]
		note(f.plan(ctx, string(p), fleet.Platform{
			MaxInstances: d.MaxInstances, SlotsPerVM: d.SlotsPerVM(), MinIdle: d.MinIdle, MaxAge: d.VMMaxAge(),
			Pooled: d.Pool != nil, Queued: len(f.Capacity.Waiters(string(p))), Paused: f.paused(string(p)),
		}, byPlatform[string(p)], d))
		delete(byPlatform, string(p))
	}
	// A platform gone from the config (or no longer dynamic) launches nothing; its VMs go.
	for _, p := range slices.Sorted(maps.Keys(byPlatform)) {
		note(f.plan(ctx, p, fleet.Platform{Removed: true}, byPlatform[p], nil))
	}
	return firstErr
}

// plan carries out the fleet's decision for one platform (d is nil for a removed one).
func (f *Fleet) plan(ctx context.Context, platform string, p fleet.Platform, recs []*berthv1.BuildHost, d *config.DynamicPlatform) error {
	vms := make([]fleet.VM, 0, len(recs))
	byName := map[string]*berthv1.BuildHost{}
	for _, rec := range recs {
		byName[rec.Name] = rec
		vm := f.snapshot(rec)
		vm.Outdated = d != nil && outdated(rec.Spec.Instance, d)
		vms = append(vms, vm)
	}
	decision := fleet.Plan(p, vms, f.now())
	vmCount.WithLabelValues(platform).Set(float64(len(recs)))
	for _, r := range decision.Retire {
		if err := f.retire(ctx, byName[r.Name], r.Reason); err != nil {
			return err
		}
	}
	for _, r := range decision.Terminate {
		rec := byName[r.Name]
		reason := cmp.Or(r.Reason, rec.Spec.Instance.Retire, "it served its task")
		// The decision was taken on a snapshot: close the VM first, then terminate it only if
		// no task took it meanwhile (a retired VM goes on a later pass, once free).
		f.Capacity.RetireHost(rec.Name)
		if f.Capacity.HostOccupancy(rec.Name).Used > 0 {
			if err := f.retire(ctx, rec, reason); err != nil {
				return err
			}
			continue
		}
		if _, err := f.startTerminating(ctx, rec, reason); err != nil {
			if apierrors.IsConflict(err) {
				// Written meanwhile (by the VM loop): the next pass decides again on a fresh
				// read, and nothing is launched in the place of a VM not yet terminating.
				f.Kick()
				return nil
			}
			return client.IgnoreNotFound(err)
		}
	}
	for range decision.Launch {
		if err := f.record(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

// outdated: the VM was launched with other provider settings than the platform has now.
// Records written before berth kept the settings are taken as current.
func outdated(in *berthv1.InstanceSpec, d *config.DynamicPlatform) bool {
	return in.Settings != nil && (in.Provider != d.Type || !maps.Equal(in.Settings, d.Settings))
}

// snapshot is how the planner sees a VM: its record's phase and the ledger's occupancy.
func (f *Fleet) snapshot(rec *berthv1.BuildHost) fleet.VM {
	in, st := rec.Spec.Instance, rec.Status.Instance
	vm := fleet.VM{Name: rec.Name, Slots: in.Slots, Retired: in.Retire != "", SingleUse: !in.Pooled}
	phase := berthv1.InstanceLaunching
	if st != nil {
		phase = st.Phase
		if st.ReadyAt != nil {
			vm.ReadyAt = st.ReadyAt.Time
		}
	}
	switch phase {
	case berthv1.InstanceBooting:
		vm.Phase = fleet.Booting
	case berthv1.InstanceTerminating:
		vm.Phase = fleet.Terminating
	case berthv1.InstanceReady:
		vm.Phase = fleet.Ready
		occ := f.Capacity.HostOccupancy(rec.Name)
		if !occ.Known {
			// Ready in the record but not yet in the ledger: the VM loop is about to open it.
			// Until then it counts as booting, so it is neither launched again nor culled.
			vm.Phase = fleet.Booting
		}
		vm.Used, vm.Retired = occ.Used, vm.Retired || occ.Retired
	}
	return vm
}

// retire stops a VM taking new tasks, in its record and in the ledger (a later pass terminates
// it once free).
func (f *Fleet) retire(ctx context.Context, rec *berthv1.BuildHost, reason string) error {
	if rec.Spec.Instance.Retire != "" {
		return nil
	}
	next := rec.DeepCopy()
	next.Spec.Instance.Retire = reason
	if err := f.Client.Update(ctx, next); err != nil {
		return client.IgnoreNotFound(err)
	}
	f.Capacity.RetireHost(rec.Name)
	f.event(next, corev1.EventTypeNormal, "Retired", "takes no new tasks: %s", reason)
	f.Kick()
	return nil
}

// record writes the intent to launch one VM of the platform; the VM loop launches it.
func (f *Fleet) record(ctx context.Context, d *config.DynamicPlatform) error {
	if now := f.dynamic(d.Platform); now == nil || now.Type != d.Type || !maps.Equal(now.Settings, d.Settings) {
		return nil // the config changed since this pass read it: the pass it kicked decides
	}
	p, err := f.provider(string(d.Platform))
	if err != nil {
		// No record to put an Event on: the log line is where the operator finds ref.
		ref := f.noteTrouble(string(d.Platform), err)
		warning.Log(vmLog, fmt.Sprintf("cannot launch VMs for platform %s (%s): %v", d.Platform, ref, err), "platform", d.Platform, "ref", ref)
		return nil
	}
	label := d.Platform.Label()
	rec := &berthv1.BuildHost{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "vm-" + strings.ToLower(label) + "-", Namespace: f.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "berth", LabelVM: label},
		},
		Spec: berthv1.BuildHostSpec{Instance: &berthv1.InstanceSpec{
			Platform: string(d.Platform), Provider: d.Type, Settings: maps.Clone(d.Settings),
			Slots: d.SlotsPerVM(), Pooled: d.Pool != nil, Attempt: 1,
			AdminUser: p.AdminUser(), AdminSecret: d.SSHSecret,
		}},
	}
	// A create writes no status: a record without one is launching, and the VM loop's first
	// status write (the cloud's answer) is its first.
	return f.Client.Create(ctx, rec)
}
