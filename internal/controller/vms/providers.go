package vms

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
)

// InstallationConfigMap holds this installation's id, made once at berth's first start.
const InstallationConfigMap = "berth-installation"

type providerEntry struct {
	typ      string
	settings map[string]string
	provider cloud.Provider
}

// provider returns the platform's provider, built from its settings in the config in force
// (or, for a platform no longer configured, the last settings it had: its VMs must still be
// terminated).
func (f *Fleet) provider(platform string) (cloud.Provider, error) {
	d := f.dynamic(config.Platform(platform))
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.providers[platform]
	if d == nil {
		if !ok {
			return nil, cloud.Errorf(cloud.BadConfig, "setup", "platform %s is not a dynamic platform in berth's host configuration", platform)
		}
		return e.provider, nil
	}
	if ok && e.typ == d.Type && maps.Equal(e.settings, d.Settings) {
		return e.provider, nil
	}
	p, err := cloud.New(d.Type, cloud.Settings{Platform: platform, Values: maps.Clone(d.Settings), Secret: f.Secret})
	if err != nil {
		return nil, fmt.Errorf("platform %s: %w", platform, err)
	}
	f.providers[platform] = providerEntry{typ: d.Type, settings: maps.Clone(d.Settings), provider: p}
	return p, nil
}

// providerOf returns the provider a VM was launched through, built from the settings kept in
// its record: a VM launched before a change of region, account or cloud is still reached
// where it runs. Records without settings use the platform's provider.
func (f *Fleet) providerOf(rec *berthv1.BuildHost) (cloud.Provider, error) {
	in := rec.Spec.Instance
	if in.Settings == nil {
		return f.provider(in.Platform)
	}
	if d := f.dynamic(config.Platform(in.Platform)); d != nil && !outdated(in, d) {
		return f.provider(in.Platform)
	}
	key := launchedKey(in)
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.launchedWith[key]; ok {
		return p, nil
	}
	p, err := cloud.New(in.Provider, cloud.Settings{Platform: in.Platform, Values: maps.Clone(in.Settings), Secret: f.Secret})
	if err != nil {
		return nil, fmt.Errorf("platform %s, as VM %s was launched: %w", in.Platform, rec.Name, err)
	}
	if f.launchedWith == nil {
		f.launchedWith = map[string]cloud.Provider{}
	}
	f.launchedWith[key] = p
	return p, nil
}

// launchedKey identifies a provider type and settings.
func launchedKey(in *berthv1.InstanceSpec) string {
	var b strings.Builder
	b.WriteString(in.Provider)
	for _, k := range slices.Sorted(maps.Keys(in.Settings)) {
		fmt.Fprintf(&b, "\x00%s=%s", k, in.Settings[k])
	}
	return b.String()
}

// installationID reads this installation's id, or makes it at the first start.
func (f *Fleet) installationID(ctx context.Context) (string, error) {
	f.mu.Lock()
	id := f.installation
	f.mu.Unlock()
	if id != "" {
		return id, nil
	}
	var cm corev1.ConfigMap
	key := client.ObjectKey{Namespace: f.Namespace, Name: InstallationConfigMap}
	err := f.APIReader.Get(ctx, key, &cm)
	if apierrors.IsNotFound(err) {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}},
			Data: map[string]string{"id": hex.EncodeToString(b)}}
		err = f.Client.Create(ctx, &cm)
		if apierrors.IsAlreadyExists(err) {
			err = f.APIReader.Get(ctx, key, &cm)
		}
	}
	if err != nil {
		return "", fmt.Errorf("reading this installation's id (ConfigMap %s): %w", InstallationConfigMap, err)
	}
	id = cm.Data["id"]
	if id == "" {
		return "", fmt.Errorf("ConfigMap %s/%s has no id; delete it and berth makes a new one (VMs tagged with the old id are then no longer swept)", f.Namespace, InstallationConfigMap)
	}
	f.mu.Lock()
	f.installation = id
	f.mu.Unlock()
	return id, nil
}

// tags are the tags of a VM of the platform recorded as record.
func (f *Fleet) tags(installation, platform, record string) map[string]string {
	tags := map[string]string{}
	if cfg := f.Config.Config(); cfg != nil {
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
