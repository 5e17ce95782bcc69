// Package config is the typed model of berth's host-config ConfigMap (its data, as a map of
// keys to values; the format is that of the multi-platform controller, see CONTRACT.md) and its
// validation. It knows nothing of Kubernetes: the controller and `berth config validate` hand
// it the data and act on the Problems it returns.
package config

import (
	"maps"
	"regexp"
	"slices"
	"time"
)

// Strategy is how a platform is satisfied.
type Strategy string

const (
	StrategyLocal       Strategy = "local"        // a node of this cluster
	StrategyStatic      Strategy = "static"       // a slot on a configured SSH host
	StrategyDynamic     Strategy = "dynamic"      // a cloud VM per task
	StrategyDynamicPool Strategy = "dynamic-pool" // a slot on a pooled, reused cloud VM
)

// Config is one parsed host-config ConfigMap.
type Config struct {
	// Platforms maps every configured platform to its strategy.
	Platforms map[Platform]Strategy
	// Hosts are the static hosts, sorted by name.
	Hosts []*StaticHost
	// Dynamic holds the settings of dynamic and dynamic-pool platforms.
	Dynamic map[Platform]*DynamicPlatform

	InstanceTag            string
	AdditionalInstanceTags map[string]string
	// AllowedNamespaces, if not empty, are the namespaces whose tasks may be served.
	AllowedNamespaces []*regexp.Regexp
	// MaxTasksPerNamespace, if not 0, bounds how many tasks one namespace runs at once on a
	// platform (berth's own key, max-tasks-per-namespace), so that one tenant cannot hold
	// every slot.
	MaxTasksPerNamespace int
	// UserKeyType is the algorithm of the keys berth makes for build users (berth's own key,
	// user-key-type); DefaultKeyType unless set.
	UserKeyType KeyType
	// BuildUIDs are the IDs berth gives build users on Linux hosts (berth's own key,
	// build-uid-range); DefaultUIDRange unless set.
	BuildUIDs UIDRange

	// broken holds, per platform, the errors that make it unusable: its tasks get an error
	// secret that names them, and on a reload the platform keeps its last good settings.
	broken map[Platform]Problems
	// leftOut holds, per host name, the errors that left a static host out of its pool.
	leftOut map[string]Problems
	// badGlobal names the global keys whose value could not be used.
	badGlobal map[string]bool
	// fatal are problems of the whole file: such a config is not used at all.
	fatal Problems
	// problems are all problems found, errors first.
	problems Problems
	// kept are the platforms and hosts that an edit broke and that kept their last good
	// settings (see Merge).
	kept map[Platform]bool
}

// StaticHost is one host.<name>.* entry.
type StaticHost struct {
	Name        string
	Address     string // IP or DNS name, optionally with :port
	User        string // the admin user berth provisions through
	Platform    Platform
	Secret      string // admin key secret, key id_rsa
	Concurrency int
	// HostKey, if set, is the only SSH host key accepted (authorized_keys format).
	HostKey string
	// Limits bound each build on the host (berth's own keys; DefaultBuildLimits unless set).
	Limits BuildLimits
}

// DynamicPlatform is one dynamic.<platform>.* group.
type DynamicPlatform struct {
	Platform     Platform
	Type         string // provider: aws, ibmz, ibmp
	MaxInstances int
	SSHSecret    string
	InstanceTag  string
	// SudoCommands are the commands each build user on the platform's VMs may run as root
	// (sudo-commands), checked by the grammar at load; none when the key is left out.
	SudoCommands      []string
	AllocationTimeout time.Duration
	CheckInterval     time.Duration
	HostKey           string
	// MinIdle is how many ready slots berth keeps free on this platform's VMs (berth's own
	// key, min-idle): on a dynamic platform that many idle VMs, on a pool that many free slots.
	MinIdle int
	// MaxAge, on a dynamic platform with MinIdle, is how long a warm VM may wait for a task
	// before it is replaced (pools have Pool.MaxAge).
	MaxAge time.Duration
	// Limits bound each build on the platform's VMs (berth's own keys; DefaultBuildLimits
	// unless set).
	Limits BuildLimits
	// Pool is set for dynamic-pool platforms: VMs are reused by several tasks.
	Pool *Pool
	// Settings are the provider's own keys (region, ami, ...), checked against its schema.
	Settings map[string]string
}

// SlotsPerVM is how many tasks one VM of the platform takes at once.
func (d *DynamicPlatform) SlotsPerVM() int {
	if d.Pool != nil {
		return d.Pool.Concurrency
	}
	return 1
}

// VMMaxAge is how long a VM of the platform may take new tasks: the pool's max-age, or on a
// dynamic platform the warm VMs' max-age (0: no limit).
func (d *DynamicPlatform) VMMaxAge() time.Duration {
	if d.Pool != nil {
		return d.Pool.MaxAge
	}
	return d.MaxAge
}

// Pool are the settings only pooled platforms have.
type Pool struct {
	Concurrency int
	MaxAge      time.Duration
}

// SecretRef is a secret the config names, with the keys it must hold.
type SecretRef struct {
	Name      string
	Keys      []string
	ConfigKey string   // the config key that names it
	Platform  Platform // the platform that needs it
}

// Strategy tells how p is satisfied; false if the config does not know p.
func (c *Config) Strategy(p Platform) (Strategy, bool) {
	s, ok := c.Platforms[p]
	return s, ok
}

// HostsFor returns the static hosts of p, sorted by name.
func (c *Config) HostsFor(p Platform) []*StaticHost {
	var hosts []*StaticHost
	for _, h := range c.Hosts {
		if h.Platform == p {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// Host returns the static host called name, or nil.
func (c *Config) Host(name string) *StaticHost {
	i, ok := slices.BinarySearchFunc(c.Hosts, name, func(h *StaticHost, n string) int {
		switch {
		case h.Name < n:
			return -1
		case h.Name > n:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return c.Hosts[i]
}

// NamespaceAllowed tells whether tasks in ns may be served.
func (c *Config) NamespaceAllowed(ns string) bool {
	if len(c.AllowedNamespaces) == 0 {
		return true
	}
	for _, re := range c.AllowedNamespaces {
		if re.MatchString(ns) {
			return true
		}
	}
	return false
}

// ForBuild is what a build user gets on a host of platform: on a static host (vm false), that
// host's limits and no sudo rule (the contract gives static hosts no sudo-commands); on a VM,
// its platform's limits and sudo-commands, whatever static host shares the VM's name. A host
// or platform the config does not hold gets DefaultBuildLimits and no sudo rule.
func (c *Config) ForBuild(host string, platform Platform, vm bool) (BuildLimits, []string) {
	if !vm {
		if h := c.Host(host); h != nil && h.Platform == platform {
			return h.Limits, nil
		}
	} else if d := c.Dynamic[platform]; d != nil {
		return d.Limits, d.SudoCommands
	}
	return DefaultBuildLimits, nil
}

// Broken returns the errors that make p unusable; empty when p can be served.
func (c *Config) Broken(p Platform) Problems {
	return c.broken[p]
}

// Usable tells whether the config knows p and can serve it.
func (c *Config) Usable(p Platform) bool {
	_, known := c.Platforms[p]
	return known && len(c.broken[p]) == 0
}

// Fatal returns the problems of the whole file; a config with any is not used at all.
func (c *Config) Fatal() Problems { return c.fatal }

// Problems returns every problem the config was parsed with, errors first.
func (c *Config) Problems() Problems { return c.problems }

// UsablePlatforms lists the platforms that can be served, sorted.
func (c *Config) UsablePlatforms() []Platform {
	var out []Platform
	for _, p := range slices.Sorted(maps.Keys(c.Platforms)) {
		if c.Usable(p) {
			out = append(out, p)
		}
	}
	return out
}

// AdminKeyField is the key of an admin-key Secret's data that holds the private key berth
// logs in to a host or VM with.
const AdminKeyField = "id_rsa"

// Secrets lists every secret the config names, in key order.
func (c *Config) Secrets() []SecretRef {
	var refs []SecretRef
	for _, h := range c.Hosts {
		refs = append(refs, SecretRef{Name: h.Secret, Keys: []string{AdminKeyField}, ConfigKey: hostKey(h.Name, "secret"), Platform: h.Platform})
	}
	for _, p := range slices.Sorted(maps.Keys(c.Dynamic)) {
		d := c.Dynamic[p]
		refs = append(refs, SecretRef{Name: d.SSHSecret, Keys: []string{AdminKeyField}, ConfigKey: dynamicKey(p, "ssh-secret"), Platform: p})
		if s, ok := providerSecretKeys[d.Type]; ok && d.Settings[s.field] != "" {
			refs = append(refs, SecretRef{Name: d.Settings[s.field], Keys: s.keys, ConfigKey: dynamicKey(p, s.field), Platform: p})
		}
	}
	return refs
}

func hostKey(name, field string) string          { return "host." + name + "." + field }
func dynamicKey(p Platform, field string) string { return "dynamic." + p.Label() + "." + field }
