package cluster

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// readyInstance is a cluster as the CaaS service leaves it when it is up: phase Ready, the
// API URL, and the kubeconfig and admin password Secrets.
func readyInstance(t *testing.T, space *Space, name string) {
	t.Helper()
	makeInstance(t, space.Namespace, name, "small")
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: space.Namespace, Name: name + "-admin-kubeconfig"}, Data: map[string][]byte{"kubeconfig": []byte("apiVersion: v1\nkind: Config\n")}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: space.Namespace, Name: name + "-admin-password"}, Data: map[string][]byte{"username": []byte("kubeadmin"), "password": []byte("s3cret-pass")}},
	} {
		if err := kube.Create(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	setInstance(t, space, name, "Ready", "", map[string]any{
		"apiServerURL":  "https://api." + name + ".example:6443",
		"kubeconfig":    map[string]any{"name": name + "-admin-kubeconfig"},
		"adminPassword": map[string]any{"name": name + "-admin-password"},
	}, condition("Ready", "True", "Ready", "ready"))
}

func TestKubeconfigWritesTheCredentialsForTheirOwnerOnly(t *testing.T) {
	space, _ := newSpace(t)
	readyInstance(t, space, "run")
	dir := filepath.Join(t.TempDir(), "credentials", "run")
	to := CredentialFiles{Kubeconfig: filepath.Join(dir, "kubeconfig"), Username: filepath.Join(dir, "username"), Password: filepath.Join(dir, "password")}
	url, err := Kubeconfig(context.Background(), space, "run", to)
	if err != nil || url != "https://api.run.example:6443" {
		t.Fatalf("Kubeconfig = %q, %v", url, err)
	}
	for path, want := range map[string]string{to.Kubeconfig: "apiVersion: v1\nkind: Config\n", to.Username: "kubeadmin", to.Password: "s3cret-pass"} {
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("%s holds %q (%v), want the Secret's value", filepath.Base(path), got, err)
		}
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v (%v), want 0600", filepath.Base(path), st.Mode().Perm(), err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Errorf("want only the three files in %s, got %v", dir, entries)
	}

	// A re-run replaces them.
	if _, err := Kubeconfig(context.Background(), space, "run", to); err != nil {
		t.Fatalf("writing the credentials again: %v", err)
	}
}

func TestKubeconfigRefusesAClusterThatIsNotReady(t *testing.T) {
	space, _ := newSpace(t)
	makeInstance(t, space.Namespace, "run", "small")
	setInstance(t, space, "run", "ClusterInstallFailed", "the install job failed", nil)
	_, err := Kubeconfig(context.Background(), space, "run", CredentialFiles{Kubeconfig: filepath.Join(t.TempDir(), "kubeconfig")})
	mustContain(t, "the error", errText(err), "cluster run is not ready (phase ClusterInstallFailed: the install job failed)")
}
