package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/hostkeys"
	"github.com/berth-ci/berth/internal/hostops"
)

// hostStepEnv is a user TaskRun, the admin key as the ssh workspace would mount it, and a
// kubeconfig, as a provision TaskRun's step sees them.
type hostStepEnv struct {
	fleet      *sshhosts.Fleet
	keyFile    string
	kubeconfig string
	namespace  string
}

func newHostStepEnv(t *testing.T, namespace string) *hostStepEnv {
	t.Helper()
	f := sshhosts.Shared(t, 2)
	dir := t.TempDir()
	env := &hostStepEnv{fleet: f, keyFile: filepath.Join(dir, "id_rsa"), kubeconfig: filepath.Join(dir, "kubeconfig"), namespace: namespace}
	if err := os.WriteFile(env.keyFile, f.AdminKeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(env.kubeconfig, cp.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cp.EnsureNamespace(context.Background(), namespace); err != nil {
		t.Fatal(err)
	}
	return env
}

func (e *hostStepEnv) hostArgs(h *sshhosts.Host) []string {
	return []string{"--host", h.Address, "--user", "root", "--ssh-key-file", e.keyFile, "--kubeconfig", e.kubeconfig,
		"--known-hosts-namespace", e.namespace}
}

// buildUser is a user name and key pair as the controller makes them for a task.
type buildUser struct {
	name                string
	private, authorized []byte
}

func newBuildUser(t *testing.T, uid string) buildUser {
	t.Helper()
	private, authorized, err := hostops.NewKey(config.DefaultKeyType, "test")
	if err != nil {
		t.Fatal(err)
	}
	return buildUser{name: hostops.UserName(uid, 1), private: private, authorized: authorized}
}

func (e *hostStepEnv) provision(t *testing.T, h *sshhosts.Host, u buildUser, sudo, dirFile string) (string, error) {
	args := append([]string{"host", "provision", "--user-name", u.name, "--authorized-key", strings.TrimSpace(string(u.authorized)),
		"--owner", e.namespace + "/build 0000", "--sudo-commands", sudo, "--platform", "linux/s390x", "--user-dir-file", dirFile}, e.hostArgs(h)...)
	return berth(t, args...)
}

func TestHostProvisionCreatesTheUserAndCleanRemovesIt(t *testing.T) {
	env := newHostStepEnv(t, "team-provision")
	h := env.fleet.Hosts[0]
	ctx := context.Background()
	u := newBuildUser(t, "6a1f3c2e-8b4d-4e5f-9a7c-1d2e3f4a5b6c")
	dirFile := filepath.Join(t.TempDir(), "user-dir")
	if out, err := env.provision(t, h, u, "/usr/bin/whoami", dirFile); err != nil {
		t.Fatalf("provision: %v\n%s", err, out)
	}
	if dir, err := os.ReadFile(dirFile); err != nil || string(dir) != "/home/"+u.name+"/build" {
		t.Fatalf("the user-dir result: %q %v", dir, err)
	}
	signer, err := ssh.ParsePrivateKey(u.private)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h.RunAs(ctx, u.name, signer, "id -u; sudo -n /usr/bin/whoami"); err != nil || strings.HasPrefix(out, "0\n") || !strings.HasSuffix(out, "root\n") {
		t.Fatalf("logging in with the task's key: %q %v", out, err)
	}
	// The step writes no Secret: the controller writes the task's secret itself.
	var secrets corev1.SecretList
	if err := cp.Client.List(ctx, &secrets, client.InNamespace(env.namespace)); err != nil || len(secrets.Items) != 0 {
		t.Fatalf("the provision step wrote secrets: %d %v", len(secrets.Items), err)
	}
	// First contact recorded the host's key.
	var known corev1.ConfigMap
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: env.namespace, Name: hostkeys.ConfigMapName}, &known); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(mapValues(known.Data), "\n"), h.Address+" "+strings.TrimSpace(string(ssh.MarshalAuthorizedKey(h.HostKey)))) {
		t.Fatalf("the host key was not recorded: %v", known.Data)
	}
	// Provisioning the same user again fails and changes nothing.
	again := newBuildUser(t, "6a1f3c2e-8b4d-4e5f-9a7c-1d2e3f4a5b6c")
	if out, err := env.provision(t, h, again, "", dirFile); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("a second provision of %s: %v\n%s", u.name, err, out)
	}
	if _, err := h.RunAs(ctx, u.name, signer, "true"); err != nil {
		t.Fatalf("the first key stopped working: %v", err)
	}

	cleanArgs := append([]string{"host", "clean", "--user-name", u.name, "--platform", "linux/s390x"}, env.hostArgs(h)...)
	for i := 0; i < 2; i++ {
		if out, err := berth(t, cleanArgs...); err != nil {
			t.Fatalf("clean #%d: %v\n%s", i+1, err, out)
		}
	}
	if out, err := h.Run(ctx, "id "+u.name); err == nil {
		t.Fatalf("the user survived clean: %s", out)
	}
}

func TestHostProvisionRefusesAChangedHostKey(t *testing.T) {
	env := newHostStepEnv(t, "team-hostkey")
	h, other := env.fleet.Hosts[1], env.fleet.Hosts[0]
	ctx := context.Background()
	// The record says the host had another key: as if it had been replaced.
	store := hostkeys.Store{Client: cp.Client, Namespace: env.namespace}
	if _, err := store.Record(ctx, h.Address, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(other.HostKey)))); err != nil {
		t.Fatal(err)
	}
	u := newBuildUser(t, "2b3c4d5e-6f70-4812-9a3b-4c5d6e7f8091")
	out, err := env.provision(t, h, u, "", filepath.Join(t.TempDir(), "dir"))
	if err == nil || !strings.Contains(err.Error(), "host "+h.Address+" presented SSH host key") {
		t.Fatalf("want a refusal naming the host, got %v\n%s", err, out)
	}
	if out, err := h.Run(ctx, "id "+u.name); err == nil {
		t.Fatalf("the user was created on a host with a changed key: %s", out)
	}
}

func TestHostProvisionRejectsHostileParams(t *testing.T) {
	env := newHostStepEnv(t, "team-hostile")
	h := env.fleet.Hosts[0]
	u := newBuildUser(t, "3c4d5e6f-7081-4923-8b4c-5d6e7f809102")
	key := strings.TrimSpace(string(u.authorized))
	for _, tc := range []struct{ user, key, sudo string }{
		{"x'; reboot; '", key, ""},
		{"root", key, ""},
		{strings.Repeat("a", 300), key, ""},
		{u.name, "ssh-ed25519 AAAA $(reboot)", ""},
		{u.name, key + "\n" + key, ""},
		{u.name, key, "/usr/bin/podman\nALL ALL=(ALL) NOPASSWD: ALL"},
		{u.name, key, "/usr/bin/env A=B /bin/sh"},
	} {
		args := append([]string{"host", "provision", "--user-name", tc.user, "--authorized-key", tc.key,
			"--sudo-commands", tc.sudo}, env.hostArgs(h)...)
		if out, err := berth(t, args...); err == nil {
			t.Errorf("accepted user=%.20q key=%.30q sudo=%.30q:\n%s", tc.user, tc.key, tc.sudo, out)
		}
	}
	if out, _ := h.Run(context.Background(), "ls /etc/sudoers.d | grep berth- || true; getent passwd | grep '^u-' || true"); strings.TrimSpace(out) != "" {
		t.Fatalf("a hostile request left something on the host: %s", out)
	}
}

func TestHostUpdateWritesResults(t *testing.T) {
	env := newHostStepEnv(t, "team-update")
	h := env.fleet.Hosts[1]
	results := t.TempDir()
	args := append([]string{"host", "update", "--min-free-disk", "1Mi", "--results-dir", results}, env.hostArgs(h)...)
	out, err := berth(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	healthy, _ := os.ReadFile(filepath.Join(results, "healthy"))
	if string(healthy) != "true" {
		t.Fatalf("healthy=%q\n%s", healthy, out)
	}
	args = append([]string{"host", "update", "--maintenance-command", "echo disk checker failed >&2; false", "--results-dir", results}, env.hostArgs(h)...)
	if out, err := berth(t, args...); err != nil {
		t.Fatalf("an unhealthy host is a result, not a failed step: %v\n%s", err, out)
	}
	healthy, _ = os.ReadFile(filepath.Join(results, "healthy"))
	reason, _ := os.ReadFile(filepath.Join(results, "reason"))
	if string(healthy) != "false" || !strings.Contains(string(reason), "disk checker failed") {
		t.Fatalf("healthy=%q reason=%q", healthy, reason)
	}
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
