package adminkeys

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { os.Exit(controlplane.RunTests(m, &cp)) }

// countingReader counts the reads that reach the apiserver.
type countingReader struct {
	client.Reader
	reads atomic.Int32
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

func newKey(t *testing.T) (pemBytes []byte, public ssh.PublicKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block), signer.PublicKey()
}

// startKeys watches namespace's Secrets' metadata as the controller does, until the test ends.
func startKeys(t *testing.T, namespace string) (*Keys, *countingReader) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	versions, err := cache.New(cp.Config, cache.Options{Scheme: controlplane.Scheme(),
		DefaultNamespaces: map[string]cache.Config{namespace: {}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := versions.GetInformer(ctx, SecretMeta()); err != nil {
		t.Fatal(err)
	}
	go func() { _ = versions.Start(ctx) }()
	if !versions.WaitForCacheSync(ctx) {
		t.Fatal("the metadata cache never synced")
	}
	reads := &countingReader{Reader: cp.Client}
	return &Keys{Versions: versions, Secrets: reads, Namespace: namespace}, reads
}

// seen waits until the watch shows the Secret at version rv ("" for gone).
func seen(t *testing.T, k *Keys, name, rv string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		meta := SecretMeta()
		err := k.Versions.Get(context.Background(), client.ObjectKey{Namespace: k.Namespace, Name: name}, meta)
		if rv == "" && apierrors.IsNotFound(err) || err == nil && meta.ResourceVersion == rv {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch never showed secret %s at version %q (last: %q, %v)", name, rv, meta.ResourceVersion, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// signsWith asks jobs times for the key of Secret name and wants the key of want each time.
func signsWith(t *testing.T, k *Keys, jobs int, name string, want ssh.PublicKey) {
	t.Helper()
	for range jobs {
		got, err := k.Signer(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.PublicKey().Marshal(), want.Marshal()) {
			t.Fatalf("signer's key is %s, want %s", ssh.FingerprintSHA256(got.PublicKey()), ssh.FingerprintSHA256(want))
		}
	}
}

// A key is read from the apiserver once, then taken from what is held for as long as the
// Secret does not change; a rotated key is read again and used, a deleted one is refused.
func TestAKeyIsReadOnceAndFollowsItsSecret(t *testing.T) {
	ctx := context.Background()
	const ns = "keys-follow"
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	first, firstPub := newKey(t)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "host-admin", Namespace: ns},
		Data: map[string][]byte{config.AdminKeyField: first}}
	if err := cp.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	k, reads := startKeys(t, ns)
	seen(t, k, "host-admin", secret.ResourceVersion)
	signsWith(t, k, 50, "host-admin", firstPub)
	if n := reads.reads.Load(); n != 1 {
		t.Fatalf("50 jobs read the admin key %d times from the apiserver, want once", n)
	}

	second, secondPub := newKey(t)
	secret.Data[config.AdminKeyField] = second
	if err := cp.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	seen(t, k, "host-admin", secret.ResourceVersion)
	signsWith(t, k, 10, "host-admin", secondPub)
	if n := reads.reads.Load(); n != 2 {
		t.Fatalf("after one rotation the key was read %d times, want twice", n)
	}

	if err := cp.Client.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	seen(t, k, "host-admin", "")
	if _, err := k.Signer(ctx, "host-admin"); !apierrors.IsNotFound(err) {
		t.Fatalf("a deleted admin key gave %v, want not found", err)
	}
	if _, held := k.held["host-admin"]; held {
		t.Fatal("a deleted admin key is still held")
	}
}

// A Secret without a usable key is an error that names it, and nothing is held for it.
func TestASecretWithoutAKeyIsAClearError(t *testing.T) {
	ctx := context.Background()
	const ns = "keys-bad"
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]map[string][]byte{
		"no-key":  {"ssh-privatekey": []byte("x")},
		"not-pem": {config.AdminKeyField: []byte("not a key")},
	} {
		if err := cp.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	k, _ := startKeys(t, ns)
	for name, want := range map[string]string{"no-key": "has no key id_rsa", "not-pem": "is not a private key"} {
		_, err := k.Signer(ctx, name)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), ns+"/"+name) {
			t.Errorf("secret %s: error %v, want one naming it and saying %q", name, err, want)
		}
		if _, held := k.held[name]; held {
			t.Errorf("secret %s: a key is held", name)
		}
	}
}
