// Package cloudfake is an in-memory cloud.Provider for unit tests: instances run as soon as
// they are launched (at an address the test chooses), and every failure kind can be injected.
package cloudfake

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/berth-ci/berth/internal/cloud"
)

// Provider is a fake cloud.
type Provider struct {
	mu        sync.Mutex
	instances map[string]*cloud.Instance
	byToken   map[string]string
	next      int
	launches  int
	// Address is given to every instance that starts running.
	Address string
	// Pending keeps new instances pending until Start is called.
	Pending bool
	// Fail, if set, answers the next calls of an op ("launch", "get", ...) with an error.
	fail map[string][]error
	User string
	// MinLife is the fake's MinimumLife: how long its VMs' hardware is billed at the least.
	MinLife time.Duration
	// Types, if set, are the fake's InstanceTypes; a launch takes Types[req.Fallback].
	Types []string
	// typeOf is the instance type each instance was launched as (with Types).
	typeOf map[string]string
	// calls counts the calls of each op, failed ones too.
	calls map[string]int
}

// InstanceTypes is Types (see cloud.InstanceTyper).
func (p *Provider) InstanceTypes() []string { return p.Types }

// TypeOf is the instance type instance id was launched as ("" without Types).
func (p *Provider) TypeOf(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.typeOf[id]
}

// MinimumLife is MinLife (see cloud.MinimumLifer).
func (p *Provider) MinimumLife(string) time.Duration { return p.MinLife }

// New returns an empty fake whose instances run at address.
func New(address string) *Provider {
	return &Provider{instances: map[string]*cloud.Instance{}, byToken: map[string]string{}, Address: address, fail: map[string][]error{}, User: "root", typeOf: map[string]string{}, calls: map[string]int{}}
}

// FailNext makes the next call of op fail with err (queued: call it again for more).
func (p *Provider) FailNext(op string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail[op] = append(p.fail[op], err)
}

// Recover drops the failures still queued for op: its next calls pass.
func (p *Provider) Recover(op string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.fail, op)
}

// Calls counts the calls of op ("launch", "get", ...) the fake answered, failed ones too: how
// often berth asked the cloud.
func (p *Provider) Calls(op string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[op]
}

// injected is called by every op first: it counts the call and answers with a failure queued
// by FailNext, if any.
func (p *Provider) injected(op string) error {
	p.calls[op]++
	if q := p.fail[op]; len(q) > 0 {
		p.fail[op] = q[1:]
		return q[0]
	}
	return nil
}

// Launches counts instances made (repeated tokens do not count).
func (p *Provider) Launches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.launches
}

// Alive lists the instances not gone.
func (p *Provider) Alive() []cloud.Instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []cloud.Instance
	for _, i := range p.instances {
		if i.State != cloud.StateGone {
			out = append(out, *i)
		}
	}
	return out
}

// Start makes every pending instance run.
func (p *Provider) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, i := range p.instances {
		if i.State == cloud.StatePending {
			i.State, i.Address = cloud.StateRunning, p.Address
		}
	}
}

// Stop stops an instance as someone in the console would: the cloud keeps it, stopped.
func (p *Provider) Stop(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i, ok := p.instances[id]; ok && i.State != cloud.StateGone {
		i.State, i.Address = cloud.StateStopped, ""
	}
}

// Vanish forgets an instance as if the cloud lost it.
func (p *Provider) Vanish(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.instances, id)
}

// Plant adds an instance berth did not launch (with tags), as a leak or another's VM.
func (p *Provider) Plant(tags map[string]string, launched time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	id := fmt.Sprintf("i-%04d", p.next)
	p.instances[id] = &cloud.Instance{ID: id, State: cloud.StateRunning, Address: p.Address, Tags: maps.Clone(tags), LaunchedAt: launched}
	return id
}

func (p *Provider) Launch(_ context.Context, req cloud.LaunchRequest) (cloud.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.injected("launch"); err != nil {
		return cloud.Instance{}, err
	}
	if req.Fallback < 0 || (req.Fallback > 0 && req.Fallback >= len(p.Types)) {
		return cloud.Instance{}, cloud.Errorf(cloud.BadConfig, "launch", "no instance type number %d in %v", req.Fallback, p.Types)
	}
	if id, ok := p.byToken[req.Token]; ok {
		if i, ok := p.instances[id]; ok {
			return *i, nil
		}
	}
	p.next++
	p.launches++
	id := fmt.Sprintf("i-%04d", p.next)
	i := &cloud.Instance{ID: id, Token: req.Token, State: cloud.StatePending, Tags: maps.Clone(req.Tags), LaunchedAt: time.Now()}
	if !p.Pending {
		i.State, i.Address = cloud.StateRunning, p.Address
	}
	p.instances[id], p.byToken[req.Token] = i, id
	if req.Fallback < len(p.Types) {
		p.typeOf[id] = p.Types[req.Fallback]
	}
	return *i, nil
}

func (p *Provider) Get(_ context.Context, id string) (cloud.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.injected("get"); err != nil {
		return cloud.Instance{}, err
	}
	i, ok := p.instances[id]
	if !ok {
		return cloud.Instance{}, cloud.Errorf(cloud.NotFound, "get", "no instance %s", id)
	}
	return *i, nil
}

func (p *Provider) List(_ context.Context, tags map[string]string) ([]cloud.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.injected("list"); err != nil {
		return nil, err
	}
	var out []cloud.Instance
	for _, i := range p.instances {
		match := i.State != cloud.StateGone
		for k, v := range tags {
			match = match && i.Tags[k] == v
		}
		if match {
			out = append(out, *i)
		}
	}
	return out, nil
}

func (p *Provider) Terminate(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.injected("terminate"); err != nil {
		return err
	}
	if i, ok := p.instances[id]; ok {
		i.State = cloud.StateGone
	}
	return nil
}

func (p *Provider) AdminUser() string { return p.User }
