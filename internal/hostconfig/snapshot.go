package hostconfig

import (
	"bytes"
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
)

// InForceConfigMap holds the usable part of the config in force (config.Snapshot), so that a
// restarted controller still has each platform's last good settings to fall back on when the
// ConfigMap it finds is broken in places, or as a whole. It lives in berth's own namespace, where
// no tenant writes, and carries no config label.
const InForceConfigMap = "berth-config-in-force"

const inForceKey = "config.json"

// lastGood is the config to fall back on: the one in force, or after a restart the stored one.
func (w *Watcher) lastGood(ctx context.Context, log logr.Logger) *config.Config {
	if cfg := w.Store.Config(); cfg != nil {
		return cfg
	}
	if w.APIReader == nil {
		return nil
	}
	var cm corev1.ConfigMap
	err := w.APIReader.Get(ctx, types.NamespacedName{Namespace: w.Namespace, Name: InForceConfigMap}, &cm)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			log.Error(err, "cannot read the stored config in force; broken platforms have no last good settings to fall back on")
		}
		return nil
	}
	cfg, err := config.UnmarshalSnapshot([]byte(cm.Data[inForceKey]))
	if err != nil {
		log.Error(err, "the stored config in force cannot be used", "configmap", InForceConfigMap)
		return nil
	}
	w.stored = []byte(cm.Data[inForceKey])
	log.Info("read the config in force before the restart", "configmap", InForceConfigMap, "platforms", len(cfg.Platforms))
	return cfg
}

// ReadInForce reads the stored config in force: what the controller serves when the labelled
// ConfigMap is missing or broken, and the base each edit of it is merged onto. nil when none is
// stored yet.
func ReadInForce(ctx context.Context, r client.Reader, namespace string) (*config.Config, error) {
	var cm corev1.ConfigMap
	err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: InForceConfigMap}, &cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return config.UnmarshalSnapshot([]byte(cm.Data[inForceKey]))
}

// Read is the config in force got from the cluster as the controller gets it: the labelled
// ConfigMap merged onto the stored config in force (each platform an edit broke keeps its last
// good settings), or the stored one alone while the ConfigMap is missing, ambiguous or unusable
// as a whole; nil when there is neither. It is for readers that run no Watcher: `berth status`,
// and the webhook on a replica that does not lead.
func Read(ctx context.Context, r client.Reader, namespace string) (*config.Config, error) {
	stored, err := ReadInForce(ctx, r, namespace)
	if err != nil {
		return nil, fmt.Errorf("reading the config in force (ConfigMap %s/%s): %w", namespace, InForceConfigMap, err)
	}
	var list corev1.ConfigMapList
	if err := r.List(ctx, &list, client.InNamespace(namespace), client.HasLabels{ConfigLabel}); err != nil {
		return nil, fmt.Errorf("listing ConfigMaps in %s: %w", namespace, err)
	}
	if len(list.Items) == 1 {
		if next, _ := config.Parse(list.Items[0].Data); len(next.Fatal()) == 0 {
			cfg, _ := config.Merge(stored, next)
			return cfg, nil
		}
	}
	return stored, nil
}

// restoreLastGood puts the stored config in force when nothing is yet: after a restart, a
// missing, ambiguous or wholly broken ConfigMap must not stop what was served before it.
func (w *Watcher) restoreLastGood(ctx context.Context, log logr.Logger) {
	if w.Store.Config() != nil {
		return
	}
	if cfg := w.lastGood(ctx, log); cfg != nil {
		w.Store.Apply(cfg)
		log.Info("the config in force before the restart stays in force", "platforms", len(cfg.Platforms))
	}
}

// storeInForce writes the snapshot of cfg when it differs from the one stored.
func (w *Watcher) storeInForce(ctx context.Context, cfg *config.Config) error {
	data, err := cfg.Snapshot().Marshal()
	if err != nil || bytes.Equal(data, w.stored) {
		return err
	}
	var cm corev1.ConfigMap
	err = w.APIReader.Get(ctx, types.NamespacedName{Namespace: w.Namespace, Name: InForceConfigMap}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: InForceConfigMap, Namespace: w.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}}, Data: map[string]string{inForceKey: string(data)}}
		err = w.Client.Create(ctx, &cm)
	case err == nil:
		cm.Data = map[string]string{inForceKey: string(data)}
		err = w.Client.Update(ctx, &cm)
	}
	if err == nil {
		w.stored = data
	}
	return err
}
