package deploy

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

const konfluxDir = "config/konflux"

// konfluxNamespace is where Konflux installs the controller berth replaces, and so where its
// chart renders host-config and its ExternalSecrets write berth's Secrets.
const konfluxNamespace = "multi-platform-controller"

// konfluxCluster renders config/konflux as a Konflux cluster would hold it after the switch:
// with Konflux's own files beside it, read unchanged from ../shared/real (copied into a
// temporary overlay only because kustomize reads no file outside its root): the monitoring
// that scrapes the controller, the production resources patch of the controller's
// Deployment, and the rendered host-config of stone-prd-rh01.
func konfluxCluster(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	real, err := realdata.Dir()
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	copyReal := func(from, to string) string {
		data, err := os.ReadFile(filepath.Join(real, from))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(overlay, to), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return to
	}
	layout, err := filepath.Rel(overlay, filepath.Join(repoRoot(t), konfluxDir))
	if err != nil {
		t.Fatal(err)
	}
	k := kustypes.Kustomization{
		Resources: []string{layout,
			copyReal("deploy/mpc-base-common-monitoring.yaml", "monitoring.yaml"),
			copyReal("host-config/rendered/production-stone-prd-rh01.yaml", "host-config.yaml")},
		Patches: []kustypes.Patch{{Path: copyReal("deploy/mpc-production-stone-prd-rh01-manager_resources_patch.yaml", "manager_resources_patch.yaml")}},
	}
	// As Konflux's base names it (deploy/mpc-base-kustomization.yaml): everything of the
	// controller in its namespace.
	k.Namespace = konfluxNamespace
	data, err := yaml.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build of config/konflux with Konflux's files: %v", err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range resources.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// The Konflux layout installs berth where and as Konflux's operations expect the controller it
// replaces, so that their own files keep working unchanged: the Deployments the availability
// rules watch exist under their names, the production resources patch lands on the controller's
// one container, the real ServiceMonitor selects a Service whose https port reaches the port the
// controller serves its metrics on, the metrics-reader binding names a ClusterRole that grants
// get on /metrics, the chart's host-config is in berth's namespace, and nothing still names
// berth-system.
func TestKonfluxLayoutKeepsKonfluxsFilesWorking(t *testing.T) {
	objs := konfluxCluster(t)
	real, err := realdata.Dir()
	if err != nil {
		t.Fatal(err)
	}
	deployments := map[string]appsv1.Deployment{}
	for _, d := range ofKind[appsv1.Deployment](t, objs, "Deployment") {
		deployments[d.Namespace+"/"+d.Name] = d
	}

	// The availability recording rules: each names a namespace and a Deployment.
	watched := regexp.MustCompile(`namespace="([^"]+)",\s*deployment="([^"]+)"`)
	var names []string
	for _, file := range []string{"o11y/multi_platform_controller_availability_recording_rules.yaml", "o11y/one_time_password_recording_rules.yaml"} {
		data, err := os.ReadFile(filepath.Join(real, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range watched.FindAllStringSubmatch(string(data), -1) {
			names = append(names, m[1]+"/"+m[2])
		}
	}
	if len(names) < 2 {
		t.Fatalf("the availability rules name %v; want the controller's and the key server's Deployments", names)
	}
	for _, name := range names {
		d, ok := deployments[name]
		if !ok {
			t.Errorf("the availability rules watch Deployment %s, which the layout does not install", name)
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Image == "" {
				t.Errorf("Deployment %s has container %s without an image: a patch met no container of that name", name, c.Name)
			}
		}
	}

	// The production resources patch: merged into the controller's container, not added as a
	// second one.
	controller := deployments[konfluxNamespace+"/multi-platform-controller"]
	if cs := controller.Spec.Template.Spec.Containers; len(cs) != 1 || cs[0].Name != "manager" || cs[0].Resources.Limits.Memory().String() != "20Gi" {
		var got []string
		for _, c := range cs {
			got = append(got, c.Name+" (memory limit "+c.Resources.Limits.Memory().String()+")")
		}
		t.Errorf("the controller's containers after Konflux's resources patch: %v; want one, manager, with its 20Gi", got)
	}

	// Applied over upstream's Deployment in place: a Deployment's selector cannot change, so it
	// must be upstream's, which upstream's own metrics Service (in Konflux's copy) selects by.
	upstreamService := map[string]any{}
	data, err := os.ReadFile(filepath.Join(real, "deploy/mpc-repo-operator-metrics_service.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &upstreamService); err != nil {
		t.Fatal(err)
	}
	upstreamSelector, _, _ := unstructured.NestedStringMap(upstreamService, "spec", "selector")
	if s := controller.Spec.Selector; s == nil || len(upstreamSelector) == 0 || !maps.Equal(s.MatchLabels, upstreamSelector) || len(s.MatchExpressions) > 0 {
		t.Errorf("the controller's selector is %v; want upstream's %v, or applying over its Deployment is refused", s, upstreamSelector)
	}

	// The ServiceMonitor's Service, port and the controller's metrics behind it.
	monitors := 0
	for _, o := range objs {
		if o.GetKind() != "ServiceMonitor" {
			continue
		}
		monitors++
		selector, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
		endpoints, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
		if len(endpoints) == 0 {
			t.Fatalf("ServiceMonitor %s has no endpoints", o.GetName())
		}
		port, _, _ := unstructured.NestedString(endpoints[0].(map[string]any), "port")
		scraped := false
		for _, svc := range ofKind[corev1.Service](t, objs, "Service") {
			if svc.Namespace != o.GetNamespace() || !labels.SelectorFromSet(selector).Matches(labels.Set(svc.Labels)) {
				continue
			}
			for _, p := range svc.Spec.Ports {
				if p.Name != port {
					continue
				}
				for _, d := range deployments {
					if d.Namespace != svc.Namespace || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
						continue
					}
					c := d.Spec.Template.Spec.Containers[0]
					for _, cp := range c.Ports {
						if targetsPort(c, p.TargetPort, cp.ContainerPort) && slices.Contains(c.Args, "--metrics-bind-address=:"+itoa(cp.ContainerPort)) {
							scraped = true
						}
					}
				}
			}
		}
		if !scraped {
			t.Errorf("ServiceMonitor %s (selector %v, port %s) reaches no port the controller serves its metrics on", o.GetName(), selector, port)
		}
	}
	if monitors != 1 {
		t.Fatalf("%d ServiceMonitors in Konflux's monitoring file; want the one", monitors)
	}

	// The metrics reader's binding.
	roles := map[string]rbacv1.ClusterRole{}
	for _, r := range ofKind[rbacv1.ClusterRole](t, objs, "ClusterRole") {
		roles[r.Name] = r
	}
	for _, b := range ofKind[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding") {
		if !strings.HasPrefix(b.Name, "prometheus-") {
			continue
		}
		role, ok := roles[b.RoleRef.Name]
		if !ok || !grantsMetrics(role) {
			t.Errorf("Konflux's binding %s names ClusterRole %s, which the layout does not install granting get on /metrics", b.Name, b.RoleRef.Name)
		}
	}

	// The chart's host-config and everything else in one namespace, berth's.
	for _, o := range objs {
		if ns := o.GetNamespace(); ns != "" && ns != konfluxNamespace {
			t.Errorf("%s %s is in namespace %s, not %s", o.GetKind(), o.GetName(), ns, konfluxNamespace)
		}
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "berth-system") {
			t.Errorf("%s %s still names berth-system", o.GetKind(), o.GetName())
		}
	}
	configs := 0
	for _, cm := range ofKind[corev1.ConfigMap](t, objs, "ConfigMap") {
		if cm.Name == "host-config" {
			configs++
		}
	}
	if configs != 1 {
		t.Errorf("%d host-config ConfigMaps in the layout's namespace; want the chart's one", configs)
	}

	// The key server the controller sends tasks to: the Service of the URL, its port, and the
	// key server Deployment listening behind it.
	var url string
	for _, a := range controller.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--otp-server-url="); ok {
			url = v
		}
	}
	host, _, _ := strings.Cut(strings.TrimPrefix(url, "https://"), "/")
	otp, ok := deployments[konfluxNamespace+"/multi-platform-otp-server"]
	if !ok || host != "multi-platform-otp-server."+konfluxNamespace+".svc" {
		t.Fatalf("the controller sends tasks to %q; want the Service of Deployment multi-platform-otp-server", url)
	}
	served := false
	for _, svc := range ofKind[corev1.Service](t, objs, "Service") {
		if svc.Name != "multi-platform-otp-server" {
			continue
		}
		c := otp.Spec.Template.Spec.Containers[0]
		for _, p := range svc.Spec.Ports {
			for _, cp := range c.Ports {
				if p.Port == 443 && targetsPort(c, p.TargetPort, cp.ContainerPort) && slices.Contains(c.Args, "--bind-address=:"+itoa(cp.ContainerPort)) &&
					labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(otp.Spec.Template.Labels)) {
					served = true
				}
			}
		}
	}
	if !served {
		t.Error("no Service multi-platform-otp-server on port 443 reaches the key server's listening port")
	}
}

// konfluxOnly is what config/konflux runs that config/default does not: its Deployments, for the
// image test to start each as the kubelet would.
func konfluxOnly(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, o := range render(t, konfluxDir) {
		if o.GetKind() == "Deployment" {
			out = append(out, o)
		}
	}
	return out
}

// grantsMetrics tells whether a ClusterRole grants get on /metrics.
func grantsMetrics(r rbacv1.ClusterRole) bool {
	for _, rule := range r.Rules {
		if slices.Contains(rule.NonResourceURLs, "/metrics") && slices.Contains(rule.Verbs, "get") {
			return true
		}
	}
	return false
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// checkKonfluxFile checks the Konflux layout's install file make release wrote: config/konflux,
// every object of it and nothing else, every image pinned as the release's.
func checkKonfluxFile(t *testing.T, path, pinned string) {
	t.Helper()
	objs := readManifests(t, path)
	checkPinned(t, objs, pinned)
	var got, want []string
	for _, o := range objs {
		got = append(got, key(o))
	}
	for _, o := range render(t, konfluxDir) {
		want = append(want, key(o))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the Konflux install file holds %v; want config/konflux's %v", got, want)
	}
}
