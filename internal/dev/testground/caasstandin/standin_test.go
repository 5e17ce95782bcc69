package caasstandin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

var (
	cp      *controlplane.ControlPlane
	standIn *StandIn
)

// Booting a cluster takes seconds: the tests boot two (ready, and credentials present).
func TestMain(m *testing.M) {
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// runTests stops the stand-in before the package's control plane, and then checks that no
// control plane it booted still runs.
func runTests(m *testing.M) (code int, err error) {
	crds, err := realdata.CRDDir()
	if err != nil {
		return 1, err
	}
	if cp, err = controlplane.Start(controlplane.WithCRDs(crds)); err != nil {
		return 1, fmt.Errorf("no test control plane: %w", err)
	}
	defer func() { err = errors.Join(err, cp.Stop()) }()
	if standIn, err = startStandIn(context.Background()); err != nil {
		return 1, err
	}
	code = m.Run()
	if err := standIn.Stop(); err != nil {
		return 1, fmt.Errorf("stopping the stand-in: %w", err)
	}
	if n := apiServersRunning(); n != 1 {
		return 1, fmt.Errorf("%d kube-apiservers run after the stand-in stopped, want only the package's", n)
	}
	return code, nil
}

func startStandIn(ctx context.Context) (*StandIn, error) {
	s, err := New(cp.Config)
	if err != nil {
		return nil, err
	}
	return s, s.Start(ctx)
}

// apiServersRunning counts this process's kube-apiserver children.
func apiServersRunning() int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		stat, statErr := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil || statErr != nil || filepath.Base(exe) != "kube-apiserver" {
			continue
		}
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(os.Getpid()) {
			n++
		}
	}
	return n
}

const patience = time.Minute

func namespace(t *testing.T) string {
	t.Helper()
	ns := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if err := cp.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// createTemplate makes a ClusterTemplate with the cluster definition (and cost, if not negative).
func createTemplate(t *testing.T, name, definition string, cost int64) {
	t.Helper()
	u := newObject(templateGVK)
	u.SetName(name)
	spec := map[string]any{"clusterDefinition": definition}
	if cost >= 0 {
		spec["cost"] = cost
	}
	u.Object["spec"] = spec
	if err := cp.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("creating ClusterTemplate %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), u) })
}

func newInstance(namespace, name, template string, params ...string) *unstructured.Unstructured {
	u := newObject(instanceGVK)
	u.SetNamespace(namespace)
	u.SetName(name)
	spec := map[string]any{"clusterTemplateRef": template}
	var ps []any
	for i := 0; i+1 < len(params); i += 2 {
		ps = append(ps, map[string]any{"name": params[i], "value": params[i+1]})
	}
	if ps != nil {
		spec["parameters"] = ps
	}
	u.Object["spec"] = spec
	return u
}

func createInstance(t *testing.T, namespace, name, template string, params ...string) types.NamespacedName {
	t.Helper()
	if err := cp.Client.Create(context.Background(), newInstance(namespace, name, template, params...)); err != nil {
		t.Fatalf("creating instance %s/%s: %v", namespace, name, err)
	}
	return types.NamespacedName{Namespace: namespace, Name: name}
}

func getInstance(ctx context.Context, key types.NamespacedName) (*instance, error) {
	u := newObject(instanceGVK)
	if err := cp.Client.Get(ctx, key, u); err != nil {
		return nil, err
	}
	var cti instance
	return &cti, typed(u, &cti)
}

func waitForPhase(t *testing.T, key types.NamespacedName, phase string) *instance {
	t.Helper()
	var last *instance
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, patience, true, func(ctx context.Context) (bool, error) {
		cti, err := getInstance(ctx, key)
		if err != nil {
			return false, err
		}
		last = cti
		return cti.Status.Phase == phase, nil
	})
	if err != nil {
		t.Fatalf("instance %s never reached phase %s: %v; last status %+v", key, phase, err, last.Status)
	}
	return last
}

func condition(t *testing.T, cti *instance, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(cti.Status.Conditions, typ)
	if c == nil {
		t.Fatalf("instance %s has no %s condition: %+v", cti.Name, typ, cti.Status.Conditions)
	}
	return *c
}

// deleteInstance deletes an instance and waits until its finalizer has let it go.
func deleteInstance(t *testing.T, key types.NamespacedName) {
	t.Helper()
	u := newObject(instanceGVK)
	u.SetNamespace(key.Namespace)
	u.SetName(key.Name)
	if err := cp.Client.Delete(context.Background(), u); err != nil {
		t.Fatalf("deleting instance %s: %v", key, err)
	}
	waitGone(t, key)
}

func waitGone(t *testing.T, key types.NamespacedName) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, patience, true, func(ctx context.Context) (bool, error) {
		_, err := getInstance(ctx, key)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("instance %s is still there: %v", key, err)
	}
}

func secretData(t *testing.T, namespace, name string) map[string][]byte {
	t.Helper()
	var s corev1.Secret
	if err := cp.Client.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, &s); err != nil {
		t.Fatalf("Secret %s/%s: %v", namespace, name, err)
	}
	return s.Data
}

func assertSecretsGone(t *testing.T, namespace string, names ...string) {
	t.Helper()
	for _, name := range names {
		err := cp.Client.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, &corev1.Secret{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("Secret %s/%s after its instance went: %v, want not found", namespace, name, err)
		}
	}
}

func TestReadyTemplateBootsAClusterAndDeletionStopsIt(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	createTemplate(t, "ready", DefinitionReady, -1)
	wc, err := client.NewWithWatch(cp.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, newList(instanceGVK), client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	key := createInstance(t, ns, "test-cluster", "ready")
	var phases []string
	for len(phases) == 0 || phases[len(phases)-1] != phaseReady {
		select {
		case ev := <-w.ResultChan():
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				t.Fatalf("watch: %v", ev.Object)
			}
			phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
			if phase != "" && (len(phases) == 0 || phases[len(phases)-1] != phase) {
				phases = append(phases, phase)
			}
		case <-time.After(patience):
			t.Fatalf("instance not Ready after %s; phases %v", patience, phases)
		}
	}
	if want := []string{phasePending, phaseClusterInstalling, phaseReady}; strings.Join(phases, ",") != strings.Join(want, ",") {
		t.Errorf("phases %v, want %v", phases, want)
	}

	cti, err := getInstance(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{conditionInstalled, conditionSetUp, conditionReady} {
		if c := condition(t, cti, typ); c.Status != metav1.ConditionTrue {
			t.Errorf("condition %s: %+v, want True", typ, c)
		}
	}
	if cti.Status.Kubeconfig == nil || cti.Status.AdminPassword == nil {
		t.Fatalf("status names no Secrets: %+v", cti.Status)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secretData(t, ns, cti.Status.Kubeconfig.Name)["kubeconfig"])
	if err != nil {
		t.Fatalf("the kubeconfig Secret does not load: %v", err)
	}
	if cfg.Host != cti.Status.APIServerURL || cfg.Host == cp.Config.Host {
		t.Fatalf("kubeconfig reaches %s, status says %s, the stand-in's apiserver is %s: want a second apiserver", cfg.Host, cti.Status.APIServerURL, cp.Config.Host)
	}
	namespaces, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing namespaces on the booted cluster: %v", err)
	}
	for _, n := range namespaces.Items {
		if n.Name == ns {
			t.Fatalf("the booted cluster has the test's namespace %s: it is not a second apiserver", ns)
		}
	}
	assertConsoleRoute(t, cfg, secretData(t, ns, cti.Status.Kubeconfig.Name)["kubeconfig"], key.Name)
	admin := secretData(t, ns, cti.Status.AdminPassword.Name)
	if string(admin["username"]) != "kubeadmin" || len(admin["password"]) < 20 {
		t.Errorf("admin password Secret: username %q, password of %d characters", admin["username"], len(admin["password"]))
	}
	var job batchv1.Job
	if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "test-cluster-install"}, &job); err != nil || job.Status.Succeeded != 1 {
		t.Errorf("install Job: succeeded %d, %v", job.Status.Succeeded, err)
	}
	if got := standIn.Clusters(); len(got) != 1 || got[0].APIServerURL != cfg.Host {
		t.Fatalf("running clusters %+v, want the instance's", got)
	}

	deleteInstance(t, key)
	if got := standIn.Clusters(); len(got) != 0 {
		t.Errorf("clusters still running after their instance went: %+v", got)
	}
	apiserver, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", apiserver.Host, 5*time.Second); err == nil {
		_ = conn.Close()
		t.Errorf("the deleted instance's apiserver %s still accepts connections", apiserver.Host)
	}
	assertSecretsGone(t, ns, cti.Status.Kubeconfig.Name, cti.Status.AdminPassword.Name)
}

// assertConsoleRoute checks that the booted cluster has the console's Route, as a client and
// as the real eaas-get-ephemeral-cluster-credentials step asks for it: its oc is the kubectl of
// `make testbin`, run here the same way when bin/k8s has it.
func assertConsoleRoute(t *testing.T, cfg *rest.Config, kubeconfig []byte, instanceName string) {
	t.Helper()
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	route := &unstructured.Unstructured{}
	route.SetGroupVersionKind(routeGVK)
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: "openshift-console", Name: "console"}, route); err != nil {
		t.Fatalf("the booted cluster's console Route: %v", err)
	}
	host, _, _ := unstructured.NestedString(route.Object, "spec", "host")
	kind, _, _ := unstructured.NestedString(route.Object, "spec", "to", "kind")
	name, _, _ := unstructured.NestedString(route.Object, "spec", "to", "name")
	if host != ConsoleHost(instanceName) || kind != "Service" || name != "console" {
		t.Errorf("console Route: host %q to %s %q, want host %q to Service console", host, kind, name, ConsoleHost(instanceName))
	}

	bins, err := controlplane.BinaryDir()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(bins, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Logf("not asking as the step does: %v (an older bin/k8s; `make testbin` builds it)", err)
		return
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), kubectl, "--kubeconfig", path, "get", "route", "console", "-n", "openshift-console",
		"-o", "go-template", "--template={{.spec.host}}").CombinedOutput()
	if err != nil || string(out) != ConsoleHost(instanceName) {
		t.Errorf("kubectl get route console as the step runs it: %q, %v; want %q", out, err, ConsoleHost(instanceName))
	}
}

func TestInstallFailsWithTheInstallLog(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	createTemplate(t, "install-fails", DefinitionInstallFails, -1)
	key := createInstance(t, ns, "doomed", "install-fails")
	cti := waitForPhase(t, key, phaseClusterInstallFailed)

	if !strings.Contains(cti.Status.Message, "VcpuLimitExceeded") || !strings.Contains(cti.Status.Message, "doomed-install") {
		t.Errorf("message %q does not say which install failed and why", cti.Status.Message)
	}
	if c := condition(t, cti, conditionInstalled); c.Status != metav1.ConditionFalse || c.Message != cti.Status.Message {
		t.Errorf("%s: %+v", conditionInstalled, c)
	}
	if c := condition(t, cti, conditionReady); c.Status != metav1.ConditionFalse {
		t.Errorf("Ready: %+v", c)
	}
	var pods corev1.PodList
	if err := cp.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{batchv1.JobNameLabel: "doomed-install"}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("install Pods: %d, %v", len(pods.Items), err)
	}
	pod := pods.Items[0]
	if pod.Status.Phase != corev1.PodFailed || len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("install Pod status %+v", pod.Status)
	}
	term := pod.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 1 || !strings.Contains(term.Message, "level=fatal") || !strings.Contains(term.Message, "VcpuLimitExceeded") {
		t.Errorf("install container: %+v, want exit code 1 and the log's tail", term)
	}
	var job batchv1.Job
	if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "doomed-install"}, &job); err != nil || job.Status.Failed != 1 {
		t.Errorf("install Job: failed %d, %v", job.Status.Failed, err)
	}
	var events corev1.EventList
	if err := cp.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	warned := false
	for _, ev := range events.Items {
		warned = warned || (ev.InvolvedObject.UID == cti.UID && ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, "VcpuLimitExceeded"))
	}
	if !warned {
		t.Errorf("no Warning Event on the instance among %d events", len(events.Items))
	}
	if len(standIn.Clusters()) != 0 {
		t.Errorf("a failed install left a cluster running: %+v", standIn.Clusters())
	}

	deleteInstance(t, key)
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("install Pod after its instance went: %v", err)
	}
}

func TestNeverReadyStaysInstalling(t *testing.T) {
	ns := namespace(t)
	createTemplate(t, "never-ready", DefinitionNeverReady, -1)
	key := createInstance(t, ns, "slow", "never-ready")
	cti := waitForPhase(t, key, phaseClusterInstalling)
	if !strings.Contains(cti.Status.Message, "waiting") {
		t.Errorf("message %q reports no progress", cti.Status.Message)
	}
	if c := condition(t, cti, conditionReady); c.Status != metav1.ConditionFalse {
		t.Errorf("Ready: %+v", c)
	}
	var job batchv1.Job
	if err := cp.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "slow-install"}, &job); err != nil || job.Status.Active != 1 {
		t.Errorf("install Job: active %d, %v", job.Status.Active, err)
	}
	deleteInstance(t, key)
}

func TestMissingTemplateFails(t *testing.T) {
	key := createInstance(t, namespace(t), "orphan", "no-such-template")
	cti := waitForPhase(t, key, phaseFailed)
	if !strings.Contains(cti.Status.Message, "no-such-template") {
		t.Errorf("message %q does not name the missing template", cti.Status.Message)
	}
	if c := condition(t, cti, conditionReady); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "no-such-template") {
		t.Errorf("Ready: %+v", c)
	}
	deleteInstance(t, key)
}

// A bring-your-own-cloud instance names its credentials; what is missing is named back. With
// them, it boots; the stand-in is then stopped and restarted to show that Stop leaves no control
// plane running and that a new stand-in finishes a deletion made while none ran.
func TestCredentials(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	createTemplate(t, "byoc", DefinitionCredentials, -1)
	incomplete := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "half", Namespace: ns}, Data: map[string][]byte{AccessKeyIDKey: []byte("AKIAEXAMPLE")}}
	complete := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "aws", Namespace: ns}, Data: map[string][]byte{AccessKeyIDKey: []byte("AKIAEXAMPLE"), SecretAccessKeyKey: []byte("s3cr3t")}}
	for _, s := range []*corev1.Secret{incomplete, complete} {
		if err := cp.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		params []string
		want   []string
	}{
		{"no-parameter", nil, []string{CredentialsParameter, "byoc"}},
		{"no-secret", []string{CredentialsParameter, "nowhere"}, []string{`"nowhere"`, "not found"}},
		{"no-key", []string{CredentialsParameter, "half"}, []string{`"half"`, SecretAccessKeyKey}},
	} {
		key := createInstance(t, ns, tc.name, "byoc", tc.params...)
		cti := waitForPhase(t, key, phaseCredentialsFailed)
		for _, w := range tc.want {
			if !strings.Contains(cti.Status.Message, w) {
				t.Errorf("%s: message %q does not name %s", tc.name, cti.Status.Message, w)
			}
		}
		if strings.Contains(cti.Status.Message, "AKIAEXAMPLE") {
			t.Errorf("%s: message %q quotes a credential", tc.name, cti.Status.Message)
		}
		deleteInstance(t, key)
	}

	key := createInstance(t, ns, "mine", "byoc", CredentialsParameter, "aws")
	cti := waitForPhase(t, key, phaseReady)
	if apiServersRunning() != 2 || len(standIn.Clusters()) != 1 {
		t.Fatalf("%d kube-apiservers and clusters %+v, want the package's and the instance's", apiServersRunning(), standIn.Clusters())
	}

	if err := standIn.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := apiServersRunning(); n != 1 {
		t.Fatalf("%d kube-apiservers after Stop, want only the package's", n)
	}
	u := newObject(instanceGVK)
	u.SetNamespace(ns)
	u.SetName(key.Name)
	if err := cp.Client.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	restarted, err := startStandIn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	standIn = restarted
	waitGone(t, key)
	assertSecretsGone(t, ns, cti.Status.Kubeconfig.Name, cti.Status.AdminPassword.Name)
}

func TestQuotaRefusesAtCreate(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	createTemplate(t, "small", DefinitionNeverReady, 2)
	createTemplate(t, "big", DefinitionNeverReady, 5)
	createTemplate(t, "unlisted", DefinitionNeverReady, -1)
	q := newObject(quotaGVK)
	q.SetNamespace(ns)
	q.SetName("team-quota")
	q.Object["spec"] = map[string]any{
		"allowedTemplates": []any{map[string]any{"name": "small", "count": int64(2)}, map[string]any{"name": "big"}},
		"budget":           int64(6),
	}
	if err := cp.Client.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	refused := func(name, template string, want ...string) {
		t.Helper()
		err := cp.Client.Create(ctx, newInstance(ns, name, template))
		if err == nil {
			t.Errorf("instance %s of %s was admitted", name, template)
			deleteInstance(t, types.NamespacedName{Namespace: ns, Name: name})
			return
		}
		for _, w := range append(want, "team-quota", fmt.Sprintf("%q", template)) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("refusal of %s %q does not say %s", template, err, w)
			}
		}
	}
	refused("a", "unlisted", "not among the allowed")
	first := createInstance(t, ns, "b", "small")
	refused("c", "big", "budget") // 2 + 5 > 6
	second := createInstance(t, ns, "d", "small")
	refused("e", "small", "allows 2")
	for _, key := range []types.NamespacedName{first, second} {
		deleteInstance(t, key)
	}
	createInstance(t, ns, "f", "big") // the budget is free again
	deleteInstance(t, types.NamespacedName{Namespace: ns, Name: "f"})
}
