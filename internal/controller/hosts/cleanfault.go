package hosts

import (
	"errors"
	"slices"
	"sort"
	"sync"

	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/remote"
)

// A clean that fails is judged before it may cost a host its place in service. A build user
// can defeat its own clean (a process under its subordinate UIDs, a file it made undeletable):
// if that quarantined the host, one tenant could take every host of a platform. So a failure is
// the host's only when it shows the host broken for everyone; otherwise it costs only the
// user's own slot, which stays owed (and counted against its namespace) while the clean is
// retried.

// cleanFault is whom a failed clean speaks against.
type cleanFault int

const (
	// faultUnclear: the clean ran and failed (or was cut short) in a way it did not explain:
	// a broken host, or a user's doing the script does not recognise. It is the host's only
	// when builds of different namespaces fail so (see cleanVerdicts.failed).
	faultUnclear cleanFault = iota
	// faultUser: the clean found what the user left and could not remove it.
	faultUser
	// faultHost: berth never logged in (unreachable, host key changed, admin login refused),
	// so no build user can have caused it.
	faultHost
)

func (f cleanFault) String() string {
	switch f {
	case faultUser:
		return "user"
	case faultHost:
		return "host"
	}
	return "unclear"
}

// judgeClean tells whose fault a failed clean is, and what the user left when it is the user's.
func judgeClean(err error) (cleanFault, *hostops.LeftoverError) {
	var left *hostops.LeftoverError
	switch {
	case errors.As(err, &left):
		return faultUser, left
	case remote.NeverReached(err):
		return faultHost, nil
	}
	return faultUnclear, nil
}

// cleanFailure is a build user whose last clean on a host failed.
type cleanFailure struct {
	namespace, taskRun string
	fault              cleanFault
	// failures in a row of the record that owes the user.
	failures int
	// what the user left, when the fault is the user's.
	what string
}

// cleanVerdicts holds, per host, the build users whose clean is failing now, so that the
// failures of one user are told from those of a host that fails everyone. It lives in memory:
// after a restart the next failures rebuild it, and until then nothing is quarantined for
// cleans. It holds at most one entry per debt berth owes, each dropped when the debt is paid
// or forgotten.
type cleanVerdicts struct {
	mu    sync.Mutex
	hosts map[string]map[string]cleanFailure // host → build user →
}

// failed records a failed clean of user on host and tells whether the failures seen so far show
// the host itself broken, which they do when
//   - berth could not log in to the host (faultHost), threshold times in a row; or
//   - cleans of users of at least two namespaces failed in a way that is no user's fault
//     (faultUnclear), each threshold times in a row: one tenant cannot make a clean of
//     another tenant's user fail.
//
// What a user left (faultUser) never does. threshold 0 never quarantines.
func (v *cleanVerdicts) failed(host, user string, f cleanFailure, threshold int) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.hosts == nil {
		v.hosts = map[string]map[string]cleanFailure{}
	}
	users := v.hosts[host]
	if users == nil {
		users = map[string]cleanFailure{}
		v.hosts[host] = users
	}
	users[user] = f
	if threshold <= 0 {
		return false
	}
	switch f.fault {
	case faultHost:
		return f.failures >= threshold
	case faultUnclear:
		namespaces := map[string]bool{}
		for _, other := range users {
			if other.fault == faultUnclear && other.failures >= threshold {
				namespaces[other.namespace] = true
			}
		}
		return len(namespaces) >= 2
	}
	return false
}

// settled forgets user's failures on host (its clean succeeded, or its debt was dropped) and
// tells whether the user was known to have left something there.
func (v *cleanVerdicts) settled(host, user string) (wasDirty bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	users := v.hosts[host]
	f, ok := users[user]
	if !ok {
		return false
	}
	delete(users, user)
	if len(users) == 0 {
		delete(v.hosts, host)
	}
	return f.fault == faultUser
}

// forgetHost drops everything known of host's cleans (the host is gone or forgotten).
func (v *cleanVerdicts) forgetHost(host string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.hosts, host)
}

// dirty lists the build users of host whose clean fails on what they left, by name.
func (v *cleanVerdicts) dirty(host string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for user, f := range v.hosts[host] {
		if f.fault == faultUser {
			out = append(out, user)
		}
	}
	sort.Strings(out)
	return out
}

// unclearNamespaces lists the namespaces whose users' cleans fail on host with no one to
// blame, for the reason of a quarantine.
func (v *cleanVerdicts) unclearNamespaces(host string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for _, f := range v.hosts[host] {
		if f.fault == faultUnclear && !slices.Contains(out, f.namespace) {
			out = append(out, f.namespace)
		}
	}
	sort.Strings(out)
	return out
}
