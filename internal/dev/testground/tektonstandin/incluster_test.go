package tektonstandin

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// keyValues reads a result of key=value lines.
func keyValues(s string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		k, v, _ := strings.Cut(line, "=")
		out[k] = v
	}
	return out
}

// tokenVolume is the pod's ServiceAccount token volume, nil if it has none.
func tokenVolume(p *corev1.Pod) *corev1.Volume {
	for i, v := range p.Spec.Volumes {
		if strings.HasPrefix(v.Name, serviceAccountVolumePrefix) {
			return &p.Spec.Volumes[i]
		}
	}
	return nil
}

func podOfRun(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := cp.Client.Get(context.Background(), types.NamespacedName{Namespace: tr.Namespace, Name: tr.Status.PodName}, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// A step of berth's image runs a program of that image from its PATH, and the program's
// rest.InClusterConfig acts as the TaskRun's ServiceAccount with a token bound to the pod:
// allowed what the ServiceAccount's Role allows, Forbidden anything else. A step of another
// image has the same credentials but not the image's programs.
func TestStepActsAsItsServiceAccount(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	ns := namespace(t)
	elsewhere := ns + "-elsewhere"
	if err := cp.EnsureNamespace(ctx, elsewhere); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(berthImageDir, "inclusterprobe"), "./testdata/inclusterprobe")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, out)
	}
	create(t,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "cluster-tasks", Namespace: ns}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "visible", Namespace: ns}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps", Namespace: ns},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "cluster-tasks", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-configmaps"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "cluster-tasks", Namespace: ns}}},
	)
	// The apiserver's authorizer learns of a new binding from its own watch; wait until it has.
	asTasks, err := client.New(cp.ConfigFor(ns, "cluster-tasks"), client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return asTasks.Get(ctx, types.NamespacedName{Namespace: ns, Name: "visible"}, &corev1.ConfigMap{}) == nil, nil
	}); err != nil {
		t.Fatal("the ServiceAccount's RoleBinding never took effect")
	}

	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: "in-cluster", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{ServiceAccountName: "cluster-tasks", TaskSpec: &pipelinev1.TaskSpec{
			Results: []pipelinev1.TaskResult{{Name: "probe"}, {Name: "plain"}},
			Steps: []pipelinev1.Step{
				{Name: "probe", Image: berthImage + ":latest", Script: `
printf 'path=%s\n' "$(command -v inclusterprobe)" > $(results.probe.path)
inclusterprobe ` + elsewhere + ` >> $(results.probe.path)`},
				{Name: "plain", Image: "registry.invalid/tools:1", Script: `
sa=/var/run/secrets/kubernetes.io/serviceaccount
printf 'path=%s\n' "$(command -v inclusterprobe || true)" > $(results.plain.path)
printf 'files=%s\n' "$(ls $sa | tr '\n' ' ')" >> $(results.plain.path)
printf 'namespace=%s\n' "$(cat $sa/namespace)" >> $(results.plain.path)
printf 'service=%s:%s\n' "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT" >> $(results.plain.path)`},
			}}},
	}
	create(t, tr)
	got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
	if !got.IsSuccessful() {
		t.Fatalf("the run failed: %s", condition(got).Message)
	}
	probe := keyValues(result(got, "probe"))
	for k, want := range map[string]string{
		"path":                      "/usr/local/bin/inclusterprobe",
		"user":                      "system:serviceaccount:" + ns + ":cluster-tasks",
		"pod":                       got.Status.PodName,
		"get-configmap":             "ok",
		"list-configmaps-elsewhere": string(metav1.StatusReasonForbidden),
		"list-secrets":              string(metav1.StatusReasonForbidden),
	} {
		if probe[k] != want {
			t.Errorf("berth's image step: %s=%q, want %q", k, probe[k], want)
		}
	}
	api, err := apiServerOf(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	plain := keyValues(result(got, "plain"))
	for k, want := range map[string]string{
		"path":      "",
		"files":     "ca.crt namespace token ",
		"namespace": ns,
		"service":   api.host + ":" + api.port,
	} {
		if plain[k] != want {
			t.Errorf("another image's step: %s=%q, want %q", k, plain[k], want)
		}
	}

	// The pod shows what the ServiceAccount admission plugin would have made of it.
	p := podOfRun(t, got)
	v := tokenVolume(p)
	if p.Spec.AutomountServiceAccountToken != nil || v == nil || v.Projected == nil || len(v.Projected.Sources) != 3 ||
		v.Projected.Sources[0].ServiceAccountToken == nil || v.Projected.Sources[1].ConfigMap.Name != rootCAConfigMap {
		t.Fatalf("pod spec lacks the token volume a real pod gets: automount %v, volumes %+v", p.Spec.AutomountServiceAccountToken, p.Spec.Volumes)
	}
	for _, c := range p.Spec.Containers {
		if !mountsAt(c.VolumeMounts, serviceAccountMountPath) {
			t.Errorf("container %s does not mount the token at %s", c.Name, serviceAccountMountPath)
		}
	}
}

// automountServiceAccountToken: false, on the TaskRun's podTemplate or on the ServiceAccount,
// leaves the steps without a token, as it leaves a pod; the podTemplate's word wins.
func TestAutomountFalseLeavesNoToken(t *testing.T) {
	needRoot(t)
	ns := namespace(t)
	create(t,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "no-token", Namespace: ns}, AutomountServiceAccountToken: ptr(false)})
	for _, tc := range []struct {
		name, serviceAccount string
		podTemplate          *bool
		want                 string
	}{
		{name: "pod-template-false", podTemplate: ptr(false), want: "none"},
		{name: "service-account-false", serviceAccount: "no-token", want: "none"},
		{name: "pod-template-overrides", serviceAccount: "no-token", podTemplate: ptr(true), want: "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &pipelinev1.TaskRun{
				ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: ns},
				Spec: pipelinev1.TaskRunSpec{ServiceAccountName: tc.serviceAccount, TaskSpec: &pipelinev1.TaskSpec{
					Results: []pipelinev1.TaskResult{{Name: "token"}, {Name: "host"}},
					Steps: []pipelinev1.Step{{Name: "look", Image: berthImage, Script: `
if [ -e /var/run/secrets/kubernetes.io/serviceaccount/token ]; then echo -n token; else echo -n none; fi > $(results.token.path)
echo -n "$KUBERNETES_SERVICE_HOST" > $(results.host.path)`}},
				}},
			}
			if tc.podTemplate != nil {
				tr.Spec.PodTemplate = &pod.Template{AutomountServiceAccountToken: tc.podTemplate}
			}
			create(t, tr)
			got := waitFor(t, client.ObjectKeyFromObject(tr), "finished", done)
			if !got.IsSuccessful() {
				t.Fatalf("the run failed: %s", condition(got).Message)
			}
			if token := result(got, "token"); token != tc.want {
				t.Errorf("the step found %s, want %s", token, tc.want)
			}
			if result(got, "host") == "" {
				t.Error("KUBERNETES_SERVICE_HOST is unset; the kubelet sets it with or without a token")
			}
			p := podOfRun(t, got)
			if hasVolume := tokenVolume(p) != nil; hasVolume != (tc.want == "token") {
				t.Errorf("pod has a token volume: %v, want %v", hasVolume, tc.want == "token")
			}
			if a := p.Spec.AutomountServiceAccountToken; (a == nil) != (tc.podTemplate == nil) || (a != nil && *a != *tc.podTemplate) {
				t.Errorf("pod's automountServiceAccountToken %v, want the podTemplate's %v", p.Spec.AutomountServiceAccountToken, tc.podTemplate)
			}
		})
	}
}

func TestImageReferenceMatching(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const other = "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	s := New(Options{Images: map[string]string{
		"ghcr.io/berth-ci/berth":           "/any-berth",
		"ghcr.io/berth-ci/berth:v1":        "/berth-v1",
		"ghcr.io/berth-ci/berth@" + digest: "/berth-pinned",
		"busybox:latest":                   "/busybox",
		"registry.local:5000/tools":        "/tools",
	}})
	for image, want := range map[string]string{
		"ghcr.io/berth-ci/berth":              "/any-berth",
		"ghcr.io/berth-ci/berth:latest":       "/any-berth",
		"ghcr.io/berth-ci/berth@" + other:     "/any-berth",
		"ghcr.io/berth-ci/berth:v1":           "/berth-v1",
		"ghcr.io/berth-ci/berth:v1@" + other:  "/berth-v1",
		"ghcr.io/berth-ci/berth:v1@" + digest: "/berth-pinned",
		"ghcr.io/berth-ci/berth@" + digest:    "/berth-pinned",
		"ghcr.io/berth-ci/berth-other:v1":     "",
		"quay.io/berth-ci/berth:v1":           "",
		"busybox":                             "/busybox",
		"docker.io/library/busybox":           "/busybox",
		"docker.io/busybox:latest":            "/busybox",
		"busybox:1.36":                        "",
		"busybox@" + digest:                   "", // a digest alone says nothing of the tag
		"registry.local:5000/tools:2":         "/tools",
		"registry.local/tools":                "",
	} {
		if got := s.imageDir(image); got != want {
			t.Errorf("%s: directory %q, want %q", image, got, want)
		}
	}
}
