//go:build stack

package taskrun_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// Admin key secrets that carry the task secrets' label (the controller berth replaces requires
// it on them) never enter the controller's cache; the tenants' task secrets do.
func TestLabelledAdminSecretsAreNotCached(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := namespace(t)
	labelled := map[string]string{contract.SecretLabel: "true"}
	admin := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "admin-s390x-cached", Namespace: devstack.Namespace, Labels: labelled},
		Data: map[string][]byte{"id_rsa": []byte("not a key")}}
	task := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: contract.SecretPrefix + "cached", Namespace: ns, Labels: labelled}}
	for _, s := range []*corev1.Secret{admin, task} {
		if err := c().Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c().Delete(context.Background(), s) })
	}
	informers, err := cache.New(stack.ControlPlane.Config, cache.Options{Scheme: controlplane.Scheme(), ByObject: taskrun.CacheOptions(devstack.Namespace).ByObject})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = informers.Start(ctx) }()
	if _, err := informers.GetInformer(ctx, &corev1.Secret{}); err != nil {
		t.Fatal(err)
	}
	if !informers.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	var cached corev1.SecretList
	if err := informers.List(ctx, &cached); err != nil {
		t.Fatal(err)
	}
	var sawTask bool
	for _, s := range cached.Items {
		if s.Namespace == devstack.Namespace {
			t.Errorf("secret %s of the controller's namespace is in the cache", s.Name)
		}
		sawTask = sawTask || client.ObjectKeyFromObject(&s) == client.ObjectKeyFromObject(task)
	}
	if !sawTask {
		t.Errorf("the task secret %s/%s is not in the cache", task.Namespace, task.Name)
	}
}
