package deploy

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/dashboards"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/dev/testground/realprometheus"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
)

// sourceCluster is the external label Konflux's federation gives every series of a cluster,
// which its dashboard's and alerts' queries select and group by.
const sourceCluster = "deploy-test-cluster"

// scrapeInterval replaces the ServiceMonitor's 15s, so that the test's few minutes give each
// series enough samples for the rate windows; what is scraped, and how, is the monitor's.
const scrapeInterval = time.Second

// The platforms of the monitored cluster: one static platform that serves, one whose host
// refuses berth's admin key until the Secret is fixed, and one of VMs on EC2.
const (
	monitoredStatic  = "linux/s390x"
	monitoredFailing = "linux/ppc64le"
	monitoredVMs     = "linux/arm64"
)

// The Konflux layout, with Konflux's own monitoring and the Secrets its ExternalSecrets make,
// is scraped by the real Prometheus as the real ServiceMonitor says, while berth serves tasks
// that wait, run, fail to provision and are cleaned; then, with Konflux's files read unchanged:
// every query of its dashboard returns data for the platforms used, its rules load, its
// konflux_up recording rules report both Deployments up, MultiPlatformControllerPlatformUnhealthy
// fires for the platform whose provisionings fail and resolves once they succeed, and
// MultiPlatformControllerMetricsUnhealthy never fires.
func TestKonfluxLayoutIsMonitoredAsKonfluxMonitors(t *testing.T) {
	needServeParts(t)
	real := needPrometheus(t)
	ctx := context.Background()
	ctrllog.SetLogger(logr.Discard())
	cp := startControlPlane(t, controlplane.WithCRDObjects(prerequisiteCRDs(t)...))
	objs := konfluxInstall(t, false)
	applyAll(t, cp, objs)
	ns := konfluxNamespace

	// The Secrets the ExternalSecrets make, under their names, holding what berth reads of
	// each (upstream's keys): an admin key, or the AWS account's key pair.
	fleet := sshhosts.StartForTest(t, 2)
	static, failing := fleet.Hosts[0], fleet.Hosts[1]
	_, ec2, ec2Secret := startEC2(t, fleet)
	secrets := externalSecretNames(t, filepath.Join(real, "deploy", "mpc-production-stone-prd-rh01-external-secrets.yaml"))
	const (
		awsAccount   = "aws-account"
		awsSSHKey    = "aws-ssh-key"
		s390xSSHKey  = "ibm-s390x-ssh-key"
		ppc64leSSHKy = "ibm-ppc64le-ssh-key-wkjg"
	)
	for _, name := range []string{awsAccount, awsSSHKey, s390xSSHKey, ppc64leSSHKy} {
		if !slices.Contains(secrets, name) {
			t.Fatalf("Konflux's ExternalSecrets make %v; the test's config names %s", secrets, name)
		}
	}
	data := map[string]map[string][]byte{
		awsAccount:  {"access-key-id": []byte(awsKeyID), "secret-access-key": []byte(ec2Secret)},
		awsSSHKey:   {"id_rsa": fleet.AdminKeyPEM},
		s390xSSHKey: {"id_rsa": fleet.AdminKeyPEM},
		// A key the host does not know: every provisioning there fails until it is fixed.
		ppc64leSSHKy: {"id_rsa": strangerKey(t)},
	}
	createSecrets(t, cp, ns, data)
	tekton := startTekton(t, cp)
	ca, err := tlscerts.NewCA("deploy test's service-ca")
	if err != nil {
		t.Fatal(err)
	}
	// service-ca's CA bundle in the ConfigMaps that ask for it; the serving certificates are
	// the issuer's, which also name 127.0.0.1, where the apiserver calls the webhook here.
	injectCABundles(t, cp, ns, ca)
	controller := runAsDeployed(t, cp, objs, deployOptions{routing: freePorts, issuer: ca})
	registerWebhooks(t, cp, objs, ca, controller.svc)
	keyServer := runAsDeployed(t, cp, objs, deployOptions{routing: freePorts, issuer: ca, command: "otp-server"})

	// The host config, as the chart renders it: its keys, its Secrets' names.
	arm := "dynamic." + konfluxmetrics.Platform(monitoredVMs) + "."
	config := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "host-config", Namespace: ns, Labels: map[string]string{contract.ConfigLabel: "hosts"}},
		Data: map[string]string{
			"dynamic-platforms": monitoredVMs,

			"host.s390x-static-1.address":     static.Address,
			"host.s390x-static-1.user":        "root",
			"host.s390x-static-1.platform":    monitoredStatic,
			"host.s390x-static-1.secret":      s390xSSHKey,
			"host.s390x-static-1.concurrency": "1",

			"host.ppc64le-static-1.address":     failing.Address,
			"host.ppc64le-static-1.user":        "root",
			"host.ppc64le-static-1.platform":    monitoredFailing,
			"host.ppc64le-static-1.secret":      ppc64leSSHKy,
			"host.ppc64le-static-1.concurrency": "1",

			arm + "type":               "aws",
			arm + "endpoint":           ec2.URL(),
			arm + "region":             awsRegion,
			arm + "ami":                awsImage,
			arm + "instance-type":      awsType,
			arm + "key-name":           awsKeyPair,
			arm + "aws-secret":         awsAccount,
			arm + "ssh-secret":         awsSSHKey,
			arm + "max-instances":      "1",
			arm + "check-interval":     "1",
			arm + "allocation-timeout": "120",
		},
	}
	if err := cp.Client.Create(ctx, config); err != nil {
		t.Fatal(err)
	}
	stacktest.ConfigJudged(t, cp.Client, ns, config.ResourceVersion)

	prom := monitorAsKonflux(t, cp, objs, real, controller, map[string]*deployedController{
		"multi-platform-controller": controller, "multi-platform-otp-server": keyServer})
	start := time.Now()

	tenant := "tenant"
	if err := cp.EnsureNamespace(ctx, tenant); err != nil {
		t.Fatal(err)
	}
	served := servedTasks{t: t, cp: cp, tekton: tekton, ns: ns, tenant: tenant, svc: controller.svc}
	// samples waits until Prometheus holds n more samples of berth's series than it did when
	// called: the test's clock is Prometheus' scrapes, not a sleep.
	samples := func(what string, n int) {
		t.Helper()
		count := func() int {
			v := queryAt(t, prom, fmt.Sprintf(`count_over_time(multi_platform_controller_platform_pool_size{platform=%q}[1h])`, konfluxmetrics.Platform(monitoredStatic)), time.Now())
			if len(v) == 0 {
				return 0
			}
			return int(v[0].Value)
		}
		from := count()
		stacktest.Eventually(t, fmt.Sprintf("%d more scrapes (%s)", n, what), func() (bool, error) {
			return count() >= from+n, nil
		})
	}

	// Served, and waiting: the static platform's one slot taken, a second task behind it; a VM
	// launched for a third, a fourth behind it.
	first := served.create(t, "static-first", monitoredStatic)
	served.secret(t, first)
	second := served.create(t, "static-second", monitoredStatic)
	vm := served.create(t, "on-a-vm", monitoredVMs)
	served.secret(t, vm)
	// max-instances 1: a second VM task waits for the first VM's end.
	vmBehind := served.create(t, "behind-the-vm", monitoredVMs)
	for _, p := range []string{monitoredStatic, monitoredVMs} {
		stacktest.Eventually(t, "Prometheus sees a task waiting on "+p, func() (bool, error) {
			expr := fmt.Sprintf(`multi_platform_controller_waiting_tasks{platform=%q} > 0`, konfluxmetrics.Platform(p))
			return len(queryAt(t, prom, expr, time.Now())) > 0, nil
		})
	}
	samples("a task running on each platform, one waiting", 3)

	// Failing: each task on the platform whose host refuses berth's key fails to provision
	// there and, that being the platform's only host, gets an error secret.
	for i := range 2 {
		tr := served.create(t, "refused-"+strconv.Itoa(i), monitoredFailing)
		secret := stacktest.SecretOf(t, cp.Client, tr)
		if _, failed := secret.Data["error"]; !failed {
			t.Fatalf("%s got a login on a host that refuses berth's key", tr.Name)
		}
		if err := tekton.Finish(ctx, client.ObjectKeyFromObject(tr), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Long enough for the alert's `for: 5m`, at one scrape a minute (see checkPlatformAlert).
	samples("provisionings failing", 8)

	served.finish(t, first)
	served.secret(t, second)
	served.finish(t, second)
	served.finish(t, vm)
	served.secret(t, vmBehind)
	served.finish(t, vmBehind)

	// Fixed: the Secret as ExternalSecrets would rewrite it after a rotation in Vault.
	var s corev1.Secret
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: ppc64leSSHKy}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data["id_rsa"] = fleet.AdminKeyPEM
	if err := cp.Client.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	var recovered *pipelinev1.TaskRun
	stacktest.Eventually(t, "a task on the fixed platform is served", func() (bool, error) {
		tr := served.create(t, "after-the-fix-"+randomHex(t, 3), monitoredFailing)
		secret := stacktest.SecretOf(t, cp.Client, tr)
		if _, failed := secret.Data["error"]; failed {
			_ = tekton.Finish(ctx, client.ObjectKeyFromObject(tr), nil)
			return false, fmt.Errorf("%s: %s", tr.Name, secret.Data["error"])
		}
		recovered = tr
		return true, nil
	})
	// Its one slot taken, a second task waits behind it.
	behind := served.create(t, "behind-the-fixed", monitoredFailing)
	stacktest.Eventually(t, "Prometheus sees a task waiting on the fixed platform", func() (bool, error) {
		expr := fmt.Sprintf(`multi_platform_controller_waiting_tasks{platform=%q} > 0`, konfluxmetrics.Platform(monitoredFailing))
		return len(queryAt(t, prom, expr, time.Now())) > 0, nil
	})
	samples("a task running on the fixed platform, one waiting", 3)
	served.finish(t, recovered)
	served.secret(t, behind)
	served.finish(t, behind)
	// The failures out of the rule's 15-minute window, at one scrape a minute.
	samples("provisionings succeeding", 17)
	end := time.Now()

	controller.checkRunning(t)
	keyServer.checkRunning(t)
	used := []string{konfluxmetrics.Platform(monitoredStatic), konfluxmetrics.Platform(monitoredFailing), konfluxmetrics.Platform(monitoredVMs)}
	t.Run("Konflux's dashboard", func(t *testing.T) {
		checkDashboard(t, prom, filepath.Join(real, "o11y", "grafana-dashboard-mpc.configmap.yaml"), start, end, used, true)
	})
	t.Run("berth's dashboard", func(t *testing.T) {
		checkDashboard(t, prom, filepath.Join(repoRoot(t), "config", "grafana", "dashboard.yaml"), start, end, used, false)
	})
	t.Run("the rules load", func(t *testing.T) {
		checkRulesLoaded(t, prom, real)
	})
	t.Run("konflux_up", func(t *testing.T) {
		checkKonfluxUp(t, prom)
	})
	t.Run("MultiPlatformControllerPlatformUnhealthy", func(t *testing.T) {
		checkPlatformAlert(t, prom, real, start, end, konfluxmetrics.Platform(monitoredFailing))
	})
	t.Run("MultiPlatformControllerMetricsUnhealthy", func(t *testing.T) {
		checkNeverFires(t, prom, real, "MultiPlatformControllerMetricsUnhealthy", start, end)
	})
	t.Run("upstream's buckets", func(t *testing.T) {
		checkBuckets(t, prom, real)
	})
}

// konfluxInstall is config/konflux with Konflux's files beside it (konfluxCluster), without the
// chart's host-config of stone-prd-rh01 unless withHostConfig: a test that serves tasks writes
// the one of its own hosts under the same name.
func konfluxInstall(t *testing.T, withHostConfig bool) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, o := range konfluxCluster(t) {
		if !withHostConfig && o.GetKind() == "ConfigMap" && o.GetName() == "host-config" {
			continue
		}
		out = append(out, o)
	}
	return out
}

// externalSecretNames are the Secrets the ExternalSecrets in path make: their targets' names.
func externalSecretNames(t *testing.T, path string) []string {
	t.Helper()
	var names []string
	for _, o := range readManifests(t, path) {
		if o.GetKind() != "ExternalSecret" {
			continue
		}
		name, _, _ := unstructured.NestedString(o.Object, "spec", "target", "name")
		if name == "" {
			name = o.GetName()
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		t.Fatalf("%s holds no ExternalSecret", path)
	}
	return names
}

// strangerKey is a private key no host knows, as an OpenSSH PEM file.
func strangerKey(t *testing.T) []byte {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block)
}

// monitorAsKonflux runs the real Prometheus as Konflux's monitoring has it: in the cluster, one
// scrapes the controller as the real ServiceMonitor says (the Service it selects by labels, the
// endpoint's port, scheme and path, the Secret its bearer token is read from, its TLS
// settings), with the target labels the Prometheus Operator gives (namespace, service, job,
// endpoint, pod, container) and source_cluster as its external label; beside the controller, it
// scrapes series of kube-state-metrics' exact shape (kubeStateSeries), which feed the konflux_up
// recording rules and the dashboard's pod panels. A second one federates every series of the
// first, source_cluster added, and loads every rule file of Konflux's (o11y/, each
// PrometheusRule's spec): the one returned, which the dashboard and the alerts read.
func monitorAsKonflux(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured, real string,
	controller *deployedController, running map[string]*deployedController) *realprometheus.Server {
	t.Helper()
	ctx := context.Background()
	var monitor *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ServiceMonitor" {
			monitor = o
		}
	}
	if monitor == nil {
		t.Fatal("the install holds no ServiceMonitor")
	}
	ns := monitor.GetNamespace()
	selector, _, _ := unstructured.NestedStringMap(monitor.Object, "spec", "selector", "matchLabels")
	endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor %s has %d endpoints; this test scrapes one", monitor.GetName(), len(endpoints))
	}
	e := endpoints[0].(map[string]any)
	str := func(fields ...string) string {
		v, _, _ := unstructured.NestedString(e, fields...)
		return v
	}
	insecure, _, _ := unstructured.NestedBool(e, "tlsConfig", "insecureSkipVerify")

	// The bearer token: the key of the Secret the endpoint names. kube-controller-manager's
	// token controller fills a Secret of type service-account-token with a token of its
	// ServiceAccount; this control plane runs no token controller, so the test writes one.
	var tokenSecret corev1.Secret
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: str("bearerTokenSecret", "name")}, &tokenSecret); err != nil {
		t.Fatalf("the Secret the ServiceMonitor reads its token from: %v", err)
	}
	if tokenSecret.Type != corev1.SecretTypeServiceAccountToken {
		t.Fatalf("Secret %s is of type %s, which no token controller fills", tokenSecret.Name, tokenSecret.Type)
	}
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, tokenSecret.Annotations[corev1.ServiceAccountNameKey], &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of the ServiceAccount Secret %s is for: %v", tokenSecret.Name, err)
	}
	tokenSecret.Data = map[string][]byte{corev1.ServiceAccountTokenKey: []byte(tr.Status.Token)}
	if err := cp.Client.Update(ctx, &tokenSecret); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(&tokenSecret), &tokenSecret); err != nil {
		t.Fatal(err)
	}
	token := tokenSecret.Data[str("bearerTokenSecret", "key")]
	if len(token) == 0 {
		t.Fatalf("Secret %s has no key %s", tokenSecret.Name, str("bearerTokenSecret", "key"))
	}

	// The Service, and the address its port reaches the controller's process at.
	d, c := controllerOf(t, objs)
	var target, service string
	for _, svc := range ofKind[corev1.Service](t, objs, "Service") {
		if svc.Namespace != ns || !labels.SelectorFromSet(selector).Matches(labels.Set(svc.Labels)) {
			continue
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Fatalf("ServiceMonitor %s selects Service %s, which does not select the controller's pods", monitor.GetName(), svc.Name)
		}
		for _, p := range svc.Spec.Ports {
			if p.Name != str("port") {
				continue
			}
			for _, cport := range c.Ports {
				if targetsPort(c, p.TargetPort, cport.ContainerPort) {
					target = net.JoinHostPort("127.0.0.1", strconv.Itoa(controller.svc.listen[cport.ContainerPort]))
					service = svc.Name
				}
			}
		}
	}
	if target == "" {
		t.Fatalf("ServiceMonitor %s (selector %v, port %s) reaches no port of the controller", monitor.GetName(), selector, str("port"))
	}

	kube := kubeStateSeries(t, cp, ns, running)
	scrape := map[string]any{
		"job_name":        service,
		"scheme":          str("scheme"),
		"metrics_path":    str("path"),
		"scrape_interval": scrapeInterval.String(),
		"authorization":   map[string]any{"credentials_file": "token"},
		"tls_config":      map[string]any{"insecure_skip_verify": insecure},
		"static_configs": []any{map[string]any{
			"targets": []string{target},
			"labels": map[string]string{"namespace": ns, "service": service, "endpoint": str("port"),
				"pod": d.Name + "-deploy-test", "container": c.Name},
		}},
	}
	// The cluster's Prometheus, which Konflux's federation reads.
	cluster, err := yaml.Marshal(map[string]any{
		"global": map[string]any{
			"scrape_interval": scrapeInterval.String(),
			"external_labels": map[string]string{"source_cluster": sourceCluster},
		},
		"scrape_configs": []any{scrape, map[string]any{
			// kube-state-metrics' own labels are the objects', as its ServiceMonitor keeps them.
			"job_name": "kube-state-metrics", "honor_labels": true,
			"static_configs": []any{map[string]any{"targets": []string{kube}}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	inCluster := realprometheus.StartForTest(t, cluster, map[string][]byte{"token": token})
	stacktest.Eventually(t, "Prometheus scrapes the controller", func() (bool, error) {
		targets, err := inCluster.API.Targets(ctx)
		if err != nil {
			return false, err
		}
		for _, tg := range targets.Active {
			if tg.ScrapePool == service && tg.Health == "up" {
				return true, nil
			}
			if tg.ScrapePool == service && tg.LastError != "" {
				return false, fmt.Errorf("scraping %s: %s", tg.ScrapeURL, tg.LastError)
			}
		}
		return false, nil
	})

	// The Prometheus the dashboard and the rules read: every series of the cluster's, through
	// /federate, which adds the cluster's external labels (source_cluster) as Konflux's
	// federation does.
	files := map[string][]byte{}
	var ruleFiles []string
	for _, name := range konfluxRuleFiles(t, real) {
		files[name] = konfluxRules(t, real, name)
		ruleFiles = append(ruleFiles, name)
	}
	central, err := yaml.Marshal(map[string]any{
		"global": map[string]any{
			"scrape_interval":     scrapeInterval.String(),
			"evaluation_interval": scrapeInterval.String(),
		},
		"rule_files": ruleFiles,
		"scrape_configs": []any{map[string]any{
			"job_name": "federate", "honor_labels": true, "metrics_path": "/federate",
			"params":         map[string][]string{"match[]": {`{__name__=~".+"}`}},
			"static_configs": []any{map[string]any{"targets": []string{strings.TrimPrefix(inCluster.URL, "http://")}}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	prom := realprometheus.StartForTest(t, central, files)
	stacktest.Eventually(t, "the federation reads the cluster's series of berth", func() (bool, error) {
		return len(queryAt(t, prom, fmt.Sprintf(`multi_platform_controller_platform_pool_size{source_cluster=%q}`, sourceCluster), time.Now())) > 0, nil
	})
	return prom
}

// konfluxRuleFiles are the PrometheusRules of Konflux's o11y/ (its unit tests aside).
func konfluxRuleFiles(t *testing.T, real string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(real, "o11y"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") && !strings.HasSuffix(e.Name(), "_test.yaml") && !strings.HasPrefix(e.Name(), "grafana-") {
			names = append(names, e.Name())
		}
	}
	if len(names) < 3 {
		t.Fatalf("o11y/ holds the rule files %v; want the alerts and both availability rules", names)
	}
	return names
}

// kubeStateSeries serves, on a free port of 127.0.0.1, the series of kube-state-metrics that
// Konflux's rules and dashboard read, in its exact names and labels, for the Deployments of ns
// and their pods: kube_deployment_spec_replicas from each Deployment's spec on the apiserver;
// kube_deployment_status_replicas_available and kube_pod_status_phase from the processes this
// test runs in place of the pods (running: by Deployment name), since no kubelet runs them
// here. It returns the address.
func kubeStateSeries(t *testing.T, cp *controlplane.ControlPlane, ns string, running map[string]*deployedController) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(kubeStateCollector{cp: cp, ns: ns, running: running})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

var (
	specReplicas = prometheus.NewDesc("kube_deployment_spec_replicas", "Number of desired pods for a deployment.",
		[]string{"namespace", "deployment"}, nil)
	availableReplicas = prometheus.NewDesc("kube_deployment_status_replicas_available", "The number of available replicas per deployment.",
		[]string{"namespace", "deployment"}, nil)
	podPhase = prometheus.NewDesc("kube_pod_status_phase", "The pods current phase.",
		[]string{"namespace", "pod", "uid", "phase"}, nil)
)

type kubeStateCollector struct {
	cp      *controlplane.ControlPlane
	ns      string
	running map[string]*deployedController
}

func (k kubeStateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- specReplicas
	ch <- availableReplicas
	ch <- podPhase
}

func (k kubeStateCollector) Collect(ch chan<- prometheus.Metric) {
	var list appsv1.DeploymentList
	if err := k.cp.Client.List(context.Background(), &list, client.InNamespace(k.ns)); err != nil {
		ch <- prometheus.NewInvalidMetric(specReplicas, err)
		return
	}
	for _, d := range list.Items {
		want := 1.0
		if d.Spec.Replicas != nil {
			want = float64(*d.Spec.Replicas)
		}
		ch <- prometheus.MustNewConstMetric(specReplicas, prometheus.GaugeValue, want, d.Namespace, d.Name)
		up := 0.0
		phase := corev1.PodFailed
		if r, ok := k.running[d.Name]; ok {
			select {
			case <-r.exited:
			default:
				up, phase = 1, corev1.PodRunning
			}
		}
		ch <- prometheus.MustNewConstMetric(availableReplicas, prometheus.GaugeValue, up, d.Namespace, d.Name)
		if _, ok := k.running[d.Name]; !ok {
			continue
		}
		// As kube-state-metrics: one series per phase, 1 for the pod's.
		for _, p := range []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodUnknown} {
			v := 0.0
			if p == phase {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(podPhase, prometheus.GaugeValue, v, d.Namespace, d.Name+"-deploy-test", string(d.UID), string(p))
		}
	}
}

// queryAt evaluates expr at one instant.
func queryAt(t *testing.T, prom *realprometheus.Server, expr string, at time.Time) model.Vector {
	t.Helper()
	v, warnings, _, err := prom.API.Query(context.Background(), expr, at)
	if err != nil {
		t.Fatalf("query %s: %v (%v)", expr, err, warnings)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		t.Fatalf("query %s: a %s, not a vector", expr, v.Type())
	}
	return vec
}

// queryRange evaluates expr at every scrape between start and end.
func queryRange(t *testing.T, prom *realprometheus.Server, expr string, start, end time.Time) model.Matrix {
	t.Helper()
	v, warnings, _, err := prom.API.QueryRange(context.Background(), expr, promv1Range(start, end))
	if err != nil {
		t.Fatalf("query %s: %v (%v)", expr, err, warnings)
	}
	m, ok := v.(model.Matrix)
	if !ok {
		t.Fatalf("query %s: a %s, not a matrix", expr, v.Type())
	}
	return m
}

// filters tells whether expr drops series by their value (a comparison without bool), so that
// it returns data only while something is wrong or nonzero.
func filters(expr parser.Expr) bool {
	found := false
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if b, ok := n.(*parser.BinaryExpr); ok && b.Op.IsComparisonOperator() && !b.ReturnBool {
			found = true
		}
		return nil
	})
	return found
}

// checkDashboard evaluates every query of the dashboard (a ConfigMap) at path over the run
// (dashboards.Queries puts "All" for the dashboard's variables). Each must evaluate, and one
// whose every metric had series during the run must return data. With everyMetric (Konflux's
// dashboard, which reads only what berth exports under upstream's names and kube-state-metrics'
// series), every metric a query reads must have had series, and a query that keeps every series
// whatever its value and has a platform label must return data for every platform used; one
// that filters by value (a panel of what is wrong, or nonzero) for some. berth's own dashboard
// has panels of what this run cannot show (the key server's metrics, which the Konflux layout
// does not serve; VMs of static platforms), which are evaluated but may be empty.
func checkDashboard(t *testing.T, prom *realprometheus.Server, path string, start, end time.Time, used []string, everyMetric bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	queries, err := dashboards.Queries(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(queries) == 0 {
		t.Fatalf("%s holds no query", path)
	}
	had := map[string]bool{}
	withData := 0
	for _, q := range queries {
		parsed, err := parser.ParseExpr(q.Expr)
		if err != nil {
			t.Errorf("panel %q: %v", q.Panel, err)
			continue
		}
		all := true
		for _, sel := range selectors(parsed) {
			name := metricName(sel)
			if _, ok := had[name]; !ok {
				had[name] = len(queryRange(t, prom, fmt.Sprintf(`group({__name__=%q})`, name), start, end)) > 0
			}
			if !had[name] {
				all = false
				if everyMetric {
					t.Errorf("panel %q reads %s, of which Prometheus had no series during the run", q.Panel, name)
				}
			}
		}
		m := queryRange(t, prom, q.Expr, start, end)
		if len(m) > 0 {
			withData++
		}
		if !all {
			continue
		}
		if len(m) == 0 {
			t.Errorf("panel %q returns no data: %s", q.Panel, q.Expr)
			continue
		}
		seen := map[string]bool{}
		for _, s := range m {
			if p, ok := s.Metric["platform"]; ok {
				seen[konfluxmetrics.Platform(string(p))] = true // berth's are linux/arm64
			}
		}
		if !everyMetric || len(seen) == 0 || filters(parsed) {
			continue
		}
		for _, p := range used {
			if !seen[p] {
				t.Errorf("panel %q has no data for platform %s (has %v): %s", q.Panel, p, slices.Sorted(maps.Keys(seen)), q.Expr)
			}
		}
	}
	var none []string
	for name, ok := range had {
		if !ok {
			none = append(none, name)
		}
	}
	slices.Sort(none)
	t.Logf("%s: %d queries evaluated, %d returned data; metrics without series in this run: %v", filepath.Base(path), len(queries), withData, none)
}

func promv1Range(start, end time.Time) promv1.Range {
	return promv1.Range{Start: start, End: end, Step: scrapeInterval}
}

// checkRulesLoaded checks that Prometheus loaded every group of every rule file of Konflux's,
// with all their rules.
func checkRulesLoaded(t *testing.T, prom *realprometheus.Server, real string) {
	t.Helper()
	loaded, err := prom.API.Rules(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, g := range loaded.Groups {
		got[g.Name] = len(g.Rules)
	}
	for _, name := range konfluxRuleFiles(t, real) {
		for _, g := range ruleGroups(t, filepath.Join(real, "o11y", name)) {
			if got[g.Name] != len(g.Rules) {
				t.Errorf("%s: group %s has %d rules; Prometheus loaded %d", name, g.Name, len(g.Rules), got[g.Name])
			}
		}
	}
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []struct {
		Record string `json:"record"`
		Alert  string `json:"alert"`
		Expr   string `json:"expr"`
	} `json:"rules"`
}

// ruleGroups are the groups of the PrometheusRule at path.
func ruleGroups(t *testing.T, path string) []ruleGroup {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []ruleGroup `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rule.Spec.Groups
}

// checkKonfluxUp waits for Konflux's konflux_up recording rules' first evaluations (their
// groups run once a minute) and checks each reports its Deployment up.
func checkKonfluxUp(t *testing.T, prom *realprometheus.Server) {
	t.Helper()
	for _, service := range []string{"multi-platform-controller", "multi-platform-otp-server"} {
		expr := fmt.Sprintf(`konflux_up{namespace=%q, check="replicas-available", service=%q}`, konfluxNamespace, service)
		stacktest.Eventually(t, expr+" is recorded", func() (bool, error) {
			v := queryAt(t, prom, expr, time.Now())
			if len(v) == 1 && v[0].Value != 1 {
				return false, fmt.Errorf("%s is %v", expr, v[0].Value)
			}
			return len(v) == 1, nil
		})
	}
}

// checkNeverFires checks that the alert's expression held for no instant of the run, and that
// Prometheus never had it pending or firing.
func checkNeverFires(t *testing.T, prom *realprometheus.Server, real, alert string, start, end time.Time) {
	t.Helper()
	expr := alertExpr(t, real, alert)
	if m := queryRange(t, prom, expr, start, end); len(m) > 0 {
		t.Errorf("%s held during the run: %v", alert, m)
	}
	if m := queryRange(t, prom, fmt.Sprintf(`ALERTS{alertname=%q}`, alert), start, end); len(m) > 0 {
		t.Errorf("%s was pending or firing: %v", alert, m)
	}
}

// alertExpr is the expression of the alert of that name in Konflux's alert rules.
func alertExpr(t *testing.T, real, alert string) string {
	t.Helper()
	for _, g := range ruleGroups(t, filepath.Join(real, "o11y", konfluxAlerts)) {
		for _, r := range g.Rules {
			if r.Alert == alert {
				return r.Expr
			}
		}
	}
	t.Fatalf("%s has no alert %s", konfluxAlerts, alert)
	return ""
}

// konfluxAlerts is the file of Konflux's alert rules, and the name its unit tests load it by.
const konfluxAlerts = "prometheus.multi_platform_alerts.yaml"

// checkPlatformAlert replays the provisioning counters of platform, as Prometheus scraped them
// from berth during the run, through Konflux's alert rules under promtool, one scrape standing
// for one minute, because the rule looks at 15 minutes and waits 5 before firing, which the run
// cannot: MultiPlatformControllerPlatformUnhealthy must be firing while the platform's
// provisionings fail and resolved at the end, after they succeeded.
func checkPlatformAlert(t *testing.T, prom *realprometheus.Server, real string, start, end time.Time, platform string) {
	t.Helper()
	n := int(end.Sub(start)/scrapeInterval) + 1
	series := func(name string) (model.Metric, []float64) {
		m := queryRange(t, prom, fmt.Sprintf(`%s{platform=%q}`, name, platform), start, end)
		if len(m) != 1 {
			t.Fatalf("%d series of %s for platform %s; want one", len(m), name, platform)
		}
		values := make([]float64, n)
		for i := range values {
			values[i] = -1 // no sample
		}
		for _, p := range m[0].Values {
			if i := int(p.Timestamp.Time().Sub(start).Round(scrapeInterval) / scrapeInterval); i >= 0 && i < n {
				values[i] = float64(p.Value)
			}
		}
		return m[0].Metric, values
	}
	successLabels, successes := series("multi_platform_controller_provisioning_successes")
	failureLabels, failures := series("multi_platform_controller_provisioning_failures")
	rises := func(values []float64) []int {
		var at []int
		last := -1.0
		for i, v := range values {
			if v < 0 {
				continue
			}
			if last >= 0 && v > last {
				at = append(at, i)
			}
			last = v
		}
		return at
	}
	failed, succeeded := rises(failures), rises(successes)
	if len(failed) == 0 || len(succeeded) == 0 {
		t.Fatalf("platform %s: provisioning failures rose at %v and successes at %v (scrapes); want both", platform, failed, succeeded)
	}
	// The rule holds from the first failure until it leaves the 15-minute window, and fires 5
	// minutes after it began to hold; so it is firing 8 minutes after the first failure, if no
	// success came between, and resolved 16 minutes after the last.
	firing := failed[0] + 8
	resolved := n - 1
	if succeeded[0] <= firing || resolved-failed[len(failed)-1] < 16 {
		t.Fatalf("platform %s: failures at %v, successes at %v, %d scrapes: too few around them for the rule's windows", platform, failed, succeeded, n)
	}
	input := func(labels model.Metric, values []float64) map[string]string {
		var b strings.Builder
		for i, v := range values {
			if i > 0 {
				b.WriteByte(' ')
			}
			if v < 0 {
				b.WriteByte('_')
			} else {
				b.WriteString(strconv.FormatFloat(v, 'f', -1, 64))
			}
		}
		return map[string]string{"series": labels.String(), "values": b.String()}
	}
	const alert = "MultiPlatformControllerPlatformUnhealthy"
	firingLabels := fmt.Sprintf(`{alertname=%q, alertstate="firing", platform=%q}`, alert, platform)
	test := map[string]any{
		"rule_files":          []string{konfluxAlerts},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":     "1m",
			"input_series": []any{input(successLabels, successes), input(failureLabels, failures)},
			"promql_expr_test": []any{
				map[string]any{
					"expr":        fmt.Sprintf(`count by (alertname, alertstate, platform) (ALERTS{alertname=%q, alertstate="firing"})`, alert),
					"eval_time":   fmt.Sprintf("%dm", firing),
					"exp_samples": []any{map[string]any{"labels": firingLabels, "value": 1}},
				},
				map[string]any{
					"expr":        fmt.Sprintf(`absent(ALERTS{alertname=%q, alertstate="firing", platform=%q})`, alert, platform),
					"eval_time":   fmt.Sprintf("%dm", resolved),
					"exp_samples": []any{map[string]any{"labels": firingLabels, "value": 1}},
				},
			},
		}},
	}
	dir := t.TempDir()
	rules := konfluxRules(t, real, konfluxAlerts)
	testFile, err := yaml.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{konfluxAlerts: rules, "replay_test.yaml": testFile} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := realprometheus.TestRules(context.Background(), dir, "replay_test.yaml"); err != nil {
		t.Fatalf("%v\nthe replay:\n%s", err, testFile)
	} else {
		t.Logf("failures at scrapes %v, successes at %v of %d: firing at %dm, resolved at %dm\n%s", failed, succeeded, n, firing, resolved, out)
	}
}

// checkBuckets checks the histograms' buckets as Prometheus scraped them against upstream's,
// as ../shared/real/README.md lists them: the dashboard's quantiles are computed from them.
func checkBuckets(t *testing.T, prom *realprometheus.Server, real string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(real, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(readme)), " ")
	lists := map[string]*regexp.Regexp{
		"host_allocation_time": regexp.MustCompile("`host_allocation_time`, `wait_time` \\(buckets ([0-9, ]+) s\\)"),
		"wait_time":            regexp.MustCompile("`host_allocation_time`, `wait_time` \\(buckets ([0-9, ]+) s\\)"),
		"task_run_time":        regexp.MustCompile("`task_run_time` \\(([0-9, ]+) s\\)"),
	}
	for name, re := range lists {
		m := re.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("README.md lists no buckets of %s (%s)", name, re)
		}
		var want []string
		for _, b := range strings.Split(m[1], ",") {
			want = append(want, strings.TrimSpace(b))
		}
		want = append(want, "+Inf")
		v := queryAt(t, prom, fmt.Sprintf(`count by (le) (multi_platform_controller_%s_bucket)`, name), time.Now())
		var got []string
		for _, s := range v {
			got = append(got, string(s.Metric["le"]))
		}
		byValue := func(a, b string) int {
			x, _ := strconv.ParseFloat(a, 64)
			y, _ := strconv.ParseFloat(b, 64)
			return cmpFloat(x, y)
		}
		slices.SortFunc(got, byValue)
		slices.SortFunc(want, byValue)
		if !slices.EqualFunc(got, want, func(a, b string) bool { return byValue(a, b) == 0 }) {
			t.Errorf("multi_platform_controller_%s has buckets %v; upstream's are %v", name, got, want)
		}
	}
}

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// Konflux's alert rules pass their own unit tests (o11y/multi_platform_alerts_test.yaml) under
// the real promtool, the rules written as the Prometheus Operator writes a PrometheusRule for
// Prometheus, under the name the tests load them by. Konflux's test of its availability
// recording rules is commented out in its repository, so it has nothing to run.
func TestKonfluxAlertsPassTheirOwnTests(t *testing.T) {
	real := needPrometheus(t)
	dir := t.TempDir()
	rules := konfluxRules(t, real, konfluxAlerts)
	tests, err := os.ReadFile(filepath.Join(real, "o11y", "multi_platform_alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{konfluxAlerts: rules, "multi_platform_alerts_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := realprometheus.TestRules(context.Background(), dir, "multi_platform_alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool ran no test:\n%s", out)
	}
	t.Log(out)
}

// needPrometheus skips the test (skipOutsideCI) where make testbin has not built Prometheus
// and promtool, and returns the directory of ../shared/real.
func needPrometheus(t *testing.T) string {
	t.Helper()
	if _, _, err := realprometheus.Binaries(); err != nil {
		missing.Skip(t, err)
	}
	real, err := realdata.Dir()
	if err != nil {
		t.Fatal(err)
	}
	return real
}

// konfluxRules is the rule file Prometheus reads for the PrometheusRule o11y/<name> of
// Konflux's.
func konfluxRules(t *testing.T, real, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(real, "o11y", name))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := realprometheus.RuleFile(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return rules
}
