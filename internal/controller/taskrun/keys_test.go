//go:build stack

package taskrun_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// secretLog keeps every version of every Secret of a namespace that the apiserver announced.
type secretLog struct {
	mu       sync.Mutex
	versions []*corev1.Secret
}

func recordSecrets(t *testing.T, ns string) *secretLog {
	t.Helper()
	wc, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: stack.ControlPlane.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &corev1.SecretList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(); cancel() })
	l := &secretLog{}
	go func() {
		for ev := range w.ResultChan() {
			if s, ok := ev.Object.(*corev1.Secret); ok && ev.Type != watch.Deleted {
				l.mu.Lock()
				l.versions = append(l.versions, s.DeepCopy())
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// TestNoTenantSecretEverHoldsAKeyButItsTasksOwn drives every platform kind berth serves —
// local, static Linux, Windows and macOS hosts, a cloud platform, an unknown platform — and
// inspects every version of every secret written into the tenant's namespace: none holds an
// admin key, no two tasks share a key, and a key is only ever handed out with a host.
func TestNoTenantSecretEverHoldsAKeyButItsTasksOwn(t *testing.T) {
	hosts := hostsByName()
	cfg := stack.StaticHostConfig(platform, 2, "linux/amd64")
	for name, p := range map[string]string{"win": "windows/amd64", "mac": "darwin/arm64"} {
		prefix := "host." + name + "."
		cfg[prefix+"address"] = hosts[0].Address
		cfg[prefix+"user"] = "root"
		cfg[prefix+"platform"] = p
		cfg[prefix+"secret"] = devstack.AdminKeySecret
		cfg[prefix+"concurrency"] = "2"
	}
	cfg["dynamic-platforms"] = "linux/arm64"
	for k, v := range map[string]string{"type": "aws", "region": "us-east-1", "ami": "ami-0123456789abcdef0",
		"instance-type": "m6g.large", "key-name": "builders", "aws-secret": "aws-account", "ssh-secret": devstack.AdminKeySecret,
		"security-group-id": "sg-0123456789abcdef0", "subnet-id": "subnet-0123456789abcdef0", "max-instances": "2"} {
		cfg["dynamic.linux-arm64."+k] = v
	}
	rv, err := stack.ApplyHostConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "config "+rv+" is in force", func() (bool, error) {
		return controllerEvent("ConfigApplied", "resourceVersion "+rv+":")
	})
	defer applyConfig(t, 2, nil)

	ns := namespace(t)
	log := recordSecrets(t, ns)
	admin := stacktest.AdminPublicKeys(t, c(), devstack.Namespace)
	var trs []*pipelinev1.TaskRun
	for i, p := range []string{platform, platform, "linux/amd64", "windows/amd64", "darwin/arm64", "linux/arm64", "linux/riscv64"} {
		trs = append(trs, create(t, userTaskRun(ns, fmt.Sprintf("p%d", i), p, "")))
	}
	for _, tr := range trs {
		secretOf(t, tr)
		finish(t, tr)
	}
	// The Windows and macOS commands berth tried on a Linux test host left cleans it can
	// never do there.
	stacktest.ForgetHost(t, stack, "win")
	stacktest.ForgetHost(t, stack, "mac")
	settled(t, ns)

	log.mu.Lock()
	defer log.mu.Unlock()
	owner := map[string]string{} // public key → the secret that first held it
	withKey := 0
	for _, s := range log.versions {
		for field, v := range s.Data {
			for _, a := range admin {
				if bytes.Contains(v, a) {
					t.Errorf("secret %s field %s holds an admin public key", s.Name, field)
				}
			}
			signer, err := ssh.ParsePrivateKey(v)
			if err != nil {
				continue
			}
			pub := string(signer.PublicKey().Marshal())
			for _, a := range admin {
				if pub == string(a) {
					t.Errorf("secret %s field %s holds an ADMIN private key", s.Name, field)
				}
			}
			if field != "id_rsa" {
				t.Errorf("secret %s holds a private key in field %s", s.Name, field)
			}
			if len(s.Data["host"]) == 0 || s.Data["host"][0] == '@' {
				t.Errorf("secret %s holds a key but no host to use it on", s.Name)
			}
			if first, ok := owner[pub]; ok && first != s.Name {
				t.Errorf("secrets %s and %s hold the same key", first, s.Name)
			}
			owner[pub] = s.Name
			withKey++
		}
		if s.Labels[contract.SecretLabel] != "true" {
			t.Errorf("secret %s lacks berth's label", s.Name)
		}
	}
	if withKey < 2 {
		t.Fatalf("only %d secret versions held a key: the static platform's two tasks were not served", withKey)
	}
	t.Logf("%d secret versions inspected, %d with a task key", len(log.versions), withKey)
}
