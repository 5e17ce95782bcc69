package hosts

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/fleet"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/warning"
)

// LabelVM marks VM records, so they can be listed apart from static hosts' records.
const LabelVM = "berth.dev/vm-platform"

// vmRecords lists the VM records.
type vmRecords struct {
	apiReader client.Reader
	namespace string
}

// list lists every VM record, from the apiserver: the planner must count its own last
// writes, which the cache may not show yet.
func (r vmRecords) list(ctx context.Context) ([]*berthv1.BuildHost, error) {
	var list berthv1.BuildHostList
	if err := r.apiReader.List(ctx, &list, client.InNamespace(r.namespace), client.HasLabels{LabelVM}); err != nil {
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

// planner decides, one platform at a time, how many VMs to launch, retire and terminate, and
// carries the decision out: it writes the records of new VMs and hands the VMs to retire or
// end to the VM loop.
type planner struct {
	client    client.Client
	namespace string
	config    *hostconfig.Store
	capacity  *capacity.Capacity
	records   vmRecords
	readyVMs  *readyVMs
	trouble   *troubles
	providers *providers
	vm        *vmLoop
	now       func() time.Time
	kick      func()
}

// restore puts the ready VMs of the records into the ledger.
func (p *planner) restore(ctx context.Context) error {
	records, err := p.records.list(ctx)
	if err != nil {
		return err
	}
	for _, rec := range records {
		if rec.Status.Instance != nil && rec.Status.Instance.Phase == berthv1.InstanceReady {
			p.readyVMs.open(rec)
		}
	}
	return nil
}

// planAll plans every dynamic platform, and retires VMs of platforms no longer configured.
func (p *planner) planAll(ctx context.Context) error {
	cfg := p.config.Config()
	if cfg == nil {
		return nil
	}
	if len(cfg.Dynamic) == 0 && !p.vmRecordsCached(ctx) {
		return nil
	}
	records, err := p.records.list(ctx)
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
	for _, pl := range slices.Sorted(maps.Keys(cfg.Dynamic)) {
		d := cfg.Dynamic[pl]
		note(p.plan(ctx, string(pl), fleet.Platform{
			MaxInstances: d.MaxInstances, SlotsPerVM: d.SlotsPerVM(), MinIdle: d.MinIdle, MaxAge: d.VMMaxAge(),
			Pooled: d.Pool != nil, Queued: len(p.capacity.Waiters(string(pl))), Paused: p.trouble.paused(string(pl)),
		}, byPlatform[string(pl)], d))
		delete(byPlatform, string(pl))
	}
	// A platform gone from the config (or no longer dynamic) launches nothing; its VMs go.
	for _, pl := range slices.Sorted(maps.Keys(byPlatform)) {
		note(p.plan(ctx, pl, fleet.Platform{Removed: true}, byPlatform[pl], nil))
	}
	return firstErr
}

// vmRecordsCached tells whether the cache holds a VM record. With no VM platform configured
// the planner launches nothing, and it reads the records from the apiserver only while some
// are left to retire: a cluster of static hosts alone costs the apiserver no list each pass.
// A record the cache does not show yet was written by a pass that had its platform; the next
// pass finds it.
func (p *planner) vmRecordsCached(ctx context.Context) bool {
	var list berthv1.BuildHostList
	if err := p.client.List(ctx, &list, client.InNamespace(p.namespace), client.HasLabels{LabelVM}); err != nil {
		return true // the apiserver's list decides
	}
	return len(list.Items) > 0
}

// plan carries out the fleet's decision for one platform (d is nil for a removed one).
func (p *planner) plan(ctx context.Context, platform string, pl fleet.Platform, recs []*berthv1.BuildHost, d *config.DynamicPlatform) error {
	vms := make([]fleet.VM, 0, len(recs))
	byName := map[string]*berthv1.BuildHost{}
	for _, rec := range recs {
		byName[rec.Name] = rec
		vm := p.snapshot(rec)
		vm.Outdated = d != nil && outdated(rec.Spec.Instance, d)
		vm.MinLife = p.minimumLife(rec)
		vms = append(vms, vm)
	}
	decision := fleet.Plan(pl, vms, p.now())
	vmCount.WithLabelValues(platform).Set(float64(len(recs)))
	for _, r := range decision.Retire {
		if err := p.vm.retire(ctx, byName[r.Name], r.Reason); err != nil {
			return err
		}
	}
	for _, r := range decision.Terminate {
		rec := byName[r.Name]
		reason := cmp.Or(r.Reason, rec.Spec.Instance.Retire, "it served its task")
		// The decision was taken on a snapshot: close the VM first, then terminate it only if
		// no task took it meanwhile (a retired VM goes on a later pass, once free).
		p.capacity.RetireHost(rec.Name)
		if p.capacity.HostOccupancy(rec.Name).Used > 0 {
			if err := p.vm.retire(ctx, rec, reason); err != nil {
				return err
			}
			continue
		}
		if _, err := p.vm.startTerminating(ctx, rec, reason); err != nil {
			if apierrors.IsConflict(err) {
				// Written meanwhile (by the VM loop): the next pass decides again on a fresh
				// read, and nothing is launched in the place of a VM not yet terminating.
				p.kick()
				return nil
			}
			return client.IgnoreNotFound(err)
		}
	}
	for range decision.Launch {
		if err := p.record(ctx, d); err != nil {
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

// minimumLife is how long the cloud bills the record's VM at the least, by the provider it
// was launched through and the type that served it (a fallback type's may differ from the
// platform's first); 0 when its provider cannot be had.
func (p *planner) minimumLife(rec *berthv1.BuildHost) time.Duration {
	provider, err := p.providers.of(rec)
	if err != nil {
		return 0
	}
	var served string
	if st := rec.Status.Instance; st != nil {
		served = st.InstanceType
	}
	return cloud.MinimumLife(provider, served)
}

// snapshot is how the planner sees a VM: its record's phase and the ledger's occupancy.
func (p *planner) snapshot(rec *berthv1.BuildHost) fleet.VM {
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
		occ := p.capacity.HostOccupancy(rec.Name)
		if !occ.Known {
			// Ready in the record but not yet in the ledger: the VM loop is about to open it.
			// Until then it counts as booting, so it is neither launched again nor culled.
			vm.Phase = fleet.Booting
		}
		vm.Used, vm.Retired = occ.Used, vm.Retired || occ.Retired
	}
	return vm
}

// record writes the intent to launch one VM of the platform; the VM loop launches it.
func (p *planner) record(ctx context.Context, d *config.DynamicPlatform) error {
	if now := dynamic(p.config, d.Platform); now == nil || now.Type != d.Type || !maps.Equal(now.Settings, d.Settings) {
		return nil // the config changed since this pass read it: the pass it kicked decides
	}
	provider, err := p.providers.forPlatform(string(d.Platform))
	if err != nil {
		// No record to put an Event on: the log line is where the operator finds ref.
		ref := p.trouble.note(string(d.Platform), err)
		warning.Log(vmLog, fmt.Sprintf("cannot launch VMs for platform %s (%s): %v", d.Platform, ref, err), "platform", d.Platform, "ref", ref)
		return nil
	}
	label := d.Platform.Label()
	rec := &berthv1.BuildHost{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "vm-" + strings.ToLower(label) + "-", Namespace: p.namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "berth", LabelVM: label},
		},
		Spec: berthv1.BuildHostSpec{Instance: &berthv1.InstanceSpec{
			Platform: string(d.Platform), Provider: d.Type, Settings: maps.Clone(d.Settings),
			Slots: d.SlotsPerVM(), Pooled: d.Pool != nil, Attempt: 1,
			AdminUser: provider.AdminUser(), AdminSecret: d.SSHSecret,
		}},
	}
	// A create writes no status: a record without one is launching, and the VM loop's first
	// status write (the cloud's answer) is its first.
	return p.client.Create(ctx, rec)
}
