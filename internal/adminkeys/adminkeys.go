// Package adminkeys holds the admin keys berth logs in to hosts with, parsed, so that a host job
// does not read its key from the apiserver.
//
// An admin key lives in a Secret of berth's own namespace (key id_rsa), which only the
// installation's admins write. berth watches the metadata of its namespace's Secrets (never their
// data) and keeps each admin key it has used, parsed, beside the resourceVersion it was read
// at. A job takes the key it holds while the watch shows that same version; a Secret that
// changed, or that the watch does not show, is read again from the apiserver. A rotated key is
// so in use from the moment the watch sees the new version, and a deleted one is dropped.
package adminkeys

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
)

// Keys hands out the admin keys of one namespace.
type Keys struct {
	// Versions reads the metadata of the namespace's Secrets (a watch's cache): which
	// version of each exists now.
	Versions client.Reader
	// Secrets reads a Secret whole, past any cache.
	Secrets   client.Reader
	Namespace string

	mu     sync.Mutex
	held   map[string]heldKey
	flight singleflight.Group
}

type heldKey struct {
	version string
	signer  ssh.Signer
}

// SecretMeta is an empty metadata-only Secret, the object a watch of Keys.Versions serves.
func SecretMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	return m
}

// Signer is the admin key held in the Secret called name.
func (k *Keys) Signer(ctx context.Context, name string) (ssh.Signer, error) {
	meta := SecretMeta()
	if err := k.Versions.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: name}, meta); err == nil {
		k.mu.Lock()
		h, ok := k.held[name]
		k.mu.Unlock()
		if ok && h.version == meta.ResourceVersion {
			return h.signer, nil
		}
	}
	// Jobs that start at once on hosts sharing a key read it once.
	v, err, _ := k.flight.Do(name, func() (any, error) { return k.read(ctx, name) })
	if err != nil {
		return nil, err
	}
	return v.(ssh.Signer), nil
}

// read reads the Secret called name from the apiserver and holds its key.
func (k *Keys) read(ctx context.Context, name string) (ssh.Signer, error) {
	var s corev1.Secret
	if err := k.Secrets.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: name}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			k.drop(name)
		}
		return nil, err
	}
	pem, ok := s.Data[config.AdminKeyField]
	if !ok {
		k.drop(name)
		return nil, fmt.Errorf("secret %s/%s has no key %s", k.Namespace, name, config.AdminKeyField)
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		k.drop(name)
		return nil, fmt.Errorf("secret %s/%s, key %s, is not a private key: %w", k.Namespace, name, config.AdminKeyField, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held == nil {
		k.held = map[string]heldKey{}
	}
	k.held[name] = heldKey{version: s.ResourceVersion, signer: signer}
	return signer, nil
}

func (k *Keys) drop(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.held, name)
}
