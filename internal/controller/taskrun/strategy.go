package taskrun

import (
	"context"
	"time"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// strategy is how one kind of platform is served. The reconciler looks up the platform's
// strategy and calls it; which kind it drives (local, static, dynamic, pool) it never asks.
// Every kind that holds hosts goes through the same ledger, records and phases: they differ
// only in where hosts come from and what a busy platform does.
type strategy interface {
	// holdsHosts is false for platforms whose tasks build where they run.
	holdsHosts() bool
	// login is how berth reaches a host the ledger granted, as its admin.
	login(host string) (berthv1.HostLogin, bool)
	// busy is told that a task has waited so long on the platform; it may add capacity, and
	// says whether the task should get an error now (reason set), or when to ask again.
	busy(platform string, waited time.Duration) (reason, message string, recheck time.Duration)
	// releasing is called before the last record holding host lets it go.
	releasing(ctx context.Context, host string) error
}

// Hosts is the owner of the BuildHost records (package hosts), as the TaskRun side sees it:
// the VMs of dynamic platforms, and the judge of failed cleans.
type Hosts interface {
	VMs
	HostCleans
}

// VMs is the fleet of VMs of dynamic platforms, as the TaskRun side sees it.
type VMs interface {
	Login(host string) (berthv1.HostLogin, bool)
	// Kick asks for a planning pass: tasks wait.
	Kick()
	Unservable(platform string, waited time.Duration) (reason, message string, recheck time.Duration)
	// Released is told before a task's last hold on host goes (a single-use VM is retired).
	Released(ctx context.Context, host string) error
	// Gone tells whether a VM's record (and so the VM) is gone.
	Gone(ctx context.Context, host string) (bool, error)
}

// HostCleans is told how each clean of a build user went, and judges whether a failure is the
// host's fault (it may quarantine the host) or the user's (it costs only the user's slot).
type HostCleans interface {
	// Cleaned: build user d is gone from its host.
	Cleaned(ctx context.Context, d berthv1.Debt)
	// CleanFailed: removing rec's build user d failed, failures passes in a row; retried in retry.
	CleanFailed(ctx context.Context, rec *berthv1.Allocation, d berthv1.Debt, err error, failures int, retry time.Duration)
}

// strategies says how each kind of platform is served.
type strategies struct {
	config *hostconfig.Store
	vms    VMs // nil: dynamic platforms are not served
}

// forKind returns how a platform of this kind is served; nil if this berth cannot serve it.
func (ss strategies) forKind(kind config.Strategy) strategy {
	switch kind {
	case config.StrategyLocal:
		return local{}
	case config.StrategyStatic:
		return static{ss.config}
	case config.StrategyDynamic, config.StrategyDynamicPool:
		if ss.vms != nil {
			return vmStrategy{ss.vms}
		}
	}
	return nil
}

// of is how the record's platform is served. A record is only written for a kind that
// holds hosts; one this berth cannot serve (written by another release) holds nothing here.
func (ss strategies) of(rec *berthv1.Allocation) strategy {
	if s := ss.forKind(config.Strategy(rec.Spec.Strategy)); s != nil {
		return s
	}
	return local{}
}

// local platforms build on the cluster's own nodes.
type local struct{}

func (local) holdsHosts() bool                                           { return false }
func (local) login(string) (berthv1.HostLogin, bool)                     { return berthv1.HostLogin{}, false }
func (local) releasing(context.Context, string) error                    { return nil }
func (local) busy(string, time.Duration) (string, string, time.Duration) { return "", "", 0 }

// static platforms share configured hosts; a busy one waits for a slot to free.
type static struct{ config *hostconfig.Store }

func (static) holdsHosts() bool                        { return true }
func (static) releasing(context.Context, string) error { return nil }
func (static) busy(string, time.Duration) (string, string, time.Duration) {
	return "", "", 0
}

func (s static) login(host string) (berthv1.HostLogin, bool) {
	h := s.config.Host(host)
	if h == nil {
		return berthv1.HostLogin{}, false
	}
	return hostconfig.Login(h), true
}

// vmStrategy serves dynamic and dynamic-pool platforms from VMs berth launches: a busy
// platform asks the fleet for capacity; a single-use VM is retired before its task lets go.
type vmStrategy struct{ vms VMs }

func (vmStrategy) holdsHosts() bool { return true }

func (v vmStrategy) login(host string) (berthv1.HostLogin, bool) { return v.vms.Login(host) }

func (v vmStrategy) busy(platform string, waited time.Duration) (string, string, time.Duration) {
	v.vms.Kick()
	return v.vms.Unservable(platform, waited)
}

func (v vmStrategy) releasing(ctx context.Context, host string) error {
	return v.vms.Released(ctx, host)
}

// vmGone tells whether login is a VM that berth has terminated: nothing is owed to it.
func (ss strategies) vmGone(ctx context.Context, login berthv1.HostLogin) (bool, error) {
	if login.Instance == "" || ss.vms == nil {
		return false, nil
	}
	return ss.vms.Gone(ctx, login.Host)
}
