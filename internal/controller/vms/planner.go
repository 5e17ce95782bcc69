package vms

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/fleet"
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
	for !f.Tasks.Restored() {
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
	f.mu.Lock()
	f.restored = true
	f.mu.Unlock()
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
	for _, p := range slices.Sorted(maps.Keys(cfg.Dynamic)) {
		if err := f.plan(ctx, cfg.Dynamic[p], byPlatform[string(p)]); err != nil && firstErr == nil {
			firstErr = err
		}
		delete(byPlatform, string(p))
	}
	// A platform gone from the config (or no longer dynamic) launches nothing; its idle VMs go.
	for _, recs := range byPlatform {
		for _, rec := range recs {
			if err := f.retireGone(ctx, rec); err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	return firstErr
}

// plan carries out the fleet's decision for one platform.
func (f *Fleet) plan(ctx context.Context, d *config.DynamicPlatform, recs []*berthv1.BuildHost) error {
	platform := string(d.Platform)
	var vms []fleet.VM
	byName := map[string]*berthv1.BuildHost{}
	for _, rec := range recs {
		byName[rec.Name] = rec
		vms = append(vms, f.snapshot(rec))
	}
	decision := fleet.Plan(fleet.Platform{
		MaxInstances: d.MaxInstances, SlotsPerVM: d.SlotsPerVM(), MinIdle: d.MinIdle, MaxAge: d.VMMaxAge(),
		Pooled: d.Pool != nil, Queued: len(f.Ledger.Waiters(platform)), Paused: f.paused(platform),
	}, vms, f.now())
	vmCount.WithLabelValues(platform).Set(float64(len(recs)))
	terminate := map[string]bool{}
	for _, name := range decision.Terminate {
		terminate[name] = true
	}
	for _, r := range decision.Retire {
		if terminate[r.Name] {
			continue
		}
		if _, err := f.retire(ctx, byName[r.Name], r.Reason); err != nil {
			return err
		}
	}
	for _, name := range decision.Terminate {
		reason := byName[name].Spec.Instance.Retire
		for _, r := range decision.Retire {
			if r.Name == name {
				reason = r.Reason
			}
		}
		if reason == "" {
			reason = "it served its task"
		}
		// The decision was taken on a snapshot: close the VM first, then terminate it only if
		// no task took it meanwhile (a retired VM goes on a later pass, once free).
		f.Ledger.RetireHost(name)
		if occ := f.Ledger.HostOccupancy(name); occ.Used > 0 {
			if _, err := f.retire(ctx, byName[name], reason); err != nil {
				return err
			}
			continue
		}
		if _, err := f.startTerminating(ctx, byName[name], reason); err != nil {
			return err
		}
	}
	for range decision.Launch {
		if err := f.record(ctx, d); err != nil {
			return err
		}
	}
	return nil
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
		occ := f.Ledger.HostOccupancy(rec.Name)
		if !occ.Known {
			// Ready in the record but not yet in the ledger: the VM loop is about to open it.
			// Until then it counts as booting, so it is neither launched again nor culled.
			vm.Phase = fleet.Booting
		}
		vm.Used, vm.Retired = occ.Used, vm.Retired || occ.Retired
	}
	return vm
}

// retire stops a VM taking new tasks (it is terminated by a later pass once free).
func (f *Fleet) retire(ctx context.Context, rec *berthv1.BuildHost, reason string) (bool, error) {
	if rec.Spec.Instance.Retire != "" {
		return false, nil
	}
	next := rec.DeepCopy()
	next.Spec.Instance.Retire = reason
	if err := f.Client.Update(ctx, next); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	f.Ledger.RetireHost(rec.Name)
	f.event(next, corev1.EventTypeNormal, "Retired", "takes no new tasks: %s", reason)
	return true, nil
}

// record writes the intent to launch one VM of the platform; the VM loop launches it.
func (f *Fleet) record(ctx context.Context, d *config.DynamicPlatform) error {
	p, err := f.provider(string(d.Platform))
	if err != nil {
		f.noteTrouble(string(d.Platform), err)
		return nil
	}
	label := platformLabel(string(d.Platform))
	rec := &berthv1.BuildHost{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "vm-" + strings.ToLower(label) + "-", Namespace: f.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "berth", LabelVM: label},
		},
		Spec: berthv1.BuildHostSpec{Instance: &berthv1.InstanceSpec{
			Platform: string(d.Platform), Provider: d.Type, Slots: d.SlotsPerVM(), Pooled: d.Pool != nil, Attempt: 1,
			AdminUser: p.AdminUser(), AdminSecret: d.SSHSecret,
		}},
		Status: berthv1.BuildHostStatus{Platform: string(d.Platform), Instance: &berthv1.InstanceStatus{Phase: berthv1.InstanceLaunching}},
	}
	return f.Client.Create(ctx, rec)
}

// retireGone retires a VM whose platform left the config, and terminates it once no task
// holds it.
func (f *Fleet) retireGone(ctx context.Context, rec *berthv1.BuildHost) error {
	const why = "its platform is no longer a dynamic platform in the host configuration"
	if retired, err := f.retire(ctx, rec, why); err != nil || retired {
		return err // terminated by the next pass, from the record as written now
	}
	vm := f.snapshot(rec)
	if vm.Phase == fleet.Terminating || vm.Used > 0 {
		return nil
	}
	_, err := f.startTerminating(ctx, rec, why)
	return client.IgnoreNotFound(err)
}
