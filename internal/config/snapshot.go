package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Snapshot is the usable part of a config in force, in a form that outlives the process: the
// controller stores it so that after a restart the last good settings of each platform are
// still there to fall back on (see Merge), just as they were before it.
type Snapshot struct {
	Platforms            map[Platform]Strategy         `json:"platforms"`
	Hosts                []*StaticHost                 `json:"hosts,omitempty"`
	Dynamic              map[Platform]*DynamicPlatform `json:"dynamic,omitempty"`
	MaxTasksPerNamespace int                           `json:"maxTasksPerNamespace,omitempty"`
	UserKeyType          KeyType                       `json:"userKeyType,omitempty"`
	BuildUIDs            *UIDRange                     `json:"buildUIDs,omitempty"`
}

// Snapshot returns the usable part of c: a broken platform is left out, so it can never be
// mistaken for a good one later.
func (c *Config) Snapshot() Snapshot {
	s := Snapshot{Platforms: map[Platform]Strategy{}, Dynamic: map[Platform]*DynamicPlatform{},
		MaxTasksPerNamespace: c.MaxTasksPerNamespace, UserKeyType: c.UserKeyType}
	if c.BuildUIDs != (UIDRange{}) && c.BuildUIDs != DefaultUIDRange {
		r := c.BuildUIDs
		s.BuildUIDs = &r
	}
	for _, p := range slices.Sorted(maps.Keys(c.Platforms)) {
		if !c.Usable(p) {
			continue
		}
		s.Platforms[p] = c.Platforms[p]
		s.Hosts = append(s.Hosts, c.HostsFor(p)...)
		if d := c.Dynamic[p]; d != nil {
			s.Dynamic[p] = d
		}
	}
	slices.SortFunc(s.Hosts, func(a, b *StaticHost) int { return strings.Compare(a.Name, b.Name) })
	return s
}

// Marshal encodes the snapshot; equal snapshots encode to equal bytes.
func (s Snapshot) Marshal() ([]byte, error) { return json.Marshal(s) }

// UnmarshalSnapshot decodes a stored snapshot into a config that serves what it holds. It has
// none of the problems of the edit it came from; it is meant as Merge's prev.
func UnmarshalSnapshot(data []byte) (*Config, error) {
	var s Snapshot
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("decoding the stored config: %w", err)
	}
	cfg := &Config{Platforms: s.Platforms, Hosts: s.Hosts, Dynamic: s.Dynamic, MaxTasksPerNamespace: s.MaxTasksPerNamespace,
		UserKeyType: s.UserKeyType, broken: map[Platform]Problems{}, leftOut: map[string]Problems{}, badGlobal: map[string]bool{}}
	if cfg.Platforms == nil {
		cfg.Platforms = map[Platform]Strategy{}
	}
	if cfg.Dynamic == nil {
		cfg.Dynamic = map[Platform]*DynamicPlatform{}
	}
	if cfg.UserKeyType == "" {
		cfg.UserKeyType = DefaultKeyType
	}
	cfg.BuildUIDs = DefaultUIDRange
	if s.BuildUIDs != nil {
		if _, err := ParseUIDRange(s.BuildUIDs.String()); err != nil {
			return nil, fmt.Errorf("the stored config's build UID range: %w", err)
		}
		cfg.BuildUIDs = *s.BuildUIDs
	}
	for _, h := range cfg.Hosts {
		if h == nil || cfg.Platforms[h.Platform] != StrategyStatic {
			return nil, fmt.Errorf("the stored config has a host of a platform it does not serve statically")
		}
	}
	slices.SortFunc(cfg.Hosts, func(a, b *StaticHost) int { return strings.Compare(a.Name, b.Name) })
	return cfg, nil
}
