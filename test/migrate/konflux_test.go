//go:build stack

package migrate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
)

// konfluxDir is the Konflux layout: berth in the upstream controller's namespace, under its
// names.
const konfluxDir = "config/konflux"

// The names the Konflux layout gives berth's ServiceAccount and Deployments' containers.
const (
	konfluxServiceAccount = "berth-controller"
	konfluxContainer      = "manager"
)

// TestSwitchOverRunbookKonfluxLayout starts from what the upstream controller leaves on a
// Konflux cluster and performs the steps of the runbook's Konflux layout in order: berth
// installed by config/konflux over the upstream controller, in its namespace, reads the
// host-config and Secrets where they are. It ends as the default layout's path does (every old
// TaskRun released and its build user gone, the old secrets and internal TaskRun deleted, a new
// TaskRun's key, redeemed at the key server, logs into the host), with Konflux's metrics
// reader able to scrape the multi_platform_controller_* series, and without a copy of the
// host configuration or anything else of berth's in berth-system.
func TestSwitchOverRunbookKonfluxLayout(t *testing.T) {
	upStack(t)
	doc := readRunbook(t, konfluxLayout)
	host := stack.Fleet.Hosts[0]
	tenant := stacktest.NewTenant(t, stack, "app")
	old := leaveWhatUpstreamLeaves(t, host, tenant.Namespace)
	const berthNS = mpcNamespace
	// What the stack keeps in berth-system (its RBAC, its admin key), which this path must
	// leave as it is.
	untouchedNS := inventory(t, devstack.Namespace)
	layout := renderKonflux(t)
	otpCA, err := tlscerts.NewCA("berth-migrate-otp")
	if err != nil {
		t.Fatal(err)
	}
	var berth, otpServer *exec.Cmd
	var fresh *pipelinev1.TaskRun
	var otpURL, metricsAddr string
	logs := t.TempDir()
	// The certificates the layout's Secrets would hold, in the test's directory: the
	// processes outlive the step that starts them.
	otpDir, metricsDir := filepath.Join(logs, "otp-tls"), filepath.Join(logs, "metrics-tls")
	for _, dir := range []string{otpDir, metricsDir} {
		if _, err := otpCA.WriteDir(dir, "127.0.0.1"); err != nil {
			t.Fatal(err)
		}
	}
	berthLog, otpLog := filepath.Join(logs, "berth.log"), filepath.Join(logs, "otp-server.log")
	t.Cleanup(func() {
		stopAndShowLog(t, berth, berthLog)
		stopAndShowLog(t, otpServer, otpLog)
	})

	steps := []step{
		{"Check the configuration as berth reads it", func(t *testing.T) {
			doc.run(t, "Check the configuration as berth reads it") // exits 1 unless every platform is usable
		}},
		{"Stop the upstream controller", func(t *testing.T) {
			doc.run(t, "Stop the upstream controller")
			upstreamStopped(t)
		}},
		{"Install berth in the upstream controller's place", func(t *testing.T) {
			installKonflux(t, doc, "Install berth in the upstream controller's place", layout)
			replacedInPlace(t, layout)
			// The pods the Deployments would run, played by the built binary with the flags
			// of their containers.
			otpURL, metricsAddr = "https://"+freeLoopbackAddress(t)+"/otp", freeLoopbackAddress(t)
			otpBind := strings.TrimSuffix(strings.TrimPrefix(otpURL, "https://"), "/otp")
			otpServer = startProcess(t, "otp-server", container(t, layout, mpcOTPServer), berthNS, konfluxServiceAccount, otpLog,
				map[string]string{"--bind-address": otpBind, "--cert-dir": otpDir})
			berth = startBerth(t, container(t, layout, mpcDeployment), berthNS, konfluxServiceAccount, berthLog, map[string]string{
				"--metrics-bind-address": metricsAddr,
				"--metrics-cert-dir":     metricsDir,
				"--otp-server-url":       otpURL,
				"--otp-ca-file":          filepath.Join(otpDir, "ca.crt"),
			})
		}},
		{"Check that berth adopted what the upstream controller left", func(t *testing.T) {
			doc.run(t, "Check that berth adopted what the upstream controller left")
			adopted(t, berthNS, host, old)
		}},
		{"Let the adopted TaskRuns end", func(t *testing.T) {
			adoptedEnd(t, berthNS, host, old)
			doc.run(t, "Let the adopted TaskRuns end")
			untouched(t, berthNS, old.provision)
		}},
		{"Remove what the upstream controller left", func(t *testing.T) {
			doc.run(t, "Remove what the upstream controller left")
			leftRemoved(t, old)
			// The chart's host-config stays: berth reads it there.
			var cm corev1.ConfigMap
			get(t, client.ObjectKey{Namespace: mpcNamespace, Name: "host-config"}, &cm)
		}},
		{"Run a new build", func(t *testing.T) {
			fresh = tenant.Create(t, tenant.TaskRun("build-after-switch", platform))
			s := newBuildsSecret(t, berthNS, host, fresh)
			// The layout's controller writes the one-time-token shape: the key is had from
			// the key server, once.
			if _, ok := s.Data["id_rsa"]; ok || string(s.Data["otp-server"]) != otpURL || len(s.Data["otp"]) == 0 {
				t.Fatalf("the new TaskRun's secret holds %v, otp-server %q; want a token for %s and no key", slices.Sorted(maps.Keys(s.Data)), s.Data["otp-server"], otpURL)
			}
			status, key, err := stacktest.Redeem(otpURL, s.Data["otp-ca"], string(s.Data["otp"]))
			if err != nil || status != http.StatusOK {
				t.Fatalf("redeeming the new TaskRun's token: %d %q, %v", status, key, err)
			}
			withKey := s.DeepCopy()
			withKey.Data["id_rsa"] = key
			loginWorks(t, host, *withKey)
		}},
		{"Check that Konflux's monitoring sees berth", func(t *testing.T) {
			series := scrapeAsKonflux(t, metricsAddr)
			for _, want := range []string{
				`multi_platform_controller_provisioning_successes{platform="linux-s390x"}`,
				`multi_platform_controller_running_tasks{platform="linux-s390x",taskrun_namespace="` + tenant.Namespace + `"}`,
			} {
				if !slices.Contains(series, want) {
					t.Errorf("Konflux's metrics reader does not see %s among berth's series:\n%s", want, strings.Join(series, "\n"))
				}
			}
		}},
	}
	if !runSteps(t, doc, steps) {
		return
	}
	afterTheSwitch(t, doc, berthNS, host, tenant.Namespace, old, fresh)

	// Nothing was copied: berth read the chart's ConfigMap and the Secrets where they are, and
	// made nothing in berth-system.
	if now := inventory(t, devstack.Namespace); !slices.Equal(now, untouchedNS) {
		t.Errorf("berth-system changed during the switch:\nbefore: %q\nafter:  %q", untouchedNS, now)
	}
	var configs corev1.ConfigMapList
	if err := admin().List(context.Background(), &configs, client.HasLabels{contract.ConfigLabel}); err != nil {
		t.Fatal(err)
	}
	if len(configs.Items) != 1 || configs.Items[0].Namespace != mpcNamespace {
		var where []string
		for _, cm := range configs.Items {
			where = append(where, cm.Namespace+"/"+cm.Name)
		}
		t.Errorf("host configurations on the cluster: %v; want the chart's alone", where)
	}
	stopBerth(t, berth)
	stopBerth(t, otpServer)
}

// renderKonflux builds config/konflux as `kubectl apply -k` and the release's
// berth-<version>-konflux.yaml do.
func renderKonflux(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, konfluxDir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", konfluxDir, err)
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

// container is the one container of the layout's Deployment name.
func container(t *testing.T, layout []*unstructured.Unstructured, name string) corev1.Container {
	t.Helper()
	for _, o := range layout {
		if o.GetKind() != "Deployment" || o.GetName() != name {
			continue
		}
		var d appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
			t.Fatal(err)
		}
		if cs := d.Spec.Template.Spec.Containers; len(cs) == 1 {
			return cs[0]
		}
		t.Fatalf("the layout's Deployment %s has %d containers; want one", name, len(d.Spec.Template.Spec.Containers))
	}
	t.Fatalf("the layout installs no Deployment %s", name)
	return corev1.Container{}
}

// installKonflux runs the install step's commands with the layout, rendered, as the release
// file they name. Two things are the test ground's: the webhook's registration stays the
// stack's (its apiserver calls the binary on a loopback address; the layout's names a Service
// no pod backs here), and the rollouts the step waits for are the binaries startBerth runs.
func installKonflux(t *testing.T, doc runbookDoc, step string, layout []*unstructured.Unstructured) {
	t.Helper()
	const releaseFile = "berth-<version>-konflux.yaml"
	var file bytes.Buffer
	webhooks := 0
	for _, o := range layout {
		if o.GetKind() == "MutatingWebhookConfiguration" {
			webhooks++
			continue
		}
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		file.WriteString("---\n")
		file.Write(data)
	}
	if webhooks != 1 {
		t.Fatalf("the layout registers %d webhooks; want berth's one", webhooks)
	}
	path := filepath.Join(t.TempDir(), "berth-konflux.yaml")
	if err := os.WriteFile(path, file.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	script := doc.script(t, step)
	if !strings.Contains(script, releaseFile) {
		t.Fatalf("the step %q applies no %s:\n%s", step, releaseFile, script)
	}
	var kept []string
	var waits []string
	for line := range strings.Lines(strings.ReplaceAll(script, releaseFile, path)) {
		if strings.HasPrefix(line, "kubectl rollout status ") {
			waits = append(waits, strings.TrimSpace(line))
			continue
		}
		kept = append(kept, line)
	}
	for _, d := range []string{mpcDeployment, mpcOTPServer} {
		if !slices.ContainsFunc(waits, func(w string) bool { return strings.Contains(w, "deployment/"+d+" ") }) {
			t.Errorf("the step %q does not wait for the rollout of %s: %q", step, d, waits)
		}
	}
	doc.runScript(t, step, strings.Join(kept, ""))
}

// replacedInPlace checks that berth's Deployments and Services took the upstream controller's
// places whole: nothing of upstream's manifests that berth's do not set is left in them (a
// field another field manager owns stays through a server-side apply), and upstream's
// metrics Service, which would select berth's pods too, is gone.
func replacedInPlace(t *testing.T, layout []*unstructured.Unstructured) {
	t.Helper()
	for _, name := range []string{mpcDeployment, mpcOTPServer} {
		want := container(t, layout, name)
		var d appsv1.Deployment
		get(t, client.ObjectKey{Namespace: mpcNamespace, Name: name}, &d)
		spec := d.Spec.Template.Spec
		if len(spec.Containers) != 1 || !slices.Equal(spec.Containers[0].Command, want.Command) || spec.ServiceAccountName != konfluxServiceAccount {
			t.Errorf("Deployment %s runs %d containers, the first %q, as %s; want berth's one", name, len(spec.Containers), spec.Containers[0].Command, spec.ServiceAccountName)
		}
		c := spec.Containers[0]
		var ports []string
		for _, p := range c.Ports {
			if !slices.ContainsFunc(want.Ports, func(w corev1.ContainerPort) bool { return w.ContainerPort == p.ContainerPort && w.Name == p.Name }) {
				ports = append(ports, fmt.Sprint(p.Name, ":", p.ContainerPort))
			}
		}
		var volumes []string
		for _, v := range spec.Volumes {
			if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == v.Name && slices.ContainsFunc(want.VolumeMounts, func(w corev1.VolumeMount) bool { return w.Name == m.Name && w.MountPath == m.MountPath })
			}) {
				volumes = append(volumes, v.Name)
			}
		}
		if len(ports) > 0 || len(volumes) > 0 || len(c.Args) != len(want.Args) {
			t.Errorf("Deployment %s keeps upstream's ports %v, volumes %v; args %q", name, ports, volumes, c.Args)
		}
	}
	var services corev1.ServiceList
	if err := admin().List(context.Background(), &services, client.InNamespace(mpcNamespace), client.MatchingLabels{"control-plane": "controller-manager"}); err != nil {
		t.Fatal(err)
	}
	if len(services.Items) != 1 || services.Items[0].Name == mpcMetricsService {
		var names []string
		for _, s := range services.Items {
			names = append(names, s.Name)
		}
		t.Errorf("Services Konflux's ServiceMonitor selects: %v; want berth's metrics Service alone", names)
	}
	var otp corev1.Service
	get(t, client.ObjectKey{Namespace: mpcNamespace, Name: mpcOTPServer}, &otp)
	for _, p := range otp.Spec.Ports {
		if p.TargetPort.String() != "otp" {
			t.Errorf("Service %s sends port %d to %s; want berth's key server's port otp", mpcOTPServer, p.Port, p.TargetPort.String())
		}
	}
}

// scrapeAsKonflux scrapes the controller's metrics as Konflux's monitoring does
// (../shared/real/deploy/mpc-base-common-monitoring.yaml, its ServiceAccount and binding
// created as they are there): with a token of ServiceAccount metrics-reader, bound to the
// ClusterRole the layout installs, skipping certificate verification as its ServiceMonitor
// does. It returns the series (name and labels) with multi_platform_controller_ names.
func scrapeAsKonflux(t *testing.T, addr string) []string {
	t.Helper()
	ctx := context.Background()
	data, err := realdata.File("deploy/mpc-base-common-monitoring.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sa *corev1.ServiceAccount
	bindings := 0
	for _, doc := range strings.Split(string(data), "\n---") {
		var o unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil || o.Object == nil {
			continue
		}
		switch o.GetKind() {
		case "ServiceAccount":
			sa = &corev1.ServiceAccount{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, sa); err != nil {
				t.Fatal(err)
			}
			sa.Namespace = mpcNamespace // as infra-deployments' kustomization puts it
			create(t, sa)
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
				t.Fatal(err)
			}
			for i := range b.Subjects {
				b.Subjects[i].Namespace = mpcNamespace
			}
			create(t, &b)
			bindings++
		}
	}
	if sa == nil || bindings != 1 {
		t.Fatalf("Konflux's monitoring file holds ServiceAccount %v and %d ClusterRoleBindings; want its reader and one binding", sa, bindings)
	}
	user := "system:serviceaccount:" + mpcNamespace + ":" + sa.Name
	eventually(t, user+" may get /metrics", func() (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + mpcNamespace, "system:authenticated"},
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}}
		if err := admin().Create(ctx, review); err != nil {
			return false, err
		}
		return review.Status.Allowed, nil
	})
	req := &authenticationv1.TokenRequest{}
	if err := admin().SubResource("token").Create(ctx, sa, req); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // as Konflux's ServiceMonitor scrapes
	var series []string
	eventually(t, "berth's metrics answer Konflux's reader", func() (bool, error) {
		r, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			return false, err
		}
		r.Header.Set("Authorization", "Bearer "+req.Status.Token)
		resp, err := hc.Do(r)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			return false, fmt.Errorf("%s: %s", resp.Status, body)
		}
		series = nil
		lines := bufio.NewScanner(resp.Body)
		for lines.Scan() {
			if name, _, ok := strings.Cut(lines.Text(), " "); ok && strings.HasPrefix(name, "multi_platform_controller_") {
				series = append(series, name)
			}
		}
		return true, lines.Err()
	})
	return series
}

// inventory names what is in namespace ns of the kinds berth writes or a copy of the host
// configuration would be: ConfigMaps, Secrets, berth's records, Leases, Events.
func inventory(t *testing.T, ns string) []string {
	t.Helper()
	var names []string
	for _, list := range []client.ObjectList{&corev1.ConfigMapList{}, &corev1.SecretList{}, &berthv1.AllocationList{}, &berthv1.BuildHostList{},
		&coordinationv1.LeaseList{}, &corev1.EventList{}} {
		if err := admin().List(context.Background(), list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			t.Fatal(err)
		}
		for _, item := range items {
			o, err := meta.Accessor(item)
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, fmt.Sprintf("%T %s", item, o.GetName()))
		}
	}
	slices.Sort(names)
	return names
}
