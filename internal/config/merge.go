package config

import (
	"maps"
	"slices"
	"strings"
)

// Kept is a part of the config that an edit broke and that stays in force with its last good
// settings: a whole platform, or one static host (Host set).
type Kept struct {
	Platform Platform
	Host     string
	// Key is set for a global key whose last good value stays in force.
	Key      string
	Problems Problems
}

// What names the kept part for a message.
func (k Kept) What() string {
	switch {
	case k.Key != "":
		return k.Key
	case k.Host != "":
		return "host " + k.Host
	}
	return "platform " + string(k.Platform)
}

// Merge returns the config to put in force when next, an edit, replaces prev, the config in
// force (nil on a first start). Whatever next gets right takes effect; each platform, host or
// global key that next breaks and prev had usable keeps prev's settings, so that one person's
// typo cannot stop the builds it does not concern. A platform or host that next removes is
// gone: removing is not a mistake. Neither input is changed.
func Merge(prev, next *Config) (*Config, []Kept) {
	if prev == nil || len(next.fatal) > 0 {
		return next, nil
	}
	out := *next
	out.Platforms = maps.Clone(next.Platforms)
	out.Dynamic = maps.Clone(next.Dynamic)
	out.broken = maps.Clone(next.broken)
	out.kept = map[Platform]bool{}
	hosts := map[string]*StaticHost{}
	for _, h := range next.Hosts {
		hosts[h.Name] = h
	}
	var kept []Kept

	for _, p := range slices.Sorted(maps.Keys(next.Platforms)) {
		if next.Usable(p) || !prev.Usable(p) {
			continue
		}
		out.Platforms[p] = prev.Platforms[p]
		delete(out.broken, p)
		delete(out.Dynamic, p)
		if d := prev.Dynamic[p]; d != nil {
			out.Dynamic[p] = d
		}
		for name, h := range hosts {
			if h.Platform == p {
				delete(hosts, name)
			}
		}
		for _, h := range prev.HostsFor(p) {
			hosts[h.Name] = h
		}
		out.kept[p] = true
		kept = append(kept, Kept{Platform: p, Problems: next.broken[p]})
	}
	for _, name := range slices.Sorted(maps.Keys(next.leftOut)) {
		last := prev.Host(name)
		if last == nil || hosts[name] != nil {
			continue
		}
		if s, ok := out.Platforms[last.Platform]; ok && s != StrategyStatic {
			continue // its platform is now served another way: the host would not be used
		}
		hosts[name] = last
		out.Platforms[last.Platform] = StrategyStatic
		delete(out.broken, last.Platform)
		out.kept[last.Platform] = true
		kept = append(kept, Kept{Platform: last.Platform, Host: name, Problems: next.leftOut[name]})
	}
	out.Hosts = slices.SortedFunc(maps.Values(hosts), func(a, b *StaticHost) int { return strings.Compare(a.Name, b.Name) })

	if next.badGlobal["max-tasks-per-namespace"] {
		out.MaxTasksPerNamespace = prev.MaxTasksPerNamespace
		kept = append(kept, Kept{Key: "max-tasks-per-namespace", Problems: next.problemsOf("max-tasks-per-namespace")})
	}
	if next.badGlobal[userKeyTypeKey] {
		out.UserKeyType = prev.UserKeyType
		kept = append(kept, Kept{Key: userKeyTypeKey, Problems: next.problemsOf(userKeyTypeKey)})
	}
	if next.badGlobal[buildUIDRangeKey] {
		out.BuildUIDs = prev.BuildUIDs
		kept = append(kept, Kept{Key: buildUIDRangeKey, Problems: next.problemsOf(buildUIDRangeKey)})
	}
	return &out, kept
}

func (c *Config) problemsOf(key string) Problems {
	var out Problems
	for _, p := range c.problems {
		if p.Key == key {
			out = append(out, p)
		}
	}
	return out
}

// PlatformReport is one platform as `berth config validate` and the controller describe it.
type PlatformReport struct {
	Platform Platform
	Strategy Strategy
	// Capacity is how many tasks can run at once: the concurrency of its usable hosts, its
	// max-instances (times concurrency for a pool); 0 for a local platform (the cluster's own).
	Capacity int
	Usable   bool
	// KeptLastGood is set when an edit broke the platform or one of its hosts and the last good
	// settings stay in force.
	KeptLastGood bool
	Problems     Problems
}

// Report describes every platform the config names, sorted by name.
func (c *Config) Report() []PlatformReport {
	var out []PlatformReport
	for _, p := range slices.Sorted(maps.Keys(c.Platforms)) {
		r := PlatformReport{Platform: p, Strategy: c.Platforms[p], Usable: c.Usable(p), KeptLastGood: c.kept[p]}
		for _, h := range c.HostsFor(p) {
			r.Capacity += h.Concurrency
		}
		if d := c.Dynamic[p]; d != nil {
			r.Capacity = d.MaxInstances
			if d.Pool != nil {
				r.Capacity *= d.Pool.Concurrency
			}
		}
		for _, problem := range c.problems {
			if problem.Platform == p {
				r.Problems = append(r.Problems, problem)
			}
		}
		out = append(out, r)
	}
	return out
}

// FileProblems are the problems that concern no one platform: global keys, unknown keys, hosts
// whose platform cannot be told.
func (c *Config) FileProblems() Problems {
	var out Problems
	for _, p := range c.problems {
		if p.Platform == "" {
			out = append(out, p)
		}
	}
	return out
}
