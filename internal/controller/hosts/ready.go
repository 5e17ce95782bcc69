package hosts

import (
	"sync"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// readyVMs are the VMs berth can hand to tasks: their logins, their instance specs, and their
// place in the ledger.
type readyVMs struct {
	config   *hostconfig.Store
	capacity *capacity.Capacity

	mu     sync.Mutex
	logins map[string]berthv1.HostLogin // ready VMs by record name
	// specs are the ready VMs' instance specs, to close at once those a config change
	// makes outdated.
	specs map[string]*berthv1.InstanceSpec
}

func (r *readyVMs) login(host string) (berthv1.HostLogin, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	login, ok := r.logins[host]
	return login, ok
}

func (r *readyVMs) set(rec *berthv1.BuildHost) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logins[rec.Name] = loginOf(rec)
	r.specs[rec.Name] = rec.Spec.Instance.DeepCopy()
}

func (r *readyVMs) drop(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.logins, name)
	delete(r.specs, name)
}

// outdated names the ready VMs launched with settings their platform no longer has in cfg.
func (r *readyVMs) outdated(cfg *config.Config) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var stale []string
	for name, in := range r.specs {
		if d := cfg.Dynamic[config.Platform(in.Platform)]; d != nil && outdated(in, d) {
			stale = append(stale, name)
		}
	}
	return stale
}

func loginOf(rec *berthv1.BuildHost) berthv1.HostLogin {
	in := rec.Spec.Instance
	return berthv1.HostLogin{Host: rec.Name, Address: rec.Status.Address, AdminUser: in.AdminUser, AdminSecret: in.AdminSecret,
		HostKey: rec.Status.Instance.HostKey, Platform: in.Platform, Instance: rec.Status.Instance.ID}
}

// open puts a ready VM into the ledger (a retired one closed) and wakes its waiters.
func (r *readyVMs) open(rec *berthv1.BuildHost) {
	r.set(rec)
	in := rec.Spec.Instance
	host := allocation.Host{Name: rec.Name, Platform: in.Platform, Capacity: in.Slots, SingleUse: !in.Pooled}
	if d := dynamic(r.config, config.Platform(in.Platform)); in.Retire != "" || (d != nil && outdated(in, d)) {
		// Known to the ledger, closed: the planner terminates a retired VM once the ledger
		// sees it free, and after a restart nothing else may put it there (a single-use VM
		// whose task's record went just before the crash), so it would stay up for good. A VM
		// launched with settings the platform no longer has stays closed too, from the config
		// change until the planner retires it in its record.
		r.capacity.PutRetiredHost(host)
		return
	}
	r.capacity.PutHost(host)
	// A drained or quarantined VM stays out of service.
	r.capacity.Follow(rec)
}
