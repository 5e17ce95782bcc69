package hosts

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// providerSpec is what a provider is built from: a platform's type and settings, from the
// config in force or as a VM was launched with them.
type providerSpec struct {
	platform, typ string
	settings      map[string]string
}

func (s providerSpec) key() string {
	var b strings.Builder
	b.WriteString(s.platform + "\x00" + s.typ)
	for _, k := range slices.Sorted(maps.Keys(s.settings)) {
		fmt.Fprintf(&b, "\x00%s=%s", k, s.settings[k])
	}
	return b.String()
}

// providers are the clouds' providers, built from the platforms' settings and credentials at
// their first use and kept.
type providers struct {
	config *hostconfig.Store
	// secret reads a Secret of the controller's namespace (cloud credentials), on demand.
	secret cloud.SecretReader

	mu sync.Mutex
	// built holds providers by platform, type and settings (see providerSpec); lastSpec is
	// each platform's spec from the config, kept after the platform leaves it.
	built    map[string]cloud.Provider
	lastSpec map[string]providerSpec
}

// build returns the provider of spec, made at its first use.
func (ps *providers) build(spec providerSpec) (cloud.Provider, error) {
	key := spec.key()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p, ok := ps.built[key]; ok {
		return p, nil
	}
	p, err := cloud.New(spec.typ, cloud.Settings{Platform: spec.platform, Values: maps.Clone(spec.settings), Secret: ps.secret})
	if err != nil {
		return nil, fmt.Errorf("platform %s: %w", spec.platform, err)
	}
	ps.built[key] = p
	return p, nil
}

// forPlatform returns the platform's provider, built from its settings in the config in force
// (or, for a platform no longer configured, the last settings it had: its VMs must still be
// terminated).
func (ps *providers) forPlatform(platform string) (cloud.Provider, error) {
	ps.mu.Lock()
	spec, known := ps.lastSpec[platform]
	if d := dynamic(ps.config, config.Platform(platform)); d != nil {
		spec, known = providerSpec{platform: platform, typ: d.Type, settings: d.Settings}, true
		ps.lastSpec[platform] = spec
	}
	ps.mu.Unlock()
	if !known {
		return nil, cloud.Errorf(cloud.BadConfig, "setup", "platform %s is not a dynamic platform in berth's host configuration", platform)
	}
	return ps.build(spec)
}

// of returns the provider a VM was launched through, built from the settings kept in its
// record: a VM launched before a change of region, account or cloud is still reached where it
// runs. Records without settings use the platform's provider.
func (ps *providers) of(rec *berthv1.BuildHost) (cloud.Provider, error) {
	in := rec.Spec.Instance
	if in.Settings == nil {
		return ps.forPlatform(in.Platform)
	}
	return ps.build(providerSpec{platform: in.Platform, typ: in.Provider, settings: in.Settings})
}

// tags are the tags of a VM of the platform recorded as record.
func (ps *providers) tags(installation, platform, record string) map[string]string {
	tags := map[string]string{}
	if cfg := ps.config.Config(); cfg != nil {
		maps.Copy(tags, cfg.AdditionalInstanceTags)
		tag := cfg.InstanceTag
		if d := cfg.Dynamic[config.Platform(platform)]; d != nil && d.InstanceTag != "" {
			tag = d.InstanceTag
		}
		if tag != "" {
			tags[cloud.TagInstanceTag] = tag
		}
	}
	tags[cloud.TagInstallation] = installation
	tags[cloud.TagPlatform] = config.Platform(platform).Label()
	tags[cloud.TagRecord] = record
	return tags
}
