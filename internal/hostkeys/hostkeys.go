// Package hostkeys records, in a ConfigMap of the controller's namespace, the SSH host key
// berth saw the first time it met each host that has none pinned; afterwards only that key is
// accepted (remote.TrustOnFirstUse). Removing a host's entry lets the next contact record
// anew, after a planned rebuild.
package hostkeys

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ConfigMapName holds the recorded keys: data key = host, value = "<host> <key>".
const ConfigMapName = "berth-known-hosts"

// Store is a remote.KnownHosts kept in a ConfigMap.
type Store struct {
	Client    client.Client
	Namespace string
}

var unsafeKeyChars = regexp.MustCompile(`[^-._a-zA-Z0-9]`)

// dataKey is the host as a ConfigMap key ("[::1]:22" → "___1__22"). The value repeats the
// host, so two hosts whose keys collide are never mistaken for each other.
func dataKey(host string) string { return unsafeKeyChars.ReplaceAllString(host, "_") }

// Lookup returns the key recorded for host.
func (s Store) Lookup(ctx context.Context, host string) (string, bool, error) {
	var cm corev1.ConfigMap
	err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: ConfigMapName}, &cm)
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return parseEntry(cm.Data[dataKey(host)], host)
}

func parseEntry(value, host string) (string, bool, error) {
	if value == "" {
		return "", false, nil
	}
	recordedHost, key, ok := strings.Cut(value, " ")
	if !ok || recordedHost != host {
		return "", false, fmt.Errorf("entry %q of ConfigMap %s is for another host than %s; remove it", dataKey(host), ConfigMapName, host)
	}
	return key, true, nil
}

// Record stores key for host unless a key is on record already, and returns the key on record.
// Concurrent first contacts are settled by the apiserver's optimistic concurrency.
func (s Store) Record(ctx context.Context, host, key string) (string, error) {
	var onRecord string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cm corev1.ConfigMap
		err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: ConfigMapName}, &cm)
		if apierrors.IsNotFound(err) {
			cm = corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: s.Namespace,
					Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}},
				Data: map[string]string{dataKey(host): host + " " + key},
			}
			onRecord = key
			err = s.Client.Create(ctx, &cm)
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), ConfigMapName, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		existing, found, err := parseEntry(cm.Data[dataKey(host)], host)
		if err != nil {
			return err
		}
		if found {
			onRecord = existing
			return nil
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[dataKey(host)] = host + " " + key
		onRecord = key
		return s.Client.Update(ctx, &cm)
	})
	return onRecord, err
}
