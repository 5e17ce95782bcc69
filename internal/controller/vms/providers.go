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

// build returns the provider of spec, made at its first use.
func (f *Fleet) build(spec providerSpec) (cloud.Provider, error) {
	key := spec.key()
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.built[key]; ok {
		return p, nil
	}
	p, err := cloud.New(spec.typ, cloud.Settings{Platform: spec.platform, Values: maps.Clone(spec.settings), Secret: f.Secret})
	if err != nil {
		return nil, fmt.Errorf("platform %s: %w", spec.platform, err)
	}
	f.built[key] = p
	return p, nil
}

// provider returns the platform's provider, built from its settings in the config in force
// (or, for a platform no longer configured, the last settings it had: its VMs must still be
// terminated).
func (f *Fleet) provider(platform string) (cloud.Provider, error) {
	f.mu.Lock()
	spec, known := f.lastSpec[platform]
	if d := f.dynamic(config.Platform(platform)); d != nil {
		spec, known = providerSpec{platform: platform, typ: d.Type, settings: d.Settings}, true
		f.lastSpec[platform] = spec
	}
	f.mu.Unlock()
	if !known {
		return nil, cloud.Errorf(cloud.BadConfig, "setup", "platform %s is not a dynamic platform in berth's host configuration", platform)
	}
	return f.build(spec)
}

// providerOf returns the provider a VM was launched through, built from the settings kept in
// its record: a VM launched before a change of region, account or cloud is still reached
// where it runs. Records without settings use the platform's provider.
func (f *Fleet) providerOf(rec *berthv1.BuildHost) (cloud.Provider, error) {
	in := rec.Spec.Instance
	if in.Settings == nil {
		return f.provider(in.Platform)
	}
	return f.build(providerSpec{platform: in.Platform, typ: in.Provider, settings: in.Settings})
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
