package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CredentialFiles are where Kubeconfig writes a cluster's credentials; an empty path writes
// nothing of that kind.
type CredentialFiles struct {
	Kubeconfig, Username, Password string
}

// Kubeconfig writes a ready cluster's kubeconfig and its admin user's name and password to
// files only their owner may read, and returns the cluster's API URL. It never prints them.
func Kubeconfig(ctx context.Context, space *Space, name string, to CredentialFiles) (string, error) {
	inst, err := getInstance(ctx, space, name)
	if err != nil {
		return "", fmt.Errorf("reading ClusterTemplateInstance %s/%s: %w", space.Namespace, name, err)
	}
	if !inst.Ready() {
		return "", fmt.Errorf("cluster %s is not ready (%s); it has no credentials to hand out", name, inst.stuckIn())
	}
	kubeconfig, err := secretValues(ctx, space, inst, "kubeconfig", inst.KubeconfigSecret, kubeconfigKey)
	if err != nil {
		return "", err
	}
	url := inst.APIServerURL
	if url == "" {
		url, err = serverOf(kubeconfig[0])
		if err != nil {
			return "", fmt.Errorf("the kubeconfig of cluster %s: %w", name, err)
		}
	}
	files := []privateFile{{to.Kubeconfig, kubeconfig[0]}}
	if to.Username != "" || to.Password != "" {
		admin, err := secretValues(ctx, space, inst, "admin password", inst.AdminPasswordSecret, usernameKey, passwordKey)
		if err != nil {
			return "", err
		}
		files = append(files, privateFile{to.Username, admin[0]}, privateFile{to.Password, admin[1]})
	}
	for _, f := range files {
		if f.path == "" {
			continue
		}
		if err := writePrivate(f.path, f.data); err != nil {
			return "", err
		}
	}
	return url, nil
}

type privateFile struct {
	path string
	data []byte
}

// secretValues reads keys of a Secret the instance names in its status.
func secretValues(ctx context.Context, space *Space, inst Instance, what, secret string, keys ...string) ([][]byte, error) {
	if secret == "" {
		return nil, fmt.Errorf("%s names no %s Secret", inst.ref(), what)
	}
	var s corev1.Secret
	if err := space.Client.Get(ctx, client.ObjectKey{Namespace: space.Namespace, Name: secret}, &s); err != nil {
		return nil, fmt.Errorf("reading the %s Secret %s/%s of cluster %s: %w", what, space.Namespace, secret, inst.Name, err)
	}
	out := make([][]byte, len(keys))
	for i, k := range keys {
		if len(s.Data[k]) == 0 {
			return nil, fmt.Errorf("the %s Secret %s/%s of cluster %s has no key %q", what, space.Namespace, secret, inst.Name, k)
		}
		out[i] = s.Data[k]
	}
	return out, nil
}

func serverOf(kubeconfig []byte) (string, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return "", err
	}
	return cfg.Host, nil
}

// writePrivate replaces a file with data, readable by its owner only from the first byte on:
// a temporary file (created 0600) renamed over the path, so no reader sees half of it.
func writePrivate(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // after a successful rename there is nothing left to remove
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
