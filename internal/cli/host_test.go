package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/hostkeys"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/tasksecret"
	"github.com/berth-ci/berth/internal/testground/sshhosts"
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

func (e *hostStepEnv) userTaskRun(t *testing.T, name string) *pipelinev1.TaskRun {
	t.Helper()
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.namespace},
		Spec: pipelinev1.TaskRunSpec{
			Params:   pipelinev1.Params{{Name: "PLATFORM", Value: *pipelinev1.NewStructuredValues("linux/s390x")}},
			TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "build", Image: "buildah", Script: "true"}}},
		},
	}
	if err := cp.Client.Create(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

func (e *hostStepEnv) hostArgs(h *sshhosts.Host) []string {
	return []string{"--host", h.Address, "--user", "root", "--ssh-key-file", e.keyFile, "--kubeconfig", e.kubeconfig,
		"--known-hosts-namespace", e.namespace}
}

func (e *hostStepEnv) provision(t *testing.T, h *sshhosts.Host, tr *pipelinev1.TaskRun, sudo string) (string, error) {
	args := append([]string{"host", "provision", "--secret-name", tasksecret.Name(tr.Name), "--taskrun-name", tr.Name,
		"--namespace", tr.Namespace, "--sudo-commands", sudo, "--platform", "linux/s390x", "--instance-tag", "t"}, e.hostArgs(h)...)
	return berth(t, args...)
}

func TestHostProvisionCreatesTheContractSecretAndCleanRemovesTheUser(t *testing.T) {
	env := newHostStepEnv(t, "team-provision")
	h := env.fleet.Hosts[0]
	ctx := context.Background()
	tr := env.userTaskRun(t, "build-s390x")

	if out, err := env.provision(t, h, tr, "/usr/bin/whoami"); err != nil {
		t.Fatalf("provision: %v\n%s", err, out)
	}
	var secret corev1.Secret
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: tr.Namespace, Name: "multi-platform-ssh-build-s390x"}, &secret); err != nil {
		t.Fatal(err)
	}
	user := hostops.LegacyUserName(tr.Namespace, tr.Name)
	if len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].UID != tr.UID || secret.OwnerReferences[0].Kind != "TaskRun" {
		t.Fatalf("the secret is not owned by the TaskRun: %+v", secret.OwnerReferences)
	}
	if secret.Labels[tasksecret.Label] != "true" {
		t.Fatalf("labels %v", secret.Labels)
	}
	if string(secret.Data["host"]) != user+"@"+h.Address || string(secret.Data["user-dir"]) != "/home/"+user+"/build" || len(secret.Data) != 3 {
		t.Fatalf("secret data keys/values wrong: host=%q user-dir=%q keys=%d", secret.Data["host"], secret.Data["user-dir"], len(secret.Data))
	}
	signer, err := ssh.ParsePrivateKey(secret.Data["id_rsa"])
	if err != nil {
		t.Fatalf("id_rsa: %v", err)
	}
	if out, err := h.RunAs(ctx, user, signer, "id -u; sudo -n /usr/bin/whoami"); err != nil || strings.HasPrefix(out, "0\n") || !strings.HasSuffix(out, "root\n") {
		t.Fatalf("logging in with the secret's key: %q %v", out, err)
	}

	// First contact recorded the host's key.
	var known corev1.ConfigMap
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: env.namespace, Name: hostkeys.ConfigMapName}, &known); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(mapValues(known.Data), "\n"), h.Address+" "+strings.TrimSpace(string(ssh.MarshalAuthorizedKey(h.HostKey)))) {
		t.Fatalf("the host key was not recorded: %v", known.Data)
	}

	cleanArgs := append([]string{"host", "clean", "--taskrun-name", tr.Name, "--namespace", tr.Namespace, "--platform", "linux/s390x"}, env.hostArgs(h)...)
	for i := 0; i < 2; i++ {
		if out, err := berth(t, cleanArgs...); err != nil {
			t.Fatalf("clean #%d: %v\n%s", i+1, err, out)
		}
	}
	if out, err := h.Run(ctx, "id "+user); err == nil {
		t.Fatalf("the user survived clean: %s", out)
	}
}

func TestHostProvisionRefusesAChangedHostKeyWithAnEvent(t *testing.T) {
	env := newHostStepEnv(t, "team-hostkey")
	h, other := env.fleet.Hosts[1], env.fleet.Hosts[0]
	ctx := context.Background()
	// The record says the host had another key: as if it had been replaced.
	store := hostkeys.Store{Client: cp.Client, Namespace: env.namespace}
	if _, err := store.Record(ctx, h.Address, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(other.HostKey)))); err != nil {
		t.Fatal(err)
	}
	tr := env.userTaskRun(t, "build-after-rebuild")
	out, err := env.provision(t, h, tr, "")
	if err == nil || !strings.Contains(err.Error(), "host "+h.Address+" presented SSH host key") {
		t.Fatalf("want a refusal naming the host, got %v\n%s", err, out)
	}
	var events eventsv1.EventList
	if err := cp.Client.List(ctx, &events, client.InNamespace(tr.Namespace)); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range events.Items {
		found = found || (e.Regarding.UID == tr.UID && e.Reason == "HostKeyChanged" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, h.Address))
	}
	if !found {
		t.Fatalf("no HostKeyChanged Event on the TaskRun: %+v", events.Items)
	}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: tr.Namespace, Name: tasksecret.Name(tr.Name)}, &corev1.Secret{}); err == nil {
		t.Fatal("a secret was created although the host was refused")
	}
}

func TestHostProvisionRejectsHostileParams(t *testing.T) {
	env := newHostStepEnv(t, "team-hostile")
	h := env.fleet.Hosts[0]
	tr := env.userTaskRun(t, "hostile")
	for _, tc := range []struct{ name, ns, sudo string }{
		{"x'; reboot; '", tr.Namespace, ""},
		{strings.Repeat("a", 300), tr.Namespace, ""},
		{tr.Name, "$(reboot)", ""},
		{tr.Name, tr.Namespace, "/usr/bin/podman\nALL ALL=(ALL) NOPASSWD: ALL"},
	} {
		args := append([]string{"host", "provision", "--secret-name", "s", "--taskrun-name", tc.name, "--namespace", tc.ns,
			"--sudo-commands", tc.sudo}, env.hostArgs(h)...)
		if out, err := berth(t, args...); err == nil {
			t.Errorf("accepted name=%.20q ns=%.20q sudo=%.30q:\n%s", tc.name, tc.ns, tc.sudo, out)
		}
	}
	if out, _ := h.Run(context.Background(), "ls /etc/sudoers.d | grep berth- || true"); strings.TrimSpace(out) != "" {
		t.Fatalf("a hostile request left a sudo rule: %s", out)
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
