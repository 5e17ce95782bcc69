package hosts

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InstallationConfigMap holds this installation's id, made once at berth's first start.
const InstallationConfigMap = "berth-installation"

// installation is this installation's id, which every VM berth launches carries as a tag: the
// sweeper terminates only instances with it.
type installation struct {
	client    client.Client
	apiReader client.Reader
	namespace string

	mu    sync.Mutex
	known string // the id, once read or made
}

// id reads this installation's id, or makes it at the first start.
func (in *installation) id(ctx context.Context) (string, error) {
	in.mu.Lock()
	id := in.known
	in.mu.Unlock()
	if id != "" {
		return id, nil
	}
	var cm corev1.ConfigMap
	key := client.ObjectKey{Namespace: in.namespace, Name: InstallationConfigMap}
	err := in.apiReader.Get(ctx, key, &cm)
	if apierrors.IsNotFound(err) {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}},
			Data: map[string]string{"id": hex.EncodeToString(b)}}
		err = in.client.Create(ctx, &cm)
		if apierrors.IsAlreadyExists(err) {
			err = in.apiReader.Get(ctx, key, &cm)
		}
	}
	if err != nil {
		return "", fmt.Errorf("reading this installation's id (ConfigMap %s): %w", InstallationConfigMap, err)
	}
	id = cm.Data["id"]
	if id == "" {
		return "", fmt.Errorf("ConfigMap %s/%s has no id; delete it and berth makes a new one (VMs tagged with the old id are then no longer swept)", in.namespace, InstallationConfigMap)
	}
	in.mu.Lock()
	in.known = id
	in.mu.Unlock()
	return id, nil
}

// object is what sweeper Events are about: the installation's ConfigMap.
func (in *installation) object() *corev1.ConfigMap {
	cm := &corev1.ConfigMap{}
	cm.Namespace, cm.Name = in.namespace, InstallationConfigMap
	cm.APIVersion, cm.Kind = "v1", "ConfigMap"
	return cm
}
