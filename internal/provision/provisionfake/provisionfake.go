// Package provisionfake is an in-memory provision.Provisioner for unit tests. It keeps the
// contract of provision.NewSSH: Provision and Clean start a job and return at once (never Done
// on the call that starts it), a job's end calls Notify with its Wake, its outcome stays until
// Forget, and a clean starts only once the provision of the same job has ended. Jobs end as
// the test's Rule says (at once by default) or when the test calls End; each host remembers the
// build users made on it and not yet removed, so a test can tell what a task left behind.
package provisionfake

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/provision"
)

// Kind tells a provision from a clean.
type Kind string

const (
	Provision Kind = "provision"
	Clean     Kind = "clean"
)

// Rule decides, when a job starts, how it ends: end false leaves it running until End.
type Rule func(kind Kind, job provision.Job) (out provision.Outcome, end bool)

// Provisioner is a fake provision.Provisioner.
type Provisioner struct {
	// Notify is told a job's Wake when it ends, as provision.NewSSH's notifier is (the
	// reconciler's Notify).
	Notify provision.Notifier
	// Rule, if set, decides how each job ends; nil: every job succeeds at once.
	Rule Rule
	// Health answers Check; nil: every host is healthy.
	Health func(login berthv1.HostLogin) provision.Health

	mu      sync.Mutex
	jobs    map[string]*job            // kind/id
	users   map[string]map[string]bool // host → build users on it
	started []Started
	listed  int
}

// Started is a job as it was started.
type Started struct {
	Kind Kind
	Job  provision.Job
}

type job struct {
	kind    Kind
	spec    provision.Job
	outcome provision.Outcome // Done once it ended
	// waiting: a clean whose provision has not ended yet; it starts when that one ends.
	waiting bool
	// forgotten: Forget came while it ran; its outcome goes when it ends.
	forgotten bool
}

var (
	_ provision.Provisioner = (*Provisioner)(nil)
	_ provision.UserLister  = (*Provisioner)(nil)
)

func key(kind Kind, id string) string { return string(kind) + "/" + id }

// Provision starts making job.User on the host, or tells how the started job stands.
func (p *Provisioner) Provision(_ context.Context, j provision.Job) provision.Outcome {
	return p.run(Provision, j)
}

// Clean starts removing job.User from the host, or tells how the started job stands.
func (p *Provisioner) Clean(_ context.Context, j provision.Job) provision.Outcome {
	return p.run(Clean, j)
}

// Check answers with Health, healthy when unset.
func (p *Provisioner) Check(_ context.Context, login berthv1.HostLogin) provision.Health {
	if p.Health != nil {
		return p.Health(login)
	}
	return provision.Health{Healthy: true}
}

// ExistingUsers tells which of names are on the host: made (or Put) and not removed.
func (p *Provisioner) ExistingUsers(_ context.Context, login berthv1.HostLogin, names []string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listed++
	var out []string
	for _, n := range names {
		if p.users[login.Host][n] {
			out = append(out, n)
		}
	}
	return out, nil
}

// Listed is how many times ExistingUsers was asked.
func (p *Provisioner) Listed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.listed
}

// Put makes user on host as another controller would have: not through a job of this one.
func (p *Provisioner) Put(host, user string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.users == nil {
		p.users = map[string]map[string]bool{}
	}
	if p.users[host] == nil {
		p.users[host] = map[string]bool{}
	}
	p.users[host][user] = true
}

// Forget drops the outcomes of job id (at once if it has ended, else when it ends).
func (p *Provisioner) Forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range []string{key(Provision, id), key(Clean, id)} {
		if j, ok := p.jobs[k]; ok {
			if j.outcome.Done {
				delete(p.jobs, k)
			} else {
				j.forgotten = true
			}
		}
	}
}

func (p *Provisioner) run(kind Kind, spec provision.Job) provision.Outcome {
	p.mu.Lock()
	if p.jobs == nil {
		p.jobs = map[string]*job{}
	}
	k := key(kind, spec.ID)
	if existing, ok := p.jobs[k]; ok {
		out := existing.outcome
		p.mu.Unlock()
		return out
	}
	j := &job{kind: kind, spec: spec}
	p.jobs[k] = j
	if prior, ok := p.jobs[key(Provision, spec.ID)]; kind == Clean && ok && !prior.outcome.Done {
		j.waiting = true
		p.mu.Unlock()
		return provision.Outcome{}
	}
	wake := p.startLocked(j)
	p.mu.Unlock()
	p.notify(wake)
	return provision.Outcome{}
}

// startLocked starts j and, if the rule ends it at once, ends it; it returns the wake-ups due.
func (p *Provisioner) startLocked(j *job) []string {
	p.started = append(p.started, Started{Kind: j.kind, Job: j.spec})
	out, end := provision.Outcome{}, true
	if p.Rule != nil {
		out, end = p.Rule(j.kind, j.spec)
	}
	if !end {
		return nil
	}
	return p.endLocked(j, out)
}

// endLocked records j's outcome, applies it to the host, and starts a clean that waited for it.
func (p *Provisioner) endLocked(j *job, out provision.Outcome) []string {
	out.Done = true
	if out.Err == nil {
		host := j.spec.Login.Host
		if p.users == nil {
			p.users = map[string]map[string]bool{}
		}
		if p.users[host] == nil {
			p.users[host] = map[string]bool{}
		}
		switch j.kind {
		case Provision:
			if out.UserDir == "" {
				out.UserDir = "/home/" + j.spec.User + "/build"
			}
			p.users[host][j.spec.User] = true
		case Clean:
			delete(p.users[host], j.spec.User)
		}
	}
	j.outcome = out
	if j.forgotten {
		delete(p.jobs, key(j.kind, j.spec.ID))
	}
	wakes := []string{j.spec.Wake}
	if j.kind == Provision {
		if c, ok := p.jobs[key(Clean, j.spec.ID)]; ok && c.waiting {
			c.waiting = false
			wakes = append(wakes, p.startLocked(c)...)
		}
	}
	return wakes
}

func (p *Provisioner) notify(wakes []string) {
	if p.Notify == nil {
		return
	}
	for _, w := range wakes {
		p.Notify(w)
	}
}

// End ends the running job of kind for build user user with out, as its host would, and
// notifies. It fails if no such job is running.
func (p *Provisioner) End(kind Kind, user string, out provision.Outcome) error {
	p.mu.Lock()
	var found *job
	for _, j := range p.jobs {
		if j.kind == kind && j.spec.User == user && !j.outcome.Done && !j.waiting {
			found = j
		}
	}
	if found == nil {
		p.mu.Unlock()
		return fmt.Errorf("no %s job of build user %s is running", kind, user)
	}
	wakes := p.endLocked(found, out)
	p.mu.Unlock()
	p.notify(wakes)
	return nil
}

// Running lists the jobs of kind started and not ended.
func (p *Provisioner) Running(kind Kind) []provision.Job {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []provision.Job
	for _, j := range p.jobs {
		if j.kind == kind && !j.outcome.Done && !j.waiting {
			out = append(out, j.spec)
		}
	}
	slices.SortFunc(out, func(a, b provision.Job) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Started lists every job started, in order.
func (p *Provisioner) Started() []Started {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.started)
}

// Users lists the build users on host: made and not removed.
func (p *Provisioner) Users(host string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for u := range p.users[host] {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// AllUsers counts the build users left on every host.
func (p *Provisioner) AllUsers() map[string][]string {
	p.mu.Lock()
	hosts := make([]string, 0, len(p.users))
	for h := range p.users {
		hosts = append(hosts, h)
	}
	p.mu.Unlock()
	out := map[string][]string{}
	for _, h := range hosts {
		if users := p.Users(h); len(users) > 0 {
			out[h] = users
		}
	}
	return out
}
